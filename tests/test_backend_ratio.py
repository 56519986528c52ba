"""plan/backend_ratio.py: the two one-GPU MoE LoRA backends measured side by side. The table is written only from a
megatron_moe result that ran both paths and passed its checks; the plan picks its backend by estimated hours (each
backend from its own runs) and quotes the side-by-side ratio only for a model of the depth it was measured at."""
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
            'model': 'random Qwen3.5-MoE, 35B-A3B shape cut to 8 layers',
            'variants': {'mg_te_ce': variant(megatron, steps), 'vora_unsloth_best': variant(unsloth, steps),
                         **(others or {})},
            'backend_ratio': {'megatron_variant': 'mg_te_ce', 'unsloth_variant': 'vora_unsloth_best',
                              'megatron_tokens_per_s': megatron, 'unsloth_tokens_per_s': unsloth,
                              'megatron_over_unsloth': round(megatron / unsloth, 3),
                              'megatron_peak_reserved_gib': 60.0, 'unsloth_peak_reserved_gib': 50.0,
                              'megatron_levers': ['extra_args=[...]']}}


def plan(table, backend='auto', model=MOE):
    req = PlanRequest(model=model, hardware='h200x1', backend=backend, max_frames=16)
    import unittest.mock as mock
    with mock.patch.object(br, 'TABLE', str(table)):
        return make_plan(req)


def moe_cut(tmp_path, layers):
    """The 35B-A3B shape cut to `layers` decoder layers (what the side-by-side benchmark builds)."""
    from swift_vora.tiny_model import qwen3_5_moe_config
    path = tmp_path / f'moe_{layers}.json'
    path.write_text(qwen3_5_moe_config('35b-a3b', layers).to_json_string())
    return str(path)


def test_the_shipped_table_is_what_its_result_files_support():
    """Every shipped entry re-derives from the result file it names (kept in the repository), so the table cannot
    say more than a run measured; the Qwen3.5-MoE entry on the H200 is there, with the depth it ran at."""
    entries = br.load()
    assert entries and br.lookup('qwen3_5_moe', 'H200') is not None
    assert br.lookup('qwen3_5_moe', 'H200')['layers'] == 8
    for entry in entries:
        with open(os.path.join(REPO, entry['source']), encoding='utf-8') as f:
            assert br.entry_from_result(json.load(f), entry['source']) == entry


def test_auto_picks_by_hours_from_each_backends_own_runs_whatever_the_ratio_table_says(tmp_path):
    """A ratio measured on the 8-layer cut does not decide a 40-layer plan: each backend's estimate comes from its
    own MoE runs (plan/speed.py), and auto takes the fewest hours; the plan is the same with or without the table."""
    table = tmp_path / 'backend_ratios.json'
    res = tmp_path / 'megatron-h200-moe-x.json'
    res.write_text(json.dumps(result(megatron=15000.0, unsloth=12000.0)))  # Megatron "faster" at 8 layers
    br.record(str(res), str(table))
    measured, none = plan(table), plan(tmp_path / 'none.json')
    assert measured.backend == none.backend == 'unsloth_split_lora'
    by_backend = {o['backend']: o for o in measured.options}
    assert set(by_backend) >= {br.MEGATRON, br.UNSLOTH}
    assert by_backend[br.UNSLOTH]['est_samples_per_s'] > by_backend[br.MEGATRON]['est_samples_per_s']
    assert by_backend[br.MEGATRON]['est_tokens_per_s'] == {o['backend']: o for o in none.options}[br.MEGATRON][
        'est_tokens_per_s']
    assert 'megatron-h200-moe' in by_backend[br.MEGATRON]['est_source']
    assert 'Unsloth' not in by_backend[br.MEGATRON]['est_source']
    # the side-by-side ratio is not quoted against a model of another depth
    said = [e for e in measured.explain if 'side by side' in e]
    assert said and 'not quoted' in said[0] and '1.25x' not in ' '.join(measured.explain)


def test_the_ratio_is_quoted_at_the_depth_it_was_measured(tmp_path):
    table = tmp_path / 'backend_ratios.json'
    res = tmp_path / 'r.json'
    res.write_text(json.dumps(result(megatron=9000.0, unsloth=12000.0)))
    br.record(str(res), str(table))
    at_8 = plan(table, model=moe_cut(tmp_path, 8))
    quoted = [e for e in at_8.explain if e.startswith('Measured side by side at this depth')]
    assert quoted and '1.333x' in quoted[0] and 'unsloth_split_lora' in quoted[0]
    kept = plan(table, backend='megatron_ep_lora', model=moe_cut(tmp_path, 8))  # asked for by name: kept
    assert kept.backend == 'megatron_ep_lora' and kept.reasons[0] == 'backend megatron_ep_lora (as requested).'


def test_gpu_names_match_the_profile():
    assert br.gpu_key('NVIDIA H200') == br.gpu_key('H200') == br.gpu_key('1 x NVIDIA H200 (lent GPU machine)') == 'H200'


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
