"""Regression against the official QVHighlights evaluator's figures (pinned, to 0.01).

The figures in tests/fixtures/eval/expected_official.json were produced by the official
`standalone_eval/eval.py` (jayleicn/moment_detr) on the synthetic prediction sets of
`swift_vora.eval.baselines`; `benchmarks/official_eval_compare.py --write` regenerates them (it needs
a local copy of the official code; this test does not).
"""
import hashlib
import json
import os

import pytest

from swift_vora.eval import baselines
from swift_vora.eval.evaluate import evaluate
from swift_vora.eval.metrics import HL_KEYS, MR_KEYS

HERE = os.path.dirname(__file__)
ANNOTATIONS = os.path.join(HERE, 'fixtures', 'qvhighlights', 'val.jsonl')
EXPECTED = os.path.join(HERE, 'fixtures', 'eval', 'expected_official.json')


@pytest.fixture(scope='module')
def expected():
    with open(EXPECTED) as f:
        return json.load(f)


@pytest.fixture(scope='module')
def gt_rows():
    with open(ANNOTATIONS) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_fixture_is_the_annotation_file_the_figures_came_from(expected, gt_rows):
    with open(ANNOTATIONS, 'rb') as f:
        assert hashlib.sha256(f.read()).hexdigest() == expected['annotations']['sha256']
    assert len(gt_rows) == expected['annotations']['queries'] == 1550
    assert set(expected['sets']) == set(baselines.SETS)


@pytest.mark.parametrize('name', sorted(baselines.SETS))
def test_matches_official_figures(name, expected, gt_rows, tmp_path):
    path = tmp_path / f'{name}.jsonl'
    path.write_text(''.join(json.dumps(r) + '\n' for r in baselines.SETS[name](gt_rows)))
    ours = evaluate(ANNOTATIONS, str(path))[0].metrics
    official = expected['sets'][name]
    assert set(official['brief']) == set(MR_KEYS + HL_KEYS)
    diffs = {k: (v, ours[k]) for k, v in official['brief'].items() if abs(ours[k] - v) > 0.01 + 1e-9}
    for bucket in ('full', 'short', 'middle', 'long'):
        for kind in ('MR-mAP', 'MR-R1'):
            for t, v in official[bucket][kind].items():
                o = ours['detail'][bucket][kind][t]
                if abs(o - v) > 0.01 + 1e-9:
                    diffs[f'{bucket}/{kind}/{t}'] = (v, o)
    assert not diffs, diffs
    assert ours['parse_failures'] == 0 and ours['missing_predictions'] == 0
