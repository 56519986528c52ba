"""`swift-vora demo` end to end on CPU: held-out clips with events, predicted as new videos, every answer parsed,
scores next to the shuffled-answer control, a report, a verdict that claims only what was measured, and the cut
(.otio, EDL, rendered highlights)."""
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
    # predicted as new videos, then cut: the timelines and the render hold the kept windows
    lines = [json.loads(line) for line in open(tmp_path / 'demo' / 'predictions.jsonl')]
    assert sorted(line['id'] for line in lines) == sorted(row['id'] for row in held_out)
    assert all(len(line['clips']) == 1 and line['duration'] == 8.0 for line in lines)  # one 8 s window each
    if 'nothing to cut' in out:
        assert not any(line['windows'] for line in lines)
    else:
        import av
        import opentimelineio as otio
        timeline = otio.adapters.read_from_file(str(tmp_path / 'demo' / 'cut' / 'highlights.otio'))
        frames = sum(clip.source_range.duration.value for clip in timeline.find_clips())
        assert frames == int(re.search(r'rendered \S+highlights.mp4: (\d+) frames', out).group(1))
        assert (tmp_path / 'demo' / 'cut' / 'highlights.edl').read_text().startswith('TITLE: highlights')
        with av.open(str(tmp_path / 'demo' / 'highlights.mp4')) as container:
            stream = container.streams.video[0]
            assert sum(1 for _ in container.decode(stream)) == frames
            assert float(stream.duration * stream.time_base) == pytest.approx(frames / 25)
    verdict = re.search(r'verdict +: (.*)', out).group(1)
    if r1 >= control + 0.25:
        assert verdict.startswith('the answers come from the frames')
    else:
        assert 'no evidence that the answers come from the frames' in verdict and 'learnability.py' in verdict
