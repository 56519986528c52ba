"""plan/backend_ratio.py and the planner's one-GPU MoE LoRA choice: not measured (the shipped state), the rule's
default stands and the plan says so with the other's cost; measured, `auto` takes the faster one and names the
ratio and its source; an explicit backend stays; the table is written only from a megatron_moe result that ran
both paths and passed its checks."""
import json
import os

import pytest

from swift_vora.plan import backend_ratio as br
from swift_vora.plan.request import PlanRequest
from swift_vora.plan.select import make_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOE = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_5_moe_35b_a3b.json')


def variant(tokens_per_s, steps=10, **extra):
    return {'tokens_per_s': tokens_per_s, 'step_s': [1.0] * steps, **extra}


def result(megatron=15000.0, unsloth=12000.0, failures=(), steps=10, others=None):
    return {'date': '2026-12-03', 'machine': {'gpu': 'NVIDIA H200', 'gpu_mem_gib': 139.8}, 'failures': list(failures),
            'model': 'random Qwen3.5-MoE, 8 layers',
            'variants': {'mg_te_ce': variant(megatron, steps), 'vora_unsloth_best': variant(unsloth, steps),
                         **(others or {})},
            'backend_ratio': {'megatron_variant': 'mg_te_ce', 'unsloth_variant': 'vora_unsloth_best',
                              'megatron_tokens_per_s': megatron, 'unsloth_tokens_per_s': unsloth,
                              'megatron_over_unsloth': round(megatron / unsloth, 3),
                              'megatron_peak_reserved_gib': 60.0, 'unsloth_peak_reserved_gib': 50.0,
                              'megatron_levers': ['extra_args=[...]']}}


def plan(table, backend='auto'):
    req = PlanRequest(model=MOE, hardware='h200x1', backend=backend, max_frames=16)
    import unittest.mock as mock
    with mock.patch.object(br, 'TABLE', str(table)):
        return make_plan(req)


def test_the_shipped_table_is_what_its_result_files_support():
    """Every shipped entry re-derives from the result file it names (kept in the repository), so the table cannot
    say more than a run measured; the Qwen3.5-MoE entry on the H200 is there."""
    entries = br.load()
    assert entries and br.lookup('qwen3_5_moe', 'H200') is not None
    for entry in entries:
        with open(os.path.join(REPO, entry['source']), encoding='utf-8') as f:
            assert br.entry_from_result(json.load(f), entry['source']) == entry


def test_megatrons_speed_estimate_is_its_own_measured_efficiency_whatever_the_ratio_table_says(tmp_path):
    """Megatron's estimate comes from its own runs (plan/speed.py EFFICIENCY, megatron_moe calls c and g), not from
    Unsloth's efficiency times the selector's ratio: that ratio compares each backend's best setting (call g: Megatron
    recomputing every layer, Unsloth none), and applied to Unsloth's full-depth efficiency it priced Megatron's own
    8-layer runs 41-64 % low (benchmarks/speed_table.py). The ratio still decides the backend and is cited."""
    table = tmp_path / 'backend_ratios.json'
    res = tmp_path / 'megatron-h200-moe-x.json'
    res.write_text(json.dumps(result(megatron=3000.0, unsloth=12000.0)))
    br.record(str(res), str(table))
    measured = plan(table).backend_choice
    none = plan(tmp_path / 'none.json').backend_choice
    est = measured['compared'][br.MEGATRON]
    assert est['est_tokens_per_s'] == none['compared'][br.MEGATRON]['est_tokens_per_s']
    assert 'megatron_moe call' in est['est_source'] and 'Unsloth' not in est['est_source']
    assert measured['status'] == br.MEASURED and '4x the tokens/s' in measured['sentence']


def test_gpu_names_match_the_profile():
    assert br.gpu_key('NVIDIA H200') == br.gpu_key('H200') == br.gpu_key('1 x NVIDIA H200 (lent GPU machine)') == 'H200'


def test_not_measured_keeps_the_rule_and_says_what_the_other_costs(tmp_path):
    p = plan(tmp_path / 'none.json')
    assert p.backend == 'unsloth_split_lora' and p.verdict == 'fits'
    choice = p.backend_choice
    assert choice['status'] == br.NOT_MEASURED and choice['faster'] is None and choice['ratio'] is None
    assert set(choice['compared']) == {br.MEGATRON, br.UNSLOTH} and all(c['fits'] for c in choice['compared'].values())
    assert 'not measured yet' in choice['sentence'] and 'megatron_ep_lora would peak at' in choice['sentence']
    assert choice['sentence'] in p.reasons


