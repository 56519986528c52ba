"""The `--json` outputs of `swift-vora plan` and `swift-vora train --dry-run`, captured for a fixed set of cases.

    python tests/golden/capture.py            # compare with tests/golden/outputs/ (exit 1 on a difference)
    python tests/golden/capture.py --write    # store the outputs of the code as it is now

The cases: `train RECIPE --dry-run --json` for every shipped recipe (recipes/*.yaml), `plan --json` for every row of
the planner's calibration table (benchmarks/calibration_table.py), and a few plans and trains that end in "does not
fit" or "refused" (their alternatives carry commands too). Each runs in a fresh interpreter, from the repository
root, with the tree under test first on PYTHONPATH, no SWIFT_VORA_* variable set and empty model caches (so a model
id resolves to the configuration shipped with swift-vora, on any machine).

What differs between machines is written as a placeholder: the repository root `<repo>`, this interpreter
`<python>`, the folder of its console scripts (removed: `<bin>/swift` is written `swift`, as on a machine where the
script is found on PATH) and the temporary folder of the run `<tmp>`. tests/test_golden_outputs.py runs the
comparison; a change of output that is meant is stored again with `--write` in the commit that makes it, and its
message says why.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUTPUTS = os.path.join(HERE, 'outputs')
CALIBRATION = os.path.join(REPO, 'benchmarks', 'calibration_table.py')
# Fields that say where a value came from rather than what it is; left out of the comparison (a redesign may word
# or locate them differently without changing a decision).
PROVENANCE_KEYS = ('config_source', )

# Plans and trains beyond the recipes and the calibration rows: the verdicts other than "fits", whose alternatives
# carry commands of their own, each backend, and the example of a cap (--window 8 with a 64-frame cap).
EXTRA_CASES: List[Tuple[str, List[str]]] = [
    ('plan-2b-h200x1-window8', ['plan', '--model', 'Qwen/Qwen3-VL-2B-Instruct', '--hardware', 'h200x1', '--window',
                                '8', '--json']),
    ('plan-2b-3060x4', ['plan', '--model', 'Qwen/Qwen3-VL-2B-Instruct', '--hardware', '3060x4', '--fps', '2',
                        '--max-frames', '64', '--json']),
    ('plan-14b-4090x2', ['plan', '--model', 'Qwen/Qwen2.5-14B-Instruct', '--hardware', '4090x2', '--json']),
    ('plan-moe-h200x1-full', ['plan', '--model', 'Qwen/Qwen3.6-35B-A3B', '--hardware', 'h200x1', '--tuner', 'full',
                              '--json']),
    ('plan-moe-h200x1', ['plan', '--model', 'Qwen/Qwen3.6-35B-A3B', '--hardware', 'h200x1', '--json']),
    ('plan-moe-h200x8', ['plan', '--model', 'Qwen/Qwen3-VL-30B-A3B-Instruct', '--hardware', 'h200x8', '--json']),
    ('plan-moe-zero3-refused', ['plan', '--model', 'Qwen/Qwen3-30B-A3B', '--hardware', 'h200x8', '--backend',
                                'deepspeed_zero3', '--json']),
    ('plan-8b-3060x4-full', ['plan', '--model', 'Qwen/Qwen3-VL-8B-Instruct', '--hardware', '3060x4', '--tuner',
                             'full', '--json']),
    ('plan-8b-3090x3-packed', ['plan', '--model', 'Qwen/Qwen3-VL-8B-Instruct', '--hardware', '3090x3',
                               '--pack-length', '16384', '--micro-batch', '2', '--json']),
    ('plan-2b-h200x1-ddp-compile', ['plan', '--model', 'Qwen/Qwen3-VL-2B-Instruct', '--hardware', 'h200x1',
                                    '--backend', 'ddp', '--compile', 'layers', '--json']),
    ('plan-mixtral-4090x1-qlora', ['plan', '--model', 'mistralai/Mixtral-8x7B-Instruct-v0.1', '--hardware', '4090x1',
                                   '--quant', '4bit', '--json']),
    ('plan-14b-4090x2-attention', ['plan', '--model', 'Qwen/Qwen2.5-14B-Instruct', '--hardware', '4090x2',
                                   '--lora-targets', 'attention', '--json']),
    ('train-h200x1-full', ['train', 'recipes/h200x1.yaml', 'train.tuner=full', '--dry-run', '--json']),
    ('train-h200x1-full-auto', ['train', 'recipes/h200x1.yaml', 'train.tuner=full', 'train.backend=auto',
                                '--dry-run', '--json']),
    ('train-3060x4-zero3-moe', ['train', 'recipes/3060x4.yaml', 'model.path=Qwen/Qwen3-30B-A3B',
                                'train.backend=deepspeed_zero3', '--dry-run', '--json']),
    ('train-3060x4-packed', ['train', 'recipes/3060x4.yaml', 'train.packing=dataset', 'data.max_length=8192',
                             '--dry-run', '--json']),
    ('train-h200x8-ep2', ['train', 'recipes/h200x8.yaml', 'megatron.ep=2', '--dry-run', '--json']),
    ('train-h200x1-checkpoint-layers-auto', ['train', 'recipes/h200x1.yaml', 'train.checkpoint_layers=auto',
                                             '--dry-run', '--json']),
]


def _calibration_rows():
    import importlib.util
    spec = importlib.util.spec_from_file_location('calibration_table', CALIBRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(tmp: str) -> List[Tuple[str, List[str]]]:
    """(name, argv after `swift-vora`) of every case; `tmp` holds the calibration's MoE config."""
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, 'recipes', '*.yaml'))):
        name = os.path.splitext(os.path.basename(path))[0]
        argv = ['train', f'recipes/{name}.yaml', '--dry-run', '--json']
        if name == 'cpu-tiny':  # its model is built by the demo; plan it from the shipped config of the same shape
            argv.insert(2, 'model.path=Qwen/Qwen3-VL-2B-Instruct')
        out.append((f'train-{name}', argv))
    calibration = _calibration_rows()
    moe = os.path.join(tmp, f'{calibration.MOE}.json')
    with open(os.path.join(calibration.CONFIGS, 'qwen3_5_moe_35b_a3b.json')) as f:
        cfg = json.load(f)
    cfg['vision_config']['out_hidden_size'] = 2048  # as calibration_table._moe_config writes it
    with open(moe, 'w') as f:
        json.dump(cfg, f)
    for row in sorted(calibration.ROWS, key=lambda r: r['id']):
        model = moe if row.get('model') == calibration.MOE else calibration.model_path(row)
        out.append((f'plan-calibration-{row["id"]:02d}', ['plan', '--model', model, *row['plan'],
                                                          *calibration.AS_RUN, '--json']))
    # `train --dry-run` compares the recipe's hardware with this machine, as the launch does: the cases trust the
    # recipe, so that what is stored does not depend on the machine that captured it (docs/errors.md, Pre-flight)
    return [(name, [*argv, '--trust-recipe-hardware'] if argv[0] == 'train' else argv)
            for name, argv in out + EXTRA_CASES]


