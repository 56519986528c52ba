"""`swift-vora eval`: exit codes, JSON keys, failure accounting, window-relative rows, report and plots."""
import json
import os

import pytest

from swift_vora.cli import main
from swift_vora.eval import baselines
from swift_vora.eval.metrics import HL_KEYS, MR_KEYS

HERE = os.path.dirname(__file__)
VAL = os.path.join(HERE, 'fixtures', 'qvhighlights', 'val.jsonl')


def write_jsonl(path, rows):
    path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in rows))
    return str(path)


@pytest.fixture(scope='module')
def qvh_rows():
    with open(VAL) as f:
        return [json.loads(line) for _, line in zip(range(40), f)]


@pytest.fixture
def qvh_file(tmp_path, qvh_rows):
    return write_jsonl(tmp_path / 'val40.jsonl', qvh_rows)


def run_json(capsys, *argv):
    rc = main(['eval', *argv, '--json'])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def test_qvhighlights_json_has_the_official_keys(tmp_path, capsys, qvh_file, qvh_rows):
    preds = write_jsonl(tmp_path / 'p.jsonl', baselines.oracle(qvh_rows))
    rc, m, _ = run_json(capsys, '--annotations', qvh_file, '--predictions', preds)
    assert rc == 0
    for k in MR_KEYS + HL_KEYS + ('MR-full-R1@0.3', 'mIoU', 'parse_failures', 'missing_predictions', 'unknown_ids'):
        assert k in m, k
    assert m['format'] == 'qvhighlights' and m['queries'] == 40
    assert m['MR-full-R1@0.5'] == 100.0 and m['MR-full-R1@0.7'] == 100.0 and m['mIoU'] == 100.0
    assert m['parse_failures'] == 0 and m['missing_predictions'] == 0
    assert all(isinstance(m[k], float) for k in MR_KEYS + HL_KEYS)


def test_no_saliency_no_highlight_keys(tmp_path, capsys, qvh_file, qvh_rows):
    rows = [{'qid': r['qid'], 'pred_relevant_windows': r['pred_relevant_windows']} for r in baselines.oracle(qvh_rows)]
    rc, m, _ = run_json(capsys, '--annotations', qvh_file, '--predictions', write_jsonl(tmp_path / 'p.jsonl', rows))
    assert rc == 0 and 'MR-full-mAP' in m and not any(k in m for k in HL_KEYS)


def test_raw_responses_failures_missing_and_unknown_ids(tmp_path, capsys, qvh_file, qvh_rows):
    rows = []
    for i, r in enumerate(qvh_rows[:30]):
        if i < 10:
            text = json.dumps(r['relevant_windows'])                       # canonical answer
        elif i < 20:
            text = f"<think>hmm</think>The moment is from {r['relevant_windows'][0][0]}s " \
                   f"to {r['relevant_windows'][0][1]}s."
        elif i < 25:
            text = '[[1.0, 2.0], [3.0,'                                     # truncated
        else:
            text = '<argmax>11</argmax>' * 100                              # loop
        rows.append({'qid': r['qid'], 'response': text})
    rows.append({'qid': 'no-such-query', 'response': '[]'})
    preds = write_jsonl(tmp_path / 'p.jsonl', rows)
    rc, m, err = run_json(capsys, '--annotations', qvh_file, '--predictions', preds)
    assert rc == 0
    assert m['parse_failures'] == 10 and m['parse_failure_kinds'] == {'truncated': 5, 'repetition': 5}
    assert m['missing_predictions'] == 10 and m['unknown_ids'] == 1
    assert m['problems']['unknown'] == ['no-such-query']
    assert len(m['problems']['missing']) == 10 and len(m['problems']['parse_failures']) == 10
    assert m['MR-full-R1@0.7'] == 50.0  # 20 of 40 right; failures and missing score 0
    assert m['empty_predictions'] == 20
    assert 'parse failure' in err and 'without a prediction' in err and 'not in the annotations' in err
    # --strict turns missing / unknown ids into exit 1
    assert main(['eval', '--annotations', qvh_file, '--predictions', preds, '--strict']) == 1


