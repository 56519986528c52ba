"""FP8 frozen base weights in the plan (train.fp8 / --fp8): the memory it saves, the backend it runs on, the
refusals with their reasons, the offer where the GPU has FP8 tensor cores, and the recipe key reaching the launch."""
import os

import pytest

from swift_vora.backends.launch import build_launch
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import RecipeError, recipe_from_dict
from swift_vora.cli.plan import plan_from_argv
from swift_vora.plan import constants as C
from swift_vora.plan.hardware import has_fp8, parse_capability, profile
from swift_vora.plan.memory import fp8_saving
from swift_vora.plan.model_source import load_model_spec

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'configs')
DENSE_2B = os.path.join(CONFIGS, 'qwen3_vl_2b.json')
MOE_35B = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')


def planned(*argv):
    return plan_from_argv(['--model', DENSE_2B, *argv, '--as-given'])


def test_fp8_holds_the_decoder_linears_in_one_byte_and_plans_on_ddp():
    bf16, fp8 = planned('--hardware', 'h200x1', '--backend', 'ddp'), planned('--hardware', 'h200x1', '--fp8',
                                                                            'frozen_base')
    assert fp8.verdict == 'fits' and fp8.backend == 'ddp' and fp8.fp8 == 'frozen_base'  # auto -> ddp for FP8
    saved = fp8_saving(load_model_spec(DENSE_2B)) / C.GiB
    # the 2B's decoder linears: ~1.4 B parameters, 2 bytes -> 1 byte
    assert 1.2 < saved < 1.45
    weights_bf16 = bf16.breakdown['weights (frozen base, bf16)']
    weights_fp8 = fp8.breakdown['weights (frozen base, FP8 linears + bf16)']
    assert weights_bf16 - weights_fp8 == pytest.approx(saved, abs=0.02)
    assert fp8.gpu_peak_gib < bf16.gpu_peak_gib - 1.0
    # the model loads in bf16 and is converted at train begin: the load phase holds the bf16 weights
    assert fp8.phases['load']['gpu_gib'] == pytest.approx(bf16.phases['load']['gpu_gib'], abs=0.02)
    assert 'FP8 frozen base x0.816 of bf16 (benchmarks/results/throughput-fp8-b' in fp8.est_source  # the twin ratio
    assert 'FP8 frozen base x0.816 of bf16 (measured)' in fp8.est_basis
    assert fp8.est_samples_per_s == pytest.approx(bf16.est_samples_per_s * 0.816, rel=0.01)
    assert any('SWIFT_VORA_FP8=frozen_base' in part for part in fp8.command)


@pytest.mark.parametrize('argv, rule, words', [
    (['--hardware', '3090x1', '--fp8', 'frozen_base'], 'fp8-gpu', 'RTX 3090 has no FP8 tensor cores'),
    (['--hardware', '3060x4', '--fp8', 'frozen_base'], 'fp8-gpu', 'RTX 3060'),
    (['--hardware', 'h200x1', '--fp8', 'frozen_base', '--backend', 'deepspeed_zero3'], 'fp8-backend', 'ZeRO-3'),
    (['--hardware', 'h200x1', '--fp8', 'frozen_base', '--tuner', 'full'], 'fp8-needs-lora', 'full training'),
    (['--hardware', 'h200x1', '--fp8', 'frozen_base', '--quant', '4bit', '--backend', 'ddp'], 'fp8-quant', '4bit'),
])
def test_fp8_is_refused_where_it_cannot_run_with_the_reason(argv, rule, words):
    plan = planned(*argv)
    assert plan.verdict == 'refused' and plan.rule == rule and plan.exit_code == 4
    assert words in ' '.join(plan.reasons) and plan.alternative['suggestion']


def test_fp8_on_the_moe_path_is_refused_naming_unsloth():
    plan = plan_from_argv(['--model', MOE_35B, '--hardware', 'h200x1', '--fp8', 'frozen_base'])
    assert plan.rule == 'fp8-backend' and 'Unsloth' in ' '.join(plan.reasons)
    # asked for on ddp by name, it plans -- with no speed: the one FP8 measurement is a dense model's
    ddp = plan_from_argv(['--model', MOE_35B, '--hardware', 'h200x1', '--fp8', 'frozen_base', '--backend', 'ddp'])
    assert ddp.rule is None and not ddp.est_measured and ddp.est_tokens_per_s is None
    assert 'FP8 frozen base weights never ran on a MoE model' in ddp.est_basis


def test_the_plan_offers_fp8_only_where_the_gpu_has_fp8_tensor_cores():
    def offer(plan):
        return [r for r in plan.reasons if 'train.fp8=frozen_base' in r]
    plan = planned('--hardware', 'h200x1')
    h200 = offer(plan)
    assert len(h200) == 1 and h200[0].startswith('Less memory') and 'at 0.82x the speed (measured)' in h200[0]
    assert any('less than bf16' in e and 'throughput-fp8-b' in e for e in plan.explain)  # the detail: --explain
    assert offer(planned('--hardware', '4090x1'))  # Ada: 8.9
    assert not offer(planned('--hardware', '3090x1')) and not offer(planned('--hardware', 'a100-80x1'))
    assert not offer(planned('--hardware', 'h200x1', '--fp8', 'frozen_base'))  # already on
    assert not offer(plan_from_argv(['--model', MOE_35B, '--hardware', 'h200x1']))  # MoE: not offered


def test_gpu_classes_and_probed_capabilities_say_whether_fp8_runs():
    assert profile('h200x1').fp8 is True and profile('4090x2').fp8 is True and profile('l40sx4').fp8 is True
    assert profile('3090x3').fp8 is False and profile('a100-80x8').fp8 is False
    assert has_fp8('a GPU nobody listed') is None
    assert parse_capability('8.9') == (8, 9) and parse_capability('12.0') == (12, 0)
    assert parse_capability('[N/A]') is None and parse_capability(None) is None


def test_the_recipe_key_reaches_the_launch_and_bad_values_are_refused():
    doc = {'hardware': 'h200x1', 'model': {'path': DENSE_2B}, 'data': {'dataset': 'data/train.jsonl'},
           'train': {'fp8': 'frozen_base', 'backend': 'ddp'}}
    recipe = recipe_from_dict(doc)
    launch = build_launch(plan_recipe(recipe), recipe)
    assert launch.env['SWIFT_VORA_FP8'] == 'frozen_base'
    off = recipe_from_dict({**doc, 'train': {'backend': 'ddp'}})
    assert 'SWIFT_VORA_FP8' not in build_launch(plan_recipe(off), off).env
    with pytest.raises(RecipeError, match='train.fp8'):
        recipe_from_dict({**doc, 'train': {'fp8': 'e4m3'}})
