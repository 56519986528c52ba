"""`swift-vora predict`: unlabelled videos through a checkpoint's windows and eval's inference path, one line per
video in source time, merged by eval's rule, resumable, bad inputs named.

The fast tests run the real command with a stand-in for `swift infer` (tests/fake_swift_infer.py: the same
windows, one result row per clip in ms-swift's shape, answers chosen by the test); the slow one predicts a
10-minute video with the tiny model through ms-swift's own engine."""
import json
import os
import subprocess
import sys

import pytest
from cli_harness import assert_clean, run_cli

from swift_vora import trained_budget
from swift_vora.synthetic import write_video

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fake_swift_infer.py')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkpoint(folder, window='8', stride='8', queries=None):
    """An adapter checkpoint as far as predict reads one: adapter_config.json, the weights' file, ms-swift's
    args.json and the trained budget."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'adapter_config.json').write_text('{}')
    (folder / 'adapter_model.safetensors').write_bytes(b'')
    (folder / 'args.json').write_text('{}')
    trained_budget.record(str(folder), 'swift sft', {'SWIFT_VORA_WINDOW': window, 'SWIFT_VORA_STRIDE': stride},
                          max_answer_chars=20, queries=queries or {'the red square': 5})
    return folder


@pytest.fixture
def fake_infer(monkeypatch, tmp_path):
    """`swift infer` replaced by the stand-in; returns a function setting its answers; `seen()` lists the ids each
    run was asked about."""
    import swift_vora.eval.inference as inference
    monkeypatch.setattr(inference, 'swift_argv', lambda: [sys.executable, FAKE])
    wait = inference.wait_with_progress  # polled every 0.05 s instead of 2 s: the stand-in answers at once
    monkeypatch.setattr(inference, 'wait_with_progress', lambda *a, **k: wait(*a, **{**k, 'interval': 0.05}))
    seen = tmp_path / 'seen.jsonl'
    monkeypatch.setenv('FAKE_SEEN', str(seen))

    def answers(mapping=None, stop_after=0):
        monkeypatch.setenv('FAKE_ANSWERS', json.dumps(mapping or {}))
        monkeypatch.setenv('FAKE_STOP_AFTER', str(stop_after))
    answers.seen = lambda: [json.loads(x) for x in seen.read_text().splitlines()] if seen.exists() else []
    answers()
    return answers


@pytest.fixture
def videos(tmp_path):
    folder = tmp_path / 'videos'
    (folder / 'sub').mkdir(parents=True)
    write_video(str(folder / 'a.mp4'), 20.0, [(6, 10)], fps=4.0, size=(32, 24))
    write_video(str(folder / 'sub' / 'b.mp4'), 5.0, [], fps=4.0, size=(32, 24))
    (folder / 'notes.txt').write_text('not a video: a folder search skips it')
    return folder


def read(path):
    return {row['id']: row for row in map(json.loads, open(path))}


def predict(*argv):
    rc, out, err = run_cli('predict', *argv)
    assert_clean(rc, out, err, ['predict', *argv])
    return rc, out, err


def test_each_video_becomes_one_line_in_source_time(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt')
    # a: 20 s in windows of 8 s: [0, 8), [8, 16), [16, 20); an event across the edge at 8 s is answered by both
    fake_infer({'a@0': '[[6.0, 8.0]]', 'a@8': '[[0.0, 2.0]]', 'a@16': 'junk [[1.0,'})
    rc, out, err = predict(videos, '--adapters', ckpt, '--output', tmp_path / 'p.jsonl', '--json')
    assert rc == 0, err
    lines = read(tmp_path / 'p.jsonl')
    a, b = lines['a'], lines['sub/b']
    assert a['video'] == str(videos / 'a.mp4') and a['duration'] == 20.0
    assert a['windows'] == [[6.0, 10.0]] and a['kept_seconds'] == 4.0  # touching windows of two clips: one
    assert [(c['start'], c['end']) for c in a['clips']] == [(0.0, 8.0), (8.0, 16.0), (16.0, 20.0)]
    assert [c['response'] for c in a['clips']] == ['[[6.0, 8.0]]', '[[0.0, 2.0]]', 'junk [[1.0,']
    assert a['parse_failures'] == 1 and [c['failure'] for c in a['clips']] == [None, None, 'truncated']
    assert b['windows'] == [] and b['clips'] == [{'start': 0.0, 'end': 5.0, 'response': '[]', 'failure': None}]
    assert a['query'] == b['query'] == 'the red square'  # the checkpoint's training query
    assert a['checkpoint'] == str(ckpt)
    assert json.loads(out)['parse_failure_kinds'] == {'truncated': 1} and json.loads(out)['clips'] == 4
    assert '1 of 3 clips did not parse: 16-20 s (truncated)' in err
    asked = [json.loads(x) for x in open(str(tmp_path / 'p.jsonl') + '.videos.jsonl')]  # what swift infer was given
    assert asked == [{'id': 'a', 'video': str(videos / 'a.mp4'), 'duration': 20.0, 'query': 'the red square',
                      'windows': []},
                     {'id': 'sub/b', 'video': str(videos / 'sub' / 'b.mp4'), 'duration': 5.0,
                      'query': 'the red square', 'windows': []}]


def test_overlapping_windows_merge_by_evals_rule_and_eval_scores_the_same_windows(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt', window='8', stride='4')  # clips [0,8) [4,12) [8,16) [12,20)
    fake_infer({
        'a@0': '[[5.0, 8.0]]',  # 5-8 ...
        'a@4': '[[3.0, 5.0]]',  # ... 7-9 overlaps it: one window 5-9
        'a@8': '[[1.5, 2.0]]',  # 9.5-10: 0.5 s after 9, apart (touching or overlapping windows join, gaps do not)
        'a@12': '[[7.9, 20.0]]',  # clamped to its clip: 19.9-20
    })
    rc, out, err = predict(videos / 'a.mp4', '--adapters', ckpt, '-o', tmp_path / 'p.jsonl')
    assert rc == 0, err
    a = read(tmp_path / 'p.jsonl')['a']
    assert [(c['start'], c['end']) for c in a['clips']] == [(0.0, 8.0), (4.0, 12.0), (8.0, 16.0), (12.0, 20.0)]
    assert a['windows'] == [[5.0, 9.0], [9.5, 10.0], [19.9, 20.0]]
    from swift_vora.eval.evaluate import evaluate
    (tmp_path / 'truth.jsonl').write_text(json.dumps({'id': 'a', 'windows': [[6, 10]], 'duration': 20.0}) + '\n')
    result, invalid = evaluate(str(tmp_path / 'truth.jsonl'), str(tmp_path / 'p.jsonl'))
    assert not invalid and result.metrics['prediction_rows'] == 4 and result.metrics['parse_failures'] == 0
    assert sorted([round(s, 3), round(e, 3)] for s, e, _ in result.predictions['a'].windows) == a['windows']


def test_a_window_clamped_to_a_sliver_at_the_videos_end_is_not_written_and_cut_and_resume_take_the_line(
        tmp_path, fake_infer):
    # 31 frames at 3 fps: 10.333... s, clips [0, 8) and [8, 10.333...); the last clip's answer starts at its end
    # to a tenth of a millisecond, so clamped to the clip it is a 0.03 ms window that the line's milliseconds empty
    write_video(str(tmp_path / 'v.mp4'), 31 / 3, [], fps=3.0, size=(32, 24))
    ckpt = checkpoint(tmp_path / 'ckpt')
    fake_infer({'v@0': '[[1.0, 3.0]]', 'v@8': '[[2.3333, 4.0]]'})
    rc, out, err = predict(tmp_path / 'v.mp4', '--adapters', ckpt, '-o', tmp_path / 'p.jsonl')
    assert rc == 0, err
    v = read(tmp_path / 'p.jsonl')['v']
    assert v['duration'] == 10.333 and v['clips'][-1]['end'] == 10.333
    assert v['windows'] == [[1.0, 3.0]] and v['kept_seconds'] == 2.0
    rc, out, err = run_cli('cut', tmp_path / 'p.jsonl', '--to', 'otio', '--output-dir', tmp_path / 'cut')
    assert rc == 0, err
    from swift_vora.eval.evaluate import evaluate
    (tmp_path / 'truth.jsonl').write_text(json.dumps({'id': 'v', 'windows': [[1, 3]], 'duration': 10.333}) + '\n')
    result, invalid = evaluate(str(tmp_path / 'truth.jsonl'), str(tmp_path / 'p.jsonl'))
    assert not invalid  # the line's windows are the ones its (millisecond) clips give
    write_video(str(tmp_path / 'w.mp4'), 5.0, [], fps=4.0, size=(32, 24))
    rc, out, err = predict(tmp_path / 'v.mp4', tmp_path / 'w.mp4', '--adapters', ckpt, '-o', tmp_path / 'p.jsonl')
    assert rc == 0, err  # the run resumes over the line it wrote
    assert set(read(tmp_path / 'p.jsonl')) == {'v', 'w'}


def test_eval_names_a_prediction_line_whose_clips_cannot_be_read(tmp_path):
    from swift_vora.eval.evaluate import evaluate
    (tmp_path / 'truth.jsonl').write_text(json.dumps({'id': 'a', 'windows': [[1, 2]], 'duration': 20.0}) + '\n')
    (tmp_path / 'p.jsonl').write_text(json.dumps({'id': 'a', 'video': 'a.mp4', 'duration': 20.0, 'windows': [],
                                                  'clips': [{'start': 0.0, 'end': 8.0}]}) + '\n')
    result, invalid = evaluate(str(tmp_path / 'truth.jsonl'), str(tmp_path / 'p.jsonl'))
    assert invalid == [{'line': 1, 'id': 'a', 'reason': "field 'clips'[0]: expected {start, end (seconds), response "
                                                         "(text)}"}]
    assert result.metrics['missing_predictions'] == 1  # its video scores 0, as any invalid line's


def test_eval_scores_what_cut_cuts_a_line_edited_by_hand_is_named_not_scored_by_its_old_answers(tmp_path):
    from swift_vora.eval.evaluate import evaluate
    (tmp_path / 'truth.jsonl').write_text(json.dumps({'id': 'a', 'windows': [[6, 10]], 'duration': 20.0}) + '\n')
    line = {'id': 'a', 'video': 'a.mp4', 'duration': 20.0, 'windows': [[6.0, 10.0]],
            'clips': [{'start': 0.0, 'end': 8.0, 'response': '[[6.0, 8.0]]'},
                      {'start': 8.0, 'end': 16.0, 'response': '[[0.0, 2.0]]'},
                      {'start': 16.0, 'end': 20.0, 'response': '[]'}]}

    def scored(row):
        (tmp_path / 'p.jsonl').write_text(json.dumps(row) + '\n')
        return evaluate(str(tmp_path / 'truth.jsonl'), str(tmp_path / 'p.jsonl'))

    result, invalid = scored(line)  # as predict wrote it: the clips' answers, joined across the clip edge
    assert not invalid and [w[:2] for w in result.predictions['a'].windows] == [(6.0, 10.0)]
    result, invalid = scored({**line, 'windows': []})  # the user struck the window out; the clips still hold it
    assert invalid == [{'line': 1, 'id': 'a', 'reason': "field 'windows': not the windows its 'clips' answer "
                        "([[6.0, 10.0]]), edited after predict? eval scores what cut cuts: drop the line's 'clips' "
                        "to score the edited windows, or run predict again"}]
    assert result.metrics['missing_predictions'] == 1
    result, invalid = scored({k: v for k, v in {**line, 'windows': [[7.0, 9.5]]}.items() if k != 'clips'})
    assert not invalid and [w[:2] for w in result.predictions['a'].windows] == [(7.0, 9.5)]  # the line's own windows


def test_a_second_run_skips_the_videos_already_predicted(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt')
    out = tmp_path / 'p.jsonl'
    assert predict(videos, '--adapters', ckpt, '-o', out)[0] == 0
    before = out.read_text()
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)
    assert rc == 0 and '2 of 2 video(s) already in' in err and out.read_text() == before
    write_video(str(videos / 'c.mp4'), 3.0, [], fps=4.0, size=(32, 24))
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)
    assert rc == 0 and list(read(out)) == ['a', 'sub/b', 'c'] and out.read_text().startswith(before)
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out, '--overwrite')
    assert rc == 0 and sorted(read(out)) == ['a', 'c', 'sub/b']
    assert fake_infer.seen() == [['a', 'sub/b'], ['c'], ['a', 'c', 'sub/b']]  # the model was asked only what was new


def test_a_line_whose_video_is_relative_to_its_file_is_resumed_from_any_folder(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt')
    out = videos / 'p.jsonl'
    fake_infer({'a@0': '[[6.0, 8.0]]'})
    assert predict(videos / 'a.mp4', '--adapters', ckpt, '-o', out)[0] == 0
    line = read(out)['a']
    out.write_text(json.dumps({**line, 'video': 'a.mp4'}) + '\n')  # as cut reads it: from the file's folder
    assert run_cli('cut', out, '--to', 'otio', '--output-dir', tmp_path / 'cut')[0] == 0
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)  # the current folder is not the file's
    assert rc == 0 and '1 of 2 video(s) already in' in err and list(read(out)) == ['a', 'sub/b']
    out.write_text(json.dumps({**line, 'video': 'sub/b.mp4'}) + '\n')  # another file under the same id
    rc, _, err = run_cli('predict', videos, '--adapters', ckpt, '-o', out)
    assert rc == 1 and f"field 'video': id 'a' is sub/b.mp4 there but {videos / 'a.mp4'} in this run" in err


def test_a_run_that_stops_keeps_the_videos_it_finished(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt')
    out = tmp_path / 'p.jsonl'
    fake_infer(stop_after=3)  # the three clips of a, then swift infer fails
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)
    assert rc == 1 and 'swift infer exited with 1' in err and 'run the same command again' in err
    assert list(read(out)) == ['a']  # whole lines of whole videos only
    fake_infer()
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)
    assert rc == 0 and list(read(out)) == ['a', 'sub/b'] and fake_infer.seen()[-1] == ['sub/b']


def test_an_unreadable_video_is_named_and_the_others_are_predicted(tmp_path, videos, fake_infer):
    (videos / 'broken.mp4').write_bytes(b'')
    (videos / 'garbage.mov').write_bytes(b'not a video at all')
    rc, out, err = predict(videos, '--adapters', checkpoint(tmp_path / 'ckpt'), '-o', tmp_path / 'p.jsonl', '--json')
    assert rc == 1
    assert f'{videos / "broken.mp4"}: file is empty (0 bytes); not predicted' in err
    assert f'{videos / "garbage.mov"}: cannot be decoded' in err
    assert [u['video'] for u in json.loads(out)['unreadable']] == [str(videos / 'broken.mp4'),
                                                                   str(videos / 'garbage.mov')]
    assert sorted(read(tmp_path / 'p.jsonl')) == ['a', 'sub/b']


def test_usage_errors_stop_before_the_model_loads(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt')
    out = tmp_path / 'p.jsonl'
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'twins').mkdir()
    write_video(str(tmp_path / 'twins' / 'x.mp4'), 2.0, [], fps=4.0, size=(32, 24))
    write_video(str(tmp_path / 'twins' / 'x.mov'), 2.0, [], fps=4.0, size=(32, 24))
    config_only = tmp_path / 'config_only'  # a folder with the adapter's config and nothing else
    config_only.mkdir()
    (config_only / 'adapter_config.json').write_text('{}')
    no_args = checkpoint(tmp_path / 'no_args')
    (no_args / 'args.json').unlink()
    cases = [
        ((tmp_path / 'absent', '--adapters', ckpt), 2, 'no such file or folder'),
        ((tmp_path / 'empty', '--adapters', ckpt), 2, 'no video files in this folder'),
        ((tmp_path / 'twins', '--adapters', ckpt), 2, "two videos would have the id 'x'"),
        ((videos,), 2, 'give --adapters CKPT'),
        ((videos, '--adapters', tmp_path), 2, 'no adapter_config.json'),
        ((videos, '--adapters', config_only), 2, 'no adapter_model.safetensors in it (the trained weights'),
        ((videos, '--adapters', no_args), 2, "no args.json in it (ms-swift's record of the training"),
        ((videos, '--adapters', checkpoint(tmp_path / 'many', queries={'goals': 3, 'fouls': 2})), 2,
         "trained on 2 different queries (the most common: 'goals'"),
        ((videos, '--adapters', ckpt, '--query', '  '), 2, '--query: empty text'),
    ]
    for argv, code, message in cases:
        rc, _, err = predict(*argv, '-o', out)
        assert rc == code and message in err, (argv, rc, err)
    assert fake_infer.seen() == [] and not out.exists()


def test_an_output_that_is_not_prediction_lines_is_left_alone(tmp_path, videos, fake_infer):
    ckpt = checkpoint(tmp_path / 'ckpt')
    out = tmp_path / 'p.jsonl'
    out.write_text('{"id": "a", "video": "/x.mp4", "duration": 20, "windows": []}\n{"oops"\n')
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)
    assert rc == 1 and f'{out}:2: not valid JSON' in err and '--overwrite' in err
    out.write_text('{"id": "a", "video": "/elsewhere/a.mp4", "duration": 20, "windows": []}\n')
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out)
    assert rc == 1 and f"{out}:1: field 'video': id 'a' is /elsewhere/a.mp4 there" in err
    assert fake_infer.seen() == []
    rc, _, err = predict(videos, '--adapters', ckpt, '-o', out, '--overwrite')
    assert rc == 0 and read(out)['a']['video'] == str(videos / 'a.mp4')


@pytest.mark.slow
def test_a_ten_minute_video_is_predicted_through_the_windows_with_the_tiny_model(tmp_path, tiny_model_dir,
                                                                                  offline_env):
    """ms-swift's own engine: the checkpoint's windows (60 s) and budget (at most 4 frames a clip) cut and encode
    each clip of a 10-minute video; the random model's answers are kept whether they parse or not."""
    model = tmp_path / 'model'  # the tiny model with a trained budget of its own (the shared one stays as it is)
    model.mkdir()
    for name in os.listdir(tiny_model_dir):
        os.symlink(os.path.join(tiny_model_dir, name), model / name)
    trained_budget.record(str(model), 'swift sft', {
        'SWIFT_VORA_FPS': '0.5', 'SWIFT_VORA_MIN_FRAMES': '2', 'SWIFT_VORA_MAX_FRAMES': '4',
        'SWIFT_VORA_PAIR_TOKENS': '16', 'SWIFT_VORA_MIN_PAIR_TOKENS': '4', 'SWIFT_VORA_WINDOW': '60',
        'SWIFT_VORA_STRIDE': '60'}, max_answer_chars=4, queries={'the red square': 1})
    (tmp_path / 'videos').mkdir()
    write_video(str(tmp_path / 'videos' / 'long.mp4'), 600.0, [(100, 130), (300, 305)], fps=2.0, size=(32, 24))
    out, encode_log = tmp_path / 'p.jsonl', tmp_path / 'encode.jsonl'
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'predict', str(tmp_path / 'videos'), '--model',
                           str(model), '--model-type', 'qwen3_vl', '--max-new-tokens', '8', '--infer-backend',
                           'transformers', '-o', str(out)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**offline_env, 'PYTHONPATH': REPO, 'SWIFT_VORA_ENCODE_LOG': str(encode_log)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = map(json.loads, open(out))
    assert line['id'] == 'long' and line['duration'] == 600.0
    assert [(c['start'], c['end']) for c in line['clips']] == [(60.0 * k, 60.0 * (k + 1)) for k in range(10)]
    assert line['parse_failures'] == sum(1 for c in line['clips'] if c['failure'])  # every answer accounted for
    assert all(0 <= s < e <= 600.0 for s, e in line['windows'])
    encoded = [json.loads(x) for x in open(encode_log)]
    assert sorted(e['sample_id'] for e in encoded) == sorted(f'long@{60.0 * k:.1f}-{60.0 * (k + 1):.1f}'
                                                             for k in range(10))
    assert all(0 < e['frames_from_tensors'] <= 4 for e in encoded)  # the checkpoint's budget, not the default
    assert '10 clip(s) of the checkpoint\'s windows (window 60.0 s' in proc.stderr
    assert 'inference 10/10 clips' in proc.stderr and '1/1 videos done' in proc.stderr