def test_invalid_prediction_lines_exit_1_but_still_report(tmp_path, capsys, qvh_file, qvh_rows):
    rows = baselines.oracle(qvh_rows)[:39] + ['{not json', json.dumps({'response': '[]'}),
                                             json.dumps({'qid': qvh_rows[39]['qid'], 'pred_relevant_windows': 'x'}),
                                             '[' * 100_000]
    rc, m, _ = run_json(capsys, '--annotations', qvh_file, '--predictions', write_jsonl(tmp_path / 'p.jsonl', rows))
    assert rc == 1
    assert m['invalid_prediction_lines'] == 4 and m['missing_predictions'] == 1
    assert [p['line'] for p in m['problems']['invalid_lines']] == [40, 41, 42, 43]
    assert m['MR-full-R1@0.5'] == 97.5  # the 39 valid rows still count


def test_invalid_annotations_exit_1(tmp_path, capsys):
    ann = write_jsonl(tmp_path / 'a.jsonl', [{'id': 'a', 'windows': [[0, 1]]}, {'id': 'b', 'windows': 'oops'},
                                             {'windows': []}])
    preds = write_jsonl(tmp_path / 'p.jsonl', [{'id': 'a', 'response': '[]'}])
    assert main(['eval', '--annotations', ann, '--predictions', preds]) == 1
    assert f"{ann}:2: field 'windows': expected a list" in capsys.readouterr().err


def test_eval_reads_an_annotation_line_as_data_check_does_and_names_the_line_of_another_format(tmp_path, capsys):
    # `qid` beside our own keys: a swift-vora line to `data check`, so to eval too
    ann = write_jsonl(tmp_path / 'a.jsonl', [{'id': 'a', 'qid': 5, 'video': 'v.mp4', 'duration': 10,
                                              'windows': [[1, 2]]}])
    (tmp_path / 'v.mp4').write_bytes(b'not probed')
    assert main(['data', 'check', ann, '--no-probe']) == 0
    capsys.readouterr()
    preds = write_jsonl(tmp_path / 'p.jsonl', [{'id': 'a', 'response': '[[1, 2]]'}])
    rc, m, err = run_json(capsys, '--annotations', ann, '--predictions', preds)
    assert rc == 0 and m['format'] == 'vora' and m['kept-IoU'] == 100.0, err
    mixed = write_jsonl(tmp_path / 'm.jsonl', [{'qid': 1, 'duration': 150, 'relevant_windows': [[0, 10]]},
                                               {'id': 'a', 'video': 'v.mp4', 'duration': 10, 'windows': [[1, 2]]}])
    assert main(['eval', '--annotations', mixed, '--predictions', preds]) == 1
    assert (f'{mixed}:2: a swift-vora line (id, windows), but line 1 is a QVHighlights line (qid, '
            'relevant_windows): one format per file') in capsys.readouterr().err


def test_unreadable_file_is_a_usage_error(tmp_path, qvh_file):
    assert main(['eval', '--annotations', qvh_file, '--predictions', str(tmp_path / 'nope.jsonl')]) == 2


def test_window_relative_rows_are_mapped_and_merged(tmp_path, capsys):
    ann = write_jsonl(tmp_path / 'a.jsonl', [
        {'id': 'v1', 'video': 'v1.mp4', 'duration': 120, 'windows': [[40, 50]]},
        {'id': 'v2', 'video': 'v2.mp4', 'duration': 60, 'windows': []},
    ])
    preds = write_jsonl(tmp_path / 'p.jsonl', [
        # clip [0, 60): the model says 40-70, clamped to the clip -> 40-60 in source time
        {'id': 'v1', 'clip_start': 0, 'clip_end': 60, 'response': '[[40.0, 70.0]]'},
        # clip [30, 90): 10-20 in the clip is 40-50 in the source; overlaps the first row's window
        {'id': 'v1', 'clip_start': 30, 'clip_end': 90, 'response': 'from 10s to 20s'},
        # clip [60, 120): nothing
        {'id': 'v1', 'video_start': 60, 'video_end': 120, 'response': '[]'},
        {'id': 'v2', 'response': '[]'},
    ])
    rc, m, _ = run_json(capsys, '--annotations', ann, '--predictions', preds)
    assert rc == 0 and m['format'] == 'vora'
    assert m['merged_across_rows'] == 1
    assert m['kept-precision'] == 50.0 and m['kept-recall'] == 100.0  # kept 40-60, truth 40-50
    assert m['mIoU'] == 75.0  # v1: 10/20, v2: both empty -> 1
    for k in ('kept-F1', 'kept-IoU', 'mean-F1', 'parse_failures'):
        assert k in m


