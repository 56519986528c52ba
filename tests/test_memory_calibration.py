"""The planner's memory model against every peak measured on the H200 (benchmarks/calibration_table.py).

The measurements are result files copied from the GPU machine (benchmarks/results/); the predictions are recomputed
from the current constants, so a change to swift_vora/plan/constants.py that breaks the calibration fails here.
"""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_table():
    spec = importlib.util.spec_from_file_location('calibration_table',
                                                  os.path.join(ROOT, 'benchmarks', 'calibration_table.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_measured_peak_is_predicted_within_10_percent():
    mod = load_table()
    rows = mod.table()
    outside = [(r['id'], r['what'], {k: round(100 * v, 1) for k, v in r['error'].items()}) for r in rows
               if not r['within']]
    assert not outside, outside


def test_the_rows_cover_the_configurations_the_issue_names():
    mod = load_table()
    plans = {json.dumps(r['plan']) + str(r.get('model')) for r in mod.ROWS}
    assert len(plans) >= 6  # distinct planner inputs (rows 5 and 6 share one)
    args = [' '.join(r['plan']) for r in mod.ROWS]
    lora_2b = [a for r, a in zip(mod.ROWS, args) if not r.get('model') and '--tuner lora' in a]
    budgets = {(a.split('--frame-tokens ')[1].split()[0], a.split('--max-frames ')[-1].split()[0]) for a in lora_2b}
    assert len(budgets) >= 2  # a 2B LoRA at two (or more) video budgets
    assert any('deepspeed_zero3' in a for a in args)  # ZeRO-3 on one GPU
    assert any('--tuner full' in a for a in args)  # full fine-tuning of a small model
    assert any(r.get('model') == mod.MOE for r in mod.ROWS)  # the MoE shape with LoRA


def test_measured_values_come_from_the_recorded_files():
    mod = load_table()
    m = mod.measured(('throughput-2026-11-29.json', 'baseline'))
    assert m == {'allocated': 6.7, 'reserved': 7.17}
    m = mod.measured(('calibration-h200-2026-11-29.json', 'qwen3_vl_2b-lora8-video6k'))
    assert round(m['allocated'], 2) == 7.63 and round(m['reserved'], 2) == 8.05
