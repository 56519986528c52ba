"""`swift-vora demo` end to end on CPU: held-out clips with events, every answer parsed, scores next to the
shuffled-answer control, a report, and a verdict that claims only what was measured."""
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_demo_scores_held_out_clips_against_a_shuffled_control(tmp_path, offline_env):
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'demo', '--out', str(tmp_path / 'demo')], cwd=REPO,
                          env={**offline_env, 'PYTHONPATH': REPO}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    with open(tmp_path / 'demo' / 'videos_eval' / 'annotations.jsonl') as f:
        held_out = [json.loads(line) for line in f]
    assert held_out and all(row['windows'] for row in held_out)  # every held-out clip has something to find
    assert re.search(r'held-out clips +: 8, each 8 s with at least one event; 0 parse failures', out), out
    r1, control = map(float, re.search(r'R1@0.5 +: ([\d.]+) +\(shuffled-answer control ([\d.]+)\)', out).groups())
    assert (tmp_path / 'demo' / 'report' / 'overview.png').is_file()
    verdict = re.search(r'verdict +: (.*)', out).group(1)
    if r1 >= control + 0.25:
        assert verdict.startswith('the answers come from the frames')
    else:
        assert 'no evidence that the answers come from the frames' in verdict and 'learnability.py' in verdict