def test_one_response_with_scores_is_ranked_by_them_as_several_rows_are(tmp_path, capsys):
    ann = write_jsonl(tmp_path / 'a.jsonl', [{'qid': 1, 'vid': 'v', 'duration': 150, 'relevant_windows': [[30, 40]]}])
    answer = '[[30, 40, 0.9], [10, 20, 0.2]]'  # the model's best window is the later one in time
    alone = write_jsonl(tmp_path / 'p1.jsonl', [{'qid': 1, 'response': answer}])
    beside = write_jsonl(tmp_path / 'p2.jsonl', [{'qid': 1, 'response': answer}, {'qid': 1, 'response': '[]'}])
    submitted = write_jsonl(tmp_path / 'p3.jsonl', [{'qid': 1, 'pred_relevant_windows': [[30, 40, 0.9],
                                                                                        [10, 20, 0.2]]}])
    scores = [run_json(capsys, '--annotations', ann, '--predictions', p)[1] for p in (alone, beside, submitted)]
    assert [m['MR-full-R1@0.5'] for m in scores] == [100.0, 100.0, 100.0]
    assert [m['mIoU'] for m in scores] == [100.0, 100.0, 100.0]
    unscored = write_jsonl(tmp_path / 'p4.jsonl', [{'qid': 1, 'response': '[[10, 20], [30, 40]]'}])
    assert run_json(capsys, '--annotations', ann, '--predictions', unscored)[1]['MR-full-R1@0.5'] == 0.0  # in order


def test_a_video_shorter_than_one_saliency_clip_is_scored(tmp_path, capsys):
    ann = write_jsonl(tmp_path / 'a.jsonl', [{'qid': 1, 'vid': 'v', 'duration': 1.5, 'relevant_windows': [[0, 1.5]],
                                              'relevant_clip_ids': [0], 'saliency_scores': [[4, 4, 4]]}])
    preds = write_jsonl(tmp_path / 'p.jsonl', [{'qid': 1, 'pred_relevant_windows': [[0, 1.5, 1]],
                                                'pred_saliency_scores': [0.7]}])
    rc, m, err = run_json(capsys, '--annotations', ann, '--predictions', preds)
    assert rc == 0 and m['HL-min-VeryGood-Hit1'] == 100.0 and m['MR-full-R1@0.7'] == 100.0, err


def test_out_dir_writes_metrics_report_and_plots(tmp_path, capsys, qvh_file, qvh_rows):
    rows = [{'qid': r['qid'], 'response': json.dumps(r['relevant_windows'])} for r in qvh_rows[:35]]
    rows[0]['response'] = '[[1.0, 2.0], [3.0,'  # one parse failure
    out = tmp_path / 'out'
    rc = main(['eval', '--annotations', qvh_file, '--predictions', write_jsonl(tmp_path / 'p.jsonl', rows),
               '--out-dir', str(out), '--max-plots', '3'])
    assert rc == 0
    assert 'MR-full-R1@0.5' in capsys.readouterr().out
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['parse_failures'] == 1 and metrics['missing_predictions'] == 5
    report = (out / 'report.md').read_text()
    assert 'MR-full-mAP' in report and 'Parse failures' in report and 'Missing predictions' in report
    plots = sorted((out / 'plots').iterdir())
    assert len(plots) == 3
    for p in [*plots, out / 'overview.png']:
        data = p.read_bytes()
        assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 2000
        assert p.name in report
    # timelines show answered videos: not the unparseable one nor the five without a prediction
    unanswered = {str(r['qid']) for r in qvh_rows[:1] + qvh_rows[35:]}
    assert not any(p.name.split('_', 1)[1].rsplit('.', 1)[0] in unanswered for p in plots)
    assert '34 of 40 videos answered' in report
    # the same folder again with one timeline: the earlier ones go, a file of the user's stays
    (out / 'plots' / 'notes.txt').write_text('mine')
    rc = main(['eval', '--annotations', qvh_file, '--predictions', str(tmp_path / 'p.jsonl'), '--out-dir', str(out),
               '--max-plots', '1'])
    assert rc == 0
    left = sorted(p.name for p in (out / 'plots').iterdir())
    assert len(left) == 2 and 'notes.txt' in left
    assert [n for n in left if n != 'notes.txt'][0] in (out / 'report.md').read_text()


