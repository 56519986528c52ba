"""The harness of the bad-input tests (tests/test_bad_input*.py): drive `swift-vora` in this process the way the
console script does, fail on a hang, and check what every run must leave behind (a contract exit code, no traceback,
strict JSON with `--json`, untouched inputs)."""
import contextlib
import hashlib
import io
import json
import signal
from pathlib import Path

from swift_vora.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY_VL = str(REPO / 'tests' / 'fixtures' / 'configs' / 'tiny_qwen3_vl.json')
CPU_TINY = str(REPO / 'recipes' / 'cpu-tiny.yaml')
CONTRACT_CODES = {0, 1, 2, 3, 4}
SECONDS_PER_RUN = 30  # a run that takes longer is taken to hang (the loops this issue found never ended)


class Hang(Exception):
    pass


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity, as JavaScript and most non-Python parsers do."""
    def refuse(name):
        raise ValueError(f'non-standard JSON constant {name}')
    return json.loads(text, parse_constant=refuse)


def run_cli(*argv):
    """(exit code, stdout, stderr) of `swift-vora ARGV`, in this process, failing on a hang."""
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise Hang(f'swift-vora {" ".join(map(str, argv))} ran for more than {SECONDS_PER_RUN} s')

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(SECONDS_PER_RUN)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return rc, out.getvalue(), err.getvalue()


def assert_clean(rc, out, err, argv):
    assert rc in CONTRACT_CODES, (argv, rc, err)
    assert 'Traceback' not in err and 'internal error' not in err, (argv, err)
    if '--json' in argv:
        strict_json(out)  # exactly one document, also on error paths
    if rc != 0:
        assert err.strip(), (argv, 'a failure must say why on stderr')


def digest(paths):
    return {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


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
