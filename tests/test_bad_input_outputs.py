"""A failed command leaves every earlier output exactly as it was, and no temporary file (issue #33, item 5).

Every file a command writes goes through one mechanism, swift_vora.outputs.staged(): a temporary file next to the
target, renamed over it only when the command succeeds (after its report reached stdout); SIGTERM removes the
temporary files. The cases the issue found: an all-invalid `data build` over an existing OUT left it empty;
`recipes cp` onto a full disk left a truncated recipe that a rerun refused to replace; `eval --out-dir` wrote
metrics.json before refusing; SIGTERM during `data build` left a ~190 MB hidden temporary file.
"""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cli_harness import REPO, digest, run_cli

from swift_vora import outputs
from swift_vora.outputs import staged


def _temporaries(root):
    return sorted(str(p) for p in root.rglob('*') if p.name.endswith('.tmp'))


def _tree(root):
    """Every file under `root` with its content hash: what "exactly as it was" compares."""
    return digest(sorted(p for p in root.rglob('*') if p.is_file()))


class FullDisk:
    """`open` for outputs.py whose files take `budget` bytes in all, then raise ENOSPC, as a full disk does."""

    def __init__(self, budget: int):
        self.budget = budget

    def __call__(self, path, mode='r', **kwargs):
        handle = open(path, mode, **kwargs)
        if 'w' not in mode:
            return handle
        disk = self

        class Handle:
            def write(self, text):
                if len(text) > disk.budget:
                    handle.write(text[:disk.budget])
                    disk.budget = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.budget -= len(text)
                return handle.write(text)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def __getattr__(self, name):
                return getattr(handle, name)
        return Handle()


@pytest.fixture
def full_disk(monkeypatch):
    def fill(budget: int = 100):
        monkeypatch.setattr(outputs, 'open', FullDisk(budget), raising=False)
    return fill


# ---- a failed command keeps the earlier output --------------------------------------------------------------------
@pytest.mark.parametrize('command', ['build', 'convert'])
def test_an_all_invalid_input_leaves_the_earlier_out_as_it_was(workspace, command):
    (workspace / 'out.jsonl').write_text('{"an": "earlier output"}\n')
    (workspace / 'bad.jsonl').write_text(json.dumps({'id': 'a', 'video': 'v.mp4', 'duration': 30,
                                                     'windows': [[10, 5]]}) + '\n')
    before = _tree(workspace)
    argv = (['data', 'build', 'bad.jsonl', 'out.jsonl', '--no-probe', '--json'] if command == 'build'
            else ['data', 'convert-qvhighlights', 'bad.jsonl', 'out.jsonl', '--json'])
    rc, out, err = run_cli(*argv)
    assert rc == 1 and 'nothing written (out.jsonl left as it was)' in err
    assert json.loads(out)['written'] is False
    assert _tree(workspace) == before and not _temporaries(workspace)


def test_data_build_on_a_full_disk_names_the_file_and_keeps_the_old_one(workspace, full_disk):
    (workspace / 'out.jsonl').write_text('{"an": "earlier output"}\n')
    before = _tree(workspace)
    full_disk(100)
    rc, out, err = run_cli('data', 'build', 'a.jsonl', 'out.jsonl', '--no-probe')
    assert rc == 2 and err.startswith('swift-vora data build: out.jsonl: No space left on device'), err
    assert '[Errno' not in err and out == ''
    assert _tree(workspace) == before and not _temporaries(workspace)


def test_recipes_cp_on_a_full_disk_leaves_nothing_and_a_rerun_works(workspace, full_disk):
    full_disk(200)
    rc, _, err = run_cli('recipes', 'cp', 'h200x1', 'mine.yaml')
    assert rc == 2 and 'mine.yaml: No space left on device; recipe copy not written' in err
    assert not (workspace / 'mine.yaml').exists() and not _temporaries(workspace)
    full_disk(10 ** 9)  # space again: the rerun is not refused by a truncated leftover
    rc, out, _ = run_cli('recipes', 'cp', 'h200x1', 'mine.yaml')
    assert rc == 0 and (workspace / 'mine.yaml').read_text() == (REPO / 'recipes' / 'h200x1.yaml').read_text()


