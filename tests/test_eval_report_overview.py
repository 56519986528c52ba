"""The eval report's overall figure (IoU distribution, start/end offsets) and which videos get a timeline."""
import json

from swift_vora.eval.evaluate import evaluate
from swift_vora.eval.report import choose_timelines, overall_summary, write_outputs


def write_jsonl(path, rows):
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return str(path)


def scenario(tmp_path):
    # v0..v5 answered with growing shifts of the one true window [10, 20]; v6 unparseable; v7 has no prediction
    anns = [{'id': f'v{i}', 'duration': 60.0, 'windows': [[10.0, 20.0]]} for i in range(8)]
    preds = [{'id': f'v{i}', 'response': json.dumps([[10.0 + i, 20.0 + 2 * i]])} for i in range(6)]
    preds.append({'id': 'v6', 'response': 'I think the best part is'})
    result, invalid = evaluate(write_jsonl(tmp_path / 'a.jsonl', anns), write_jsonl(tmp_path / 'p.jsonl', preds))
    assert not invalid
    return result


def test_offsets_are_prediction_minus_the_truth_it_overlaps(tmp_path):
    summary = overall_summary(scenario(tmp_path))
    assert summary['videos'] == 8 and summary['answered'] == 6
    assert summary['start_offsets'] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert summary['end_offsets'] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert summary['ious'][0] == 1.0 and summary['ious'] == sorted(summary['ious'], reverse=True)


def test_timelines_show_answered_videos_worst_and_best_halves_first(tmp_path):
    result = scenario(tmp_path)
    assert choose_timelines(result, 4) == ['v5', 'v4', 'v1', 'v0']  # two worst, two best
    assert choose_timelines(result, 8)[:6] == ['v5', 'v4', 'v3', 'v2', 'v1', 'v0']
    assert set(choose_timelines(result, 8)[6:]) == {'v6', 'v7'}  # unanswered only when room is left
    assert choose_timelines(result, 0) == []


def test_report_has_the_overall_figure_and_figures(tmp_path):
    written = write_outputs(scenario(tmp_path), str(tmp_path / 'out'), max_plots=2)
    report = open(written['report']).read()
    assert open(written['overview'], 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
    assert '![overview](overview.png)' in report and '6 of 8 videos answered' in report
    assert 'start median +2.50 s' in report and 'end median +5.00 s' in report