def test_max_plots_zero_writes_no_plots(tmp_path, capsys, qvh_file, qvh_rows):
    out = tmp_path / 'out'
    preds = write_jsonl(tmp_path / 'p.jsonl', baselines.whole_video(qvh_rows))
    assert main(['eval', '--annotations', qvh_file, '--predictions', preds, '--out-dir', str(out),
                 '--max-plots', '0']) == 0
    assert (out / 'metrics.json').stat().st_size > 0 and (out / 'report.md').stat().st_size > 0
    assert not (out / 'plots').exists()


def test_unreadable_answer_on_an_empty_truth_scores_zero(tmp_path, capsys):
    # Seen on the H200 end-to-end run: a barely trained model answered '[[[[...' on every clip, and the clips
    # with nothing to keep scored IoU 1 ("both sides empty"), giving mIoU 75 for four unreadable answers.
    ann = write_jsonl(tmp_path / 'a.jsonl', [
        {'id': 'empty_answered', 'video': 'a.mp4', 'duration': 32, 'windows': []},
        {'id': 'empty_garbage', 'video': 'b.mp4', 'duration': 32, 'windows': []},
        {'id': 'empty_missing', 'video': 'c.mp4', 'duration': 32, 'windows': []},
        {'id': 'half_garbage', 'video': 'd.mp4', 'duration': 64, 'windows': [[10, 20]]},
    ])
    preds = write_jsonl(tmp_path / 'p.jsonl', [
        {'id': 'empty_answered', 'response': '[]'},
        {'id': 'empty_garbage', 'response': '[[[[[[[[[[[[[[[['},
        # one clip unreadable, the other answered: the video still counts as answered
        {'id': 'half_garbage', 'clip_start': 0, 'clip_end': 32, 'response': '[[10.0, 20.0]]'},
        {'id': 'half_garbage', 'clip_start': 32, 'clip_end': 64, 'response': '[[[[['},
    ])
    rc, m, _ = run_json(capsys, '--annotations', ann, '--predictions', preds)
    assert rc == 0 and m['parse_failures'] == 2 and m['missing_predictions'] == 1
    assert m['mIoU'] == 50.0  # 1 (answered []) + 0 (garbage) + 0 (missing) + 1 (half_garbage: 10-20 exact)
    assert m['mean-F1'] == 50.0


def test_seconds_past_the_videos_end_are_not_kept_however_the_window_is_written(tmp_path, capsys):
    ann = write_jsonl(tmp_path / 'a.jsonl', [{'id': 'a', 'video': 'a.mp4', 'duration': 100, 'windows': [[50, 100]]}])
    rows = {'submitted': {'id': 'a', 'pred_relevant_windows': [[50, 150, 1.0]]},
            'response': {'id': 'a', 'response': '[[50, 150]]'}}
    for name, row in rows.items():
        rc, m, err = run_json(capsys, '--annotations', ann, '--predictions', write_jsonl(tmp_path / f'{name}.jsonl',
                                                                                         [row]))
        assert rc == 0 and m['kept-precision'] == 100.0 and m['kept-recall'] == 100.0, (name, m)
    assert m['windows_past_duration'] == 0  # the response was clamped by its parse (counted as `clamped`)
    rc = main(['eval', '--annotations', ann, '--predictions', str(tmp_path / 'submitted.jsonl')])
    err = capsys.readouterr().err
    assert rc == 0 and "1 predicted window(s) end past their video's duration" in err and "id 'a'" in err
