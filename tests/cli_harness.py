"""The harness of the bad-input tests (tests/test_bad_input*.py): drive `swift-vora` in this process the way the
console script does, fail on a hang, and check what every run must leave behind (a contract exit code, no traceback,
strict JSON with `--json`, untouched inputs)."""
import contextlib
import hashlib
import io
import json
import os
import signal
from pathlib import Path

from swift_vora.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY_VL = str(REPO / 'tests' / 'fixtures' / 'configs' / 'tiny_qwen3_vl.json')
CPU_TINY = str(REPO / 'recipes' / 'cpu-tiny.yaml')
CONTRACT_CODES = {0, 1, 2, 3, 4}
# Each class of bad input: the test module that generates it through the real CLI, and docs/errors.md's promise.
CLASSES = {
    'no data lost, no hang, no traceback': 'tests/test_bad_input.py',
    'a score never leaves its range': 'tests/test_bad_input_scores.py',
    'a failed command leaves earlier outputs as they were': 'tests/test_bad_input_outputs.py',
    'writes to stdout are checked': 'tests/test_bad_input_stdout.py',
    'every value is validated where it enters, in bounded memory': 'tests/test_bad_input_values.py',
    'eval equals the official evaluator on every input it scores': 'tests/test_eval_zero_length.py',
    'every value is checked where it is read first; a key written twice is an error':
        'tests/test_bad_input_checked_first.py',
    'bounded and handled: config counts, a closed or full stdout, unreadable probes, the smaller slips':
        'tests/test_bad_input_bounded.py',
}
SECONDS_PER_RUN = 30  # a run that takes longer is taken to hang (the loops this issue found never ended)


class Hang(Exception):
    pass


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity, as JavaScript and most non-Python parsers do."""
    def refuse(name):
        raise ValueError(f'non-standard JSON constant {name}')
    return json.loads(text, parse_constant=refuse)


@contextlib.contextmanager
def _time_limit(argv):
    def alarm(signum, frame):
        raise Hang(f'swift-vora {" ".join(map(str, argv))} ran for more than {SECONDS_PER_RUN} s')

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(SECONDS_PER_RUN)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(*argv):
    """(exit code, stdout, stderr) of `swift-vora ARGV`, in this process, failing on a hang."""
    out, err = io.StringIO(), io.StringIO()
    with _time_limit(argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def run_cli_closed_stdout(*argv):
    """(exit code, stderr) of `swift-vora ARGV` started with stdout closed (`>&-`), in this process: the interpreter
    then holds `sys.stdout = None`, and so does this run (tests/test_bad_input_bounded.py starts one real process with
    its descriptor 1 closed too)."""
    err = io.StringIO()
    with _time_limit(argv), contextlib.redirect_stdout(None), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def run_process(*argv, cwd, stdout=None, file_size_limit=None, close_stdout=False, env=None, timeout=300):
    """`python -m swift_vora ARGV` as a separate process (what an in-process run cannot do: a closed descriptor 1, a
    file-size limit on the real stdout) -> CompletedProcess with text stderr."""
    import resource
    import subprocess
    import sys

    def setup():
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
        if close_stdout:
            os.close(1)

    return subprocess.run([sys.executable, '-m', 'swift_vora', *map(str, argv)], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, preexec_fn=setup, timeout=timeout,
                          env={**os.environ, 'PYTHONPATH': str(REPO), **(env or {})})


def assert_clean(rc, out, err, argv):
    assert rc in CONTRACT_CODES, (argv, rc, err)
    assert 'Traceback' not in err and 'internal error' not in err, (argv, err)
    if '--json' in argv:
        strict_json(out)  # exactly one document, also on error paths
    if rc != 0:
        assert err.strip(), (argv, 'a failure must say why on stderr')


def digest(paths):
    return {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def launch_folder(root: Path) -> Path:
    """A folder holding what the shipped recipes name as their data (`data/train.jsonl`, cpu-tiny's
    `output/tiny-data/annotations.jsonl`: one valid annotation line each, with its video file, not decoded by the
    pre-launch check), for `train` to run in: a dry run there stops at nothing but what a test sets up."""
    from swift_vora.backends.recipe import load_recipe
    for recipe in sorted((REPO / 'recipes').glob('*.yaml')):
        datasets = load_recipe(str(recipe))['data.dataset']
        for dataset in [datasets] if isinstance(datasets, str) else datasets:
            if os.path.isabs(dataset):
                continue
            path = root / dataset
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / 'v.mp4').write_bytes(b'not decoded by the pre-launch check')
            path.write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'duration': 30, 'windows': [[1, 9]]}) + '\n')
    return root


def write_inputs(root: Path) -> Path:
    """One valid file of each input kind (rewritten before every generated example: no state leaks)."""
    for leftover in ('o.jsonl', 'bad.jsonl'):
        if (root / leftover).is_file():
            (root / leftover).unlink()
    (root / 'v.mp4').write_bytes(b'not decoded with --no-probe')
    (root / 'a.jsonl').write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'duration': 30, 'windows': [[1, 9]]})
                                  + '\n')
    (root / 'p.jsonl').write_text(json.dumps({'id': 'a', 'response': '[[1.0, 9.0]]'}) + '\n')
    (root / 'q.jsonl').write_text(json.dumps({'qid': 1, 'vid': 'x', 'duration': 150, 'relevant_windows': [[0, 10]],
                                              'relevant_clip_ids': [0, 1],
                                              'saliency_scores': [[1, 2, 3], [0, 1, 2]]}) + '\n')
    return root