def _eval_out_dir(workspace, predictions='good.jsonl', *extra):
    (workspace / 'good.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[0, 10, 1]],
                                                      'pred_saliency_scores': [1, 2]}) + '\n')
    return run_cli('eval', '--annotations', 'q.jsonl', '--predictions', predictions, '--output_dir', 'report', *extra)


def test_eval_writes_its_out_dir_only_when_it_succeeds(workspace):
    rc, _, _ = _eval_out_dir(workspace)
    assert rc == 0 and (workspace / 'report' / 'metrics.json').is_file()
    before = _tree(workspace / 'report')
    (workspace / 'rev.jsonl').write_text(json.dumps({'qid': 1, 'pred_relevant_windows': [[10, 0, 1]]}) + '\n')
    rc, _, err = _eval_out_dir(workspace, 'rev.jsonl')  # exit 1: an invalid line
    assert rc == 1 and '--output_dir report not written' in err
    (workspace / 'other.jsonl').write_text(json.dumps({'qid': 'nope', 'pred_relevant_windows': [[0, 1]]}) + '\n')
    rc, _, _ = _eval_out_dir(workspace, 'other.jsonl', '--strict')  # exit 1: --strict refuses an unknown id
    assert rc == 1
    assert _tree(workspace / 'report') == before and not _temporaries(workspace)
    # a new folder is not even created
    rc, _, _ = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'rev.jsonl', '--output_dir', 'new/deep')
    assert rc == 1 and not (workspace / 'new').exists()


def test_eval_out_dir_on_a_full_disk_keeps_every_earlier_file(workspace, full_disk):
    rc, _, _ = _eval_out_dir(workspace)
    assert rc == 0
    metrics_size = (workspace / 'report' / 'metrics.json').stat().st_size
    (workspace / 'report' / 'metrics.json').write_text('{"earlier": true}\n')
    before = _tree(workspace / 'report')
    full_disk(metrics_size + 100)  # metrics.json fits, report.md does not: the staged metrics.json must not land
    rc, _, err = _eval_out_dir(workspace)
    assert rc == 2 and 'report.md: No space left on device' in err, err
    assert _tree(workspace / 'report') == before and not _temporaries(workspace)


def test_a_staging_removes_the_folders_it_made(tmp_path):
    target = tmp_path / 'a' / 'b' / 'out.txt'
    with pytest.raises(RuntimeError):
        with staged() as stage:
            stage.write_text(str(target), 'x')
            raise RuntimeError('later failure')
    assert list(tmp_path.iterdir()) == [] and outputs.live_temporaries() == []
    with staged() as stage:
        stage.write_text(str(target), 'x')
    assert target.read_text() == 'x' and oct(target.stat().st_mode & 0o777) != oct(0o600)


# ---- SIGTERM ------------------------------------------------------------------------------------------------------
def test_sigterm_during_data_build_removes_the_temporary_file(tmp_path):
    (tmp_path / 'v.mp4').write_bytes(b'x')
    with open(tmp_path / 'many.jsonl', 'w') as f:
        for i in range(3000):
            f.write(json.dumps({'id': str(i), 'video': 'v.mp4', 'duration': 3000, 'windows': [[1, 2000]]}) + '\n')
    (tmp_path / 'out.jsonl').write_text('earlier\n')
    proc = subprocess.Popen([sys.executable, '-m', 'swift_vora', 'data', 'build', 'many.jsonl', 'out.jsonl',
                             '--no-probe', '--window', '1'], cwd=tmp_path, env={**os.environ, 'PYTHONPATH': str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not _temporaries(tmp_path) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert _temporaries(tmp_path), 'the build finished before it could be stopped; make the input larger'
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert 'stopped by SIGTERM' in err and 'Traceback' not in err
    assert not _temporaries(tmp_path) and (tmp_path / 'out.jsonl').read_text() == 'earlier\n'
