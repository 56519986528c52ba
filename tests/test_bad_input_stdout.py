"""Writes to stdout are checked (issue #33, item 5): with stdout on a full disk (`> /dev/full`) every command exits
non-zero with one line on stderr that names stdout, never a traceback, never exit 0 with a truncated output, and
writes no file (its outputs are renamed into place only after stdout took the report)."""
import json
import os
import subprocess
import sys

import pytest
from cli_harness import CPU_TINY, REPO, TINY_VL

pytestmark = pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full (Linux) to fill stdout')

COMMANDS = [
    ['--version'],
    ['--help'],
    ['plan', '--help'],
    ['doctor', '--no-torch'],
    ['doctor', '--no-torch', '--json'],
    ['recipes'],
    ['recipes', 'show', 'h200x1'],
    ['recipes', 'cp', 'h200x1', 'copy.yaml'],
    ['switches', '--json'],
    ['data', 'check', 'a.jsonl', '--no-probe'],
    ['data', 'build', 'a.jsonl', 'out.jsonl', '--no-probe', '--json'],
    ['data', 'convert-qvhighlights', 'q.jsonl', 'out.jsonl'],
    ['eval', '--annotations', 'q.jsonl', '--predictions', 'qp.jsonl', '--output_dir', 'report'],
    ['eval', '--annotations', 'q.jsonl', '--predictions', 'qp.jsonl', '--json'],
    ['parse', '--text', '[[1, 2]]'],
    ['plan', '--model', TINY_VL, '--hardware', 'h200x1', '--json'],
    ['train', CPU_TINY, f'model.path={TINY_VL}', '--dry-run'],
    ['verify-adapter', 'absent', '--json'],  # an error whose JSON object cannot be printed either
]


@pytest.mark.parametrize('argv', COMMANDS, ids=lambda argv: ' '.join(argv[:3]))
def test_a_full_stdout_is_one_line_and_a_failure(tmp_path, argv):
    (tmp_path / 'v.mp4').write_bytes(b'x')
    (tmp_path / 'a.jsonl').write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'duration': 30,
                                                  'windows': [[1, 9]]}) + '\n')
    (tmp_path / 'q.jsonl').write_text(json.dumps({'qid': 1, 'vid': 'x', 'duration': 150,
                                                  'relevant_windows': [[0, 10]]}) + '\n')
    (tmp_path / 'qp.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 1]]}) + '\n')
    before = sorted(os.listdir(tmp_path))
    with open('/dev/full', 'w') as full:
        proc = subprocess.run([sys.executable, '-m', 'swift_vora', *argv], cwd=tmp_path, stdout=full,
                              stderr=subprocess.PIPE, env={**os.environ, 'PYTHONPATH': str(REPO)}, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode != 0, err
    assert 'Traceback' not in err and 'Exception ignored' not in err, err
    said = [line for line in err.splitlines() if ': stdout: ' in line]
    assert len(said) == 1 and said[0].endswith('stdout: No space left on device; the output printed there is '
                                                'incomplete'), err
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary file
