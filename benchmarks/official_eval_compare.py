"""Compare `swift-vora eval` with the official QVHighlights evaluator, and pin the official figures.

The official evaluator is `standalone_eval/eval.py` of https://github.com/jayleicn/moment_detr. It is
not part of this repository (never commit it); get a local copy under the git-ignored `.fetched/`:

    git clone --depth 1 https://github.com/jayleicn/moment_detr .fetched/moment_detr
    # or, from an existing mirror / clone:
    #   mkdir -p .fetched/moment_detr
    #   git --git-dir=MIRROR archive HEAD standalone_eval | tar -x -C .fetched/moment_detr
    #   git --git-dir=MIRROR rev-parse HEAD > .fetched/moment_detr/COMMIT
    pip install numpy scikit-learn      # what the official code needs; not swift-vora dependencies

Then, from the repository root:

    .venv/bin/python benchmarks/official_eval_compare.py                # compare, exit 1 on a difference > 0.01
    .venv/bin/python benchmarks/official_eval_compare.py --write        # also rewrite the pinned figures

For each synthetic prediction set of `swift_vora.eval.baselines` (oracle, oracle shifted by 2 s, the
whole video as one window, seeded random windows; each with saliency scores) it writes the submission
to a temporary JSONL, runs the official `standalone_eval/eval.py` on it in a subprocess, runs
`swift_vora.eval.evaluate.evaluate` on the same file, and prints both. When the official checkout holds
`standalone_eval/sample_val_preds.jsonl` (real Moment-DETR predictions) it is compared too.
`--write` stores the official figures of the synthetic sets in `tests/fixtures/eval/expected_official.json`,
which `tests/test_eval_official.py` checks our implementation against (no official code needed there).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from swift_vora.eval import baselines  # noqa: E402
from swift_vora.eval.evaluate import evaluate  # noqa: E402

DEFAULT_OFFICIAL = os.path.join(ROOT, '.fetched', 'moment_detr')
DEFAULT_ANNOTATIONS = os.path.join(ROOT, 'tests', 'fixtures', 'qvhighlights', 'val.jsonl')
EXPECTED = os.path.join(ROOT, 'tests', 'fixtures', 'eval', 'expected_official.json')
TOLERANCE = 0.01
BUCKETS = ('full', 'short', 'middle', 'long')


def run_official(official_dir: str, submission: str, gt: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        save = os.path.join(tmp, 'metrics.json')
        env = dict(os.environ, PYTHONPATH=official_dir + os.pathsep + os.environ.get('PYTHONPATH', ''))
        cmd = [sys.executable, os.path.join('standalone_eval', 'eval.py'), '--submission_path', submission,
               '--gt_path', gt, '--save_path', save, '--not_verbose']
        proc = subprocess.run(cmd, cwd=official_dir, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f'official evaluator failed:\n{proc.stdout}\n{proc.stderr}')
        with open(save) as f:
            return json.load(f)


def flatten(official: dict) -> dict:
    """Brief keys plus every per-bucket mAP/R1 figure, as 'full/MR-mAP/0.5' etc."""
    out = dict(official['brief'])
    for b in BUCKETS:
        if b in official:
            for kind in ('MR-mAP', 'MR-R1'):
                for t, v in official[b][kind].items():
                    out[f'{b}/{kind}/{t}'] = v
    return out


def ours_flat(metrics: dict, keys) -> dict:
    out = {}
    for k in keys:
        if '/' in k:
            b, kind, t = k.split('/')
            out[k] = metrics['detail'][b][kind][t]
        else:
            out[k] = metrics[k]
    return out


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        h.update(f.read())
    return h.hexdigest()


def official_commit(official_dir: str) -> str:
    p = os.path.join(official_dir, 'COMMIT')
    if os.path.exists(p):
        return open(p).read().strip()
    try:
        return subprocess.run(['git', '-C', official_dir, 'rev-parse', 'HEAD'], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--official', default=os.environ.get('MOMENT_DETR_DIR', DEFAULT_OFFICIAL),
                    help='directory holding standalone_eval/ (default .fetched/moment_detr or $MOMENT_DETR_DIR)')
    ap.add_argument('--annotations', default=DEFAULT_ANNOTATIONS)
    ap.add_argument('--write', action='store_true',
                    help=f'write the official figures to {os.path.relpath(EXPECTED, ROOT)}')
    args = ap.parse_args(argv)

    if not os.path.exists(os.path.join(args.official, 'standalone_eval', 'eval.py')):
        print(f'official evaluator not found under {args.official}; see the header of this script for how to '
              'fetch it', file=sys.stderr)
        return 2
    with open(args.annotations) as f:
        gt_rows = [json.loads(line) for line in f if line.strip()]

    sets = {name: fn(gt_rows) for name, fn in baselines.SETS.items()}
    results, worst = {}, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, rows in sets.items():
            paths[name] = os.path.join(tmp, f'{name}.jsonl')
            with open(paths[name], 'w') as f:
                f.writelines(json.dumps(r) + '\n' for r in rows)
        sample = os.path.join(args.official, 'standalone_eval', 'sample_val_preds.jsonl')
        if os.path.exists(sample):
            paths['moment_detr_sample'] = sample
        for name, path in paths.items():
            official = run_official(args.official, path, os.path.abspath(args.annotations))
            off = flatten(official)
            ours = ours_flat(evaluate(args.annotations, path)[0].metrics, off)
            results[name] = (official, off, ours)
            worst = max([worst] + [abs(off[k] - ours[k]) for k in off])

    brief_keys = list(next(iter(results.values()))[0]['brief'])
    names = list(results)
    print('| metric | ' + ' | '.join(f'{n} official | {n} ours' for n in names) + ' |')
    print('| --- |' + ' --- | --- |' * len(names))
    for k in brief_keys:
        print(f'| {k} | ' + ' | '.join(f'{results[n][1][k]:.2f} | {results[n][2][k]:.2f}' for n in names) + ' |')
    n_checked = sum(len(r[1]) for r in results.values())
    print(f'\n{n_checked} figures compared (brief keys + per-bucket mAP at every IoU threshold + R1); '
          f'largest |official - ours| = {worst:.4f}')

    if args.write:
        import numpy
        import sklearn
        rel = os.path.relpath(args.annotations, ROOT)
        doc = {
            '_about': 'Figures of the official QVHighlights evaluator on synthetic predictions; '
                      'tests/test_eval_official.py checks swift_vora.eval against them to 0.01.',
            'evaluator': {'repo': 'https://github.com/jayleicn/moment_detr', 'file': 'standalone_eval/eval.py',
                          'commit': official_commit(args.official)},
            'command': '.venv/bin/python benchmarks/official_eval_compare.py --write',
            'official_invocation': 'PYTHONPATH=<official> python standalone_eval/eval.py --submission_path <set>.jsonl '
                                   f'--gt_path {rel} --save_path <out>.json --not_verbose',
            'predictions': 'swift_vora.eval.baselines.SETS applied to the annotations',
            'annotations': {'path': rel, 'sha256': sha256(args.annotations), 'queries': len(gt_rows)},
            'environment': {'python': platform.python_version(), 'numpy': numpy.__version__,
                            'scikit-learn': sklearn.__version__},
            'generated': datetime.date.today().isoformat(),
            'sets': {name: results[name][0] for name in baselines.SETS},
        }
        if 'moment_detr_sample' in results:
            doc['moment_detr_sample_brief'] = results['moment_detr_sample'][0]['brief']
        os.makedirs(os.path.dirname(EXPECTED), exist_ok=True)
        with open(EXPECTED, 'w') as f:
            json.dump(doc, f, indent=1)
            f.write('\n')
        print(f'wrote {os.path.relpath(EXPECTED, ROOT)}')
    return 0 if worst <= TOLERANCE + 1e-9 else 1


if __name__ == '__main__':
    sys.exit(main())
