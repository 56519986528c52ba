"""A line at least every 10 s while a user waits (the demo's training step was silent for minutes)."""
import io
import json
import subprocess
import sys

from swift_vora import progress


def test_heartbeat_lines_while_the_child_runs_and_its_exit_code():
    out = io.StringIO()
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.2); raise SystemExit(3)'])
    seen = []

    def status():
        seen.append(1)
        return f'step {len(seen)}'
    code = progress.wait_with_heartbeat(proc, 'training', status, interval=0.3, stream=out, poll=0.05)
    lines = out.getvalue().splitlines()
    assert code == 3 and len(lines) >= 2
    assert lines[0].startswith('training: 0 s elapsed, step 1') and lines[1].endswith('step 2')


def test_training_status_reads_swifts_log(tmp_path):
    status = progress.swift_training_status(str(tmp_path))
    assert status() == 'loading the model and the clips'
    log = tmp_path / 'v0-x' / 'logging.jsonl'
    log.parent.mkdir()
    log.write_text(json.dumps({'loss': 2.5, 'global_step/max_steps': '3/8'}) + '\n')
    assert status() == 'step 3/8, loss 2.500'


def test_eval_progress_prints_while_the_model_loads(tmp_path):
    from swift_vora.eval import inference
    out = io.StringIO()
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.0)'])
    old = inference.HEARTBEAT_SECONDS
    inference.HEARTBEAT_SECONDS = 0.3
    try:
        inference.wait_with_progress(proc, str(tmp_path / 'log'), str(tmp_path / 'res'), 4, stream=out,
                                     interval=0.05)
    finally:
        inference.HEARTBEAT_SECONDS = old
    lines = [line for line in out.getvalue().splitlines() if 'loading the model' in line]
    assert len(lines) >= 3  # no result yet: the count does not move, the lines keep coming
