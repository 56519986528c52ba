"""`swift-vora eval --model/--adapters` shows clips done / total and the time left while `swift infer` runs."""
import io
import subprocess
import sys

from swift_vora.eval.inference import count_windows, wait_with_progress

# Stands in for `swift infer`: logs its dataset as ms-swift does, then appends one result row per clip.
FAKE_INFER = r'''
import sys, time
print("val_dataset: Dataset({\n    features: ['messages'],\n    num_rows: 4\n})", flush=True)
time.sleep(0.3)
for _ in range(4):
    with open(sys.argv[1], "a") as f:
        f.write('{"response": "[]"}\n')
    time.sleep(0.3)
sys.exit(int(sys.argv[2]))
'''


def run_fake(tmp_path, exit_code=0, total=None):
    result, log = tmp_path / 'result.jsonl', tmp_path / 'infer.log'
    out = io.StringIO()
    with open(log, 'w') as f:
        proc = subprocess.Popen([sys.executable, '-c', FAKE_INFER, str(result), str(exit_code)], stdout=f)
        code = wait_with_progress(proc, str(log), str(result), total, stream=out, interval=0.05)
    return code, out.getvalue().splitlines()


def test_progress_counts_clips_against_the_total_with_time_left(tmp_path):
    code, lines = run_fake(tmp_path)
    assert code == 0
    assert 'loading the model' in lines[0]
    assert [line.split(' clips')[0].split()[-1] for line in lines[1:]] == ['1/4', '2/4', '3/4', '4/4']
    assert all('elapsed' in line for line in lines) and all('left' in line for line in lines[2:])


def test_progress_returns_the_child_exit_code(tmp_path):
    code, lines = run_fake(tmp_path, exit_code=3, total=4)
    assert code == 3 and lines[-1].split(' clips')[0].endswith('4/4')


def test_the_total_is_the_number_of_windowed_clips(tiny_annotations):
    from swift_vora.dataset import build_swift_rows
    rows, _, _ = build_swift_rows(tiny_annotations)
    assert count_windows(tiny_annotations) == len(rows) > 0
    assert count_windows('/nonexistent/annotations.jsonl') is None
