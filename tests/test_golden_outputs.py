"""The `--json` outputs of `plan` and `train --dry-run` stay what they were (tests/golden/capture.py).

Every shipped recipe, every calibration row and a few plans that do not fit or are refused, each run as a user
runs it, compared with the outputs stored in tests/golden/outputs/ (fields that only say where a value came from
left out). A change of output that is meant is stored again with `python tests/golden/capture.py --write` in the
commit that makes it.
"""
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location('golden_capture', os.path.join(HERE, 'golden', 'capture.py'))
capture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capture)


def test_outputs_are_the_stored_ones(tmp_path):
    problems = capture.differences(capture.capture(str(tmp_path)), capture.stored())
    assert not problems, '\n'.join(problems)


def test_every_shipped_recipe_and_calibration_row_is_a_case(tmp_path):
    names = {name for name, _ in capture.cases(str(tmp_path))}
    recipes = {f'train-{f[:-5]}' for f in os.listdir(os.path.join(capture.REPO, 'recipes')) if f.endswith('.yaml')}
    rows = {f'plan-calibration-{row["id"]:02d}' for row in capture._calibration_rows().ROWS}
    assert recipes and rows and recipes | rows <= names
    assert set(capture.stored()) == names


def test_provenance_is_all_that_is_left_out():
    plan = '{"backend": "ddp", "config_source": {"path": "/a"}, "alternatives": [{"config_source": 1, "tp": 2}]}'
    assert capture.comparable(plan) == capture.comparable(plan.replace('/a', '/b'))
    assert capture.comparable(plan) != capture.comparable(plan.replace('"tp": 2', '"tp": 4'))