def test_record_then_auto_takes_the_measured_faster_backend(tmp_path):
    table = tmp_path / 'backend_ratios.json'
    res = tmp_path / 'megatron-h200-moe-2026-12-03.json'
    res.write_text(json.dumps(result(megatron=15000.0, unsloth=12000.0)))
    entry = br.record(str(res), str(table))
    assert entry['faster'] == br.MEGATRON and entry['ratio'] == 1.25 and entry['gpu'] == 'H200'
    p = plan(table)
    assert p.backend == 'megatron_ep_lora' and p.backend_choice['status'] == br.MEASURED
    assert '1.25x' in p.reasons[0] and p.backend_choice['source'] == entry['source']
    assert 'unsloth_split_lora would peak at' in p.backend_choice['sentence']
    kept = plan(table, backend='unsloth_split_lora')  # asked for: kept, and told the other is faster
    assert kept.backend == 'unsloth_split_lora' and kept.backend_choice['faster'] == br.MEGATRON


def test_unsloth_faster_keeps_unsloth(tmp_path):
    table = tmp_path / 'backend_ratios.json'
    res = tmp_path / 'r.json'
    res.write_text(json.dumps(result(megatron=9000.0, unsloth=12000.0)))
    br.record(str(res), str(table))
    p = plan(table)
    assert p.backend == 'unsloth_split_lora' and p.backend_choice['faster'] == br.UNSLOTH
    assert p.backend_choice['ratio'] == pytest.approx(1.333, abs=1e-3)


def test_a_failed_or_one_sided_result_is_not_recorded(tmp_path):
    table = tmp_path / 'backend_ratios.json'
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps(result(failures=['loss did not fall'])))
    with pytest.raises(ValueError, match='failed its checks'):
        br.record(str(bad), str(table))
    one = tmp_path / 'one.json'
    one.write_text(json.dumps({**result(), 'backend_ratio': None}))
    assert br.main([str(one), '--table', str(table)]) == 1
    assert br.load(str(table)) == []


def test_a_variant_outside_the_comparison_that_did_not_report_does_not_refuse_the_ratio(tmp_path):
    """Call g: the item-1 run (mg_base) was killed by its variant timeout after the compared variants had run; the
    ratio of the two that ran their steps is recorded and the entry keeps the other's failure. A failure of a compared
    variant, or one that names no variant (a failed check), still refuses the file."""
    table = tmp_path / 'backend_ratios.json'
    timed_out = 'mg_base (the item-1 run) did not report: megatron sft (mg_base) failed (exit timeout)'
    ok = tmp_path / 'ok.json'
    ok.write_text(json.dumps(result(failures=[timed_out], others={'mg_base': {'failed': 'exit timeout'}})))
    entry = br.record(str(ok), str(table))
    assert entry['not_compared'] == [timed_out] and entry['measured_steps'] == {br.MEGATRON: 10, br.UNSLOTH: 10}
    compared_failed = tmp_path / 'compared.json'
    compared_failed.write_text(json.dumps(result(failures=['mg_te_ce (a lever) did not report: exit timeout'],
                                                 others={'mg_base': {'failed': 'exit timeout'}})))
    with pytest.raises(ValueError, match='failed its checks'):
        br.entry_from_result(json.loads(compared_failed.read_text()), 'compared.json')
    check_failed = result(failures=[timed_out, 'no expert weight changed by LoRA (16 expert tensors)'],
                          others={'mg_base': {'failed': 'exit timeout'}})
    with pytest.raises(ValueError, match='no expert weight changed'):
        br.entry_from_result(check_failed, 'check.json')


def test_fewer_measured_steps_than_the_protocol_or_a_failed_compared_variant_is_not_recorded():
    with pytest.raises(ValueError, match='mg_te_ce has 9 measured step'):
        br.entry_from_result(result(steps=9), 'short.json')
    failed = result()
    failed['variants']['vora_unsloth_best']['failed'] = 'out of memory'
    with pytest.raises(ValueError, match='vora_unsloth_best failed: out of memory'):
        br.entry_from_result(failed, 'failed.json')
    no_variants = result()
    del no_variants['variants']
    with pytest.raises(ValueError, match='not among its variants'):
        br.entry_from_result(no_variants, 'old.json')


def test_call_gs_file_gives_best_against_best():
    """The kept call-g file (its item-1 run timed out): Megatron's fastest lever that ran (micro-batch 2) against the
    Unsloth path's best, 12 measured steps each."""
    source = 'benchmarks/results/megatron-h200-moe-g-2026-12-04.json'
    with open(os.path.join(REPO, source), encoding='utf-8') as f:
        entry = br.entry_from_result(json.load(f), source)
    assert entry['settings'] == {br.MEGATRON: 'mg_mb2', br.UNSLOTH: 'vora_unsloth_best'}
    assert entry['faster'] == br.UNSLOTH and entry['ratio'] == pytest.approx(42941.0 / 4669.6, abs=1e-3)
    assert entry['not_compared'] and entry['not_compared'][0].startswith('mg_base ')
    assert '/tmp' not in json.dumps(entry)  # the shipped table names no folder of the machine it ran on


def test_several_gpus_are_not_compared(tmp_path):
    req = PlanRequest(model=MOE, hardware='h200x8', max_frames=16)
    import unittest.mock as mock
    with mock.patch.object(br, 'TABLE', str(tmp_path / 'none.json')):
        p = make_plan(req)
    assert p.backend == 'megatron_ep_lora' and p.backend_choice is None