def _environment(tmp: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('SWIFT_VORA_', 'HF_', 'MODELSCOPE_', 'FORCE_QWENVL_', 'PYTORCH_CUDA_ALLOC_CONF'))
           and k not in ('XDG_CACHE_HOME', 'UNSLOTH_BLOCK_COMPILE', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT')}
    empty = os.path.join(tmp, 'empty-cache')
    os.makedirs(empty, exist_ok=True)
    env.update(HF_HUB_CACHE=empty, MODELSCOPE_CACHE=empty, PYTHONHASHSEED='0',
               PYTHONPATH=os.pathsep.join([REPO, *[p for p in [env.get('PYTHONPATH')] if p]]))
    return env


def normalise(text: str, tmp: str) -> str:
    """Machine-specific paths as placeholders (longest first, so that a path inside another is caught whole)."""
    bindir = os.path.dirname(sys.executable)
    for old, new in sorted([(REPO, '<repo>'), (sys.executable, '<python>'), (bindir + os.sep, ''),
                            (os.path.realpath(tmp), '<tmp>'), (tmp, '<tmp>')], key=lambda p: -len(p[0])):
        text = text.replace(old, new)
    return text


def run_case(argv: List[str], env: Dict[str, str], tmp: str) -> Tuple[int, str]:
    done = subprocess.run([sys.executable, '-m', 'swift_vora', *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    return done.returncode, normalise(done.stdout, tmp)


def capture(tmp: str) -> Dict[str, Dict[str, object]]:
    """name -> {'argv', 'exit_code', 'stdout'} for every case, normalised."""
    env = _environment(tmp)
    out = {}
    for name, argv in cases(tmp):
        code, stdout = run_case(argv, env, tmp)
        out[name] = {'argv': [normalise(a, tmp) for a in argv], 'exit_code': code, 'stdout': stdout}
    return out


def comparable(stdout: str) -> str:
    """The output without its provenance fields, as the comparison sees it."""
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        return stdout

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in PROVENANCE_KEYS}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    return json.dumps(strip(doc), indent=2, ensure_ascii=False) + '\n'


def stored() -> Dict[str, Dict[str, object]]:
    out = {}
    with open(os.path.join(OUTPUTS, 'index.json')) as f:
        index = json.load(f)
    for name, entry in index.items():
        with open(os.path.join(OUTPUTS, f'{name}.json')) as f:
            out[name] = {**entry, 'stdout': f.read()}
    return out


def write(results: Dict[str, Dict[str, object]]) -> None:
    os.makedirs(OUTPUTS, exist_ok=True)
    for old in glob.glob(os.path.join(OUTPUTS, '*.json')):
        os.remove(old)
    index = {name: {'argv': r['argv'], 'exit_code': r['exit_code']} for name, r in results.items()}
    with open(os.path.join(OUTPUTS, 'index.json'), 'w') as f:
        json.dump(index, f, indent=1)
        f.write('\n')
    for name, r in results.items():
        with open(os.path.join(OUTPUTS, f'{name}.json'), 'w') as f:
            f.write(r['stdout'])


def differences(now: Dict[str, Dict[str, object]], then: Dict[str, Dict[str, object]]) -> List[str]:
    """One entry per case that differs: its name and a unified diff of what changed."""
    problems = []
    for name in sorted(set(now) | set(then)):
        if name not in then or name not in now:
            problems.append(f'{name}: {"new case" if name not in then else "case gone"}')
            continue
        a, b = then[name], now[name]
        if (a['argv'], a['exit_code']) != (b['argv'], b['exit_code']):
            problems.append(f'{name}: argv/exit code {a["argv"]} {a["exit_code"]} -> {b["argv"]} {b["exit_code"]}')
        old, new = comparable(a['stdout']), comparable(b['stdout'])
        if old != new:
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), 'stored', 'now', n=2, lineterm='')
            problems.append(f'{name}:\n' + '\n'.join(list(diff)[:60]))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--write', action='store_true', help='store the current outputs as the golden ones')
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix='swift-vora-golden-') as tmp:
        results = capture(tmp)
    if args.write:
        write(results)
        print(f'{len(results)} outputs written to {os.path.relpath(OUTPUTS, REPO)}')
        return 0
    problems = differences(results, stored())
    for p in problems:
        print(p)
    print(f'{len(results)} cases, {len(problems)} differ')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
