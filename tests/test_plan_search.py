"""The best plan that fits (plan/search.py): the settings a user would try by hand, searched where the user left them
free, the fewest estimated hours chosen, what the user set kept and said, the choice reaching the launch; and for a
MoE model on several GPUs, every backend that fits planned and the fewest hours taken (data-parallel split LoRA
against Megatron expert parallelism)."""
import os

import pytest

from swift_vora.backends.planning import plan_request
from swift_vora.backends.recipe import recipe_from_dict
from swift_vora.cli.plan import plan_from_argv
from swift_vora.plan import rules, search, select, speed
from swift_vora.plan.request import SEARCHABLE, PlanRequest
from swift_vora.plan.select import make_plan

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'configs')
MOE = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')
DENSE_2B = os.path.join(CONFIGS, 'qwen3_vl_2b.json')


@pytest.fixture
def replicas_allowed(monkeypatch):
    """unsloth_split_lora on several GPUs, one replica each (the data-parallel runner): the rule that refused it
    (unsloth-multi-gpu) is lifted here as it is where that runner ships; a no-op once the rule is gone."""
    original = rules.check_refusal

    def check(spec, world, req, backend, ep, tp, hw=None):
        refused = original(spec, world, req, backend, ep, tp, hw)
        return None if refused and refused[0] == 'unsloth-multi-gpu' else refused
    for module in (select, search):
        monkeypatch.setattr(module, 'check_refusal', check)


def plan(hardware, *flags, model=MOE):
    return plan_from_argv(['--model', model, '--hardware', hardware, '--samples', '10000', *flags])


# ---- the search on one GPU ------------------------------------------------------------------------------------
def test_the_search_answers_with_the_fastest_setting_that_fits():
    """The 35B-A3B on one H200: micro-batch 4 with fewer layers checkpointed, not the cautious micro-batch 1 (4.1 h
    as asked, about 2 h searched); every smaller micro-batch that fits is slower."""
    best = plan('h200x1')
    assert best.verdict == 'fits' and best.backend == 'unsloth_split_lora'
    assert best.micro_batch == 4 and best.checkpoint_layers is not None and best.checkpoint_layers < 40
    cautious = plan('h200x1', '--as-given')
    assert cautious.micro_batch == 1 and cautious.est_hours_per_epoch > 1.5 * best.est_hours_per_epoch
    for mb in (1, 2):
        assert plan('h200x1', '--micro-batch', str(mb)).est_hours_per_epoch > best.est_hours_per_epoch
    assert best.search['searched'] == list(SEARCHABLE) and best.search['chosen']['micro_batch'] == 4
    said = [r for r in best.reasons if r.startswith('Searched')]
    assert said and 'micro-batch 4' in said[0] and f'first {best.checkpoint_layers} of 40' in said[0]
    assert best.gpu_peak_gib <= best.gpu_capacity_gib


def test_what_the_user_set_is_kept_and_said():
    fixed = plan('h200x1', '--micro-batch', '1', '--checkpoint-layers', '40')
    assert fixed.micro_batch == 1 and fixed.checkpoint_layers in (None, 40)
    said = next(r for r in fixed.reasons if 'Kept as set' in r)
    assert 'micro-batch' in said and 'checkpointed layers' in said
    assert fixed.search['searched'] == ['offload', 'video_budget']
    # a recipe keeps what it writes and leaves the rest to the plan
    doc = {'model': {'path': MOE}, 'data': {'dataset': 'a.jsonl'}, 'hardware': 'h200x1'}
    free = plan_request(recipe_from_dict(doc, where='<test>'))
    assert set(free.search) == set(SEARCHABLE)
    written = plan_request(recipe_from_dict({**doc, 'train': {'per_device_train_batch_size': 2},
                                             'video': {'max_frames': 32}}, where='<test>'))
    assert 'micro_batch' not in written.search and 'video_budget' not in written.search
    assert written.micro_batch == 2


def test_the_chosen_settings_reach_the_launch():
    """What the search chose is what `train` runs: the command carries the micro-batch and checkpointed layers."""
    best = plan('h200x1')
    command = ' '.join(best.command)
    assert f'SWIFT_VORA_CHECKPOINT_LAYERS={best.checkpoint_layers}' in command
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.cli.compose import launch_plan
    recipe = recipe_from_dict({'model': {'path': MOE}, 'data': {'dataset': 'a.jsonl'}, 'hardware': 'h200x1',
                               'train': {'backend': 'auto'}}, where='<test>')
    planned, launch = launch_plan(plan_recipe(recipe), recipe, environ={})
    config = next(text for path, text in launch.files.items() if path.endswith('unsloth_run.json'))
    assert f'"micro_batch": {planned.micro_batch}' in config and planned.micro_batch == 4


def test_a_budget_that_fits_only_with_offload_is_lowered_and_both_are_listed():
    """8B dense on 4 x RTX 3060: at the 64-frame budget only CPU offload fits (182 tokens/s); halving the frames,
    the recipe's first knob, fits without it and is the plan -- both are listed with their hours."""
    p = plan('3060x4', model='Qwen/Qwen3-VL-8B-Instruct')
    assert p.verdict == 'fits' and p.offload == 'none' and p.search['budget_lowered']
    assert p.tokens['frames'] < 64 and p.search['chosen']['max_frames'] == p.tokens['frames']
    assert 'SWIFT_VORA_MAX_FRAMES=' + str(p.tokens['frames']) in p.command
    full_budget = [o for o in p.options if not o['budget_lowered']]
    assert full_budget and full_budget[0]['offload'] == 'cpu'
    assert all(o['est_hours_per_epoch'] > p.est_hours_per_epoch for o in p.options if not o['chosen'])
    assert any('fits only with CPU offload or not at all' in r for r in p.reasons)
    # the floor is the user's: with at least 64 frames a clip the budget is not lowered
    floor = plan('3060x4', '--min-frames', '64', model='Qwen/Qwen3-VL-8B-Instruct')
    assert floor.tokens['frames'] == 64 and floor.tokens['tokens_per_group'] < 256  # the second knob instead
    floor = plan('3060x4', '--min-frames', '64', '--min-pair-tokens', '256', model='Qwen/Qwen3-VL-8B-Instruct')
    assert floor.tokens['frames'] == 64 and floor.tokens['tokens_per_group'] == 256 and floor.offload == 'cpu'
    # a budget the user set is kept (the plan says what fits instead)
    kept = plan('3060x4', '--max-frames', '64', '--offload', 'none', model='Qwen/Qwen3-VL-8B-Instruct')
    assert kept.verdict == 'does_not_fit' and kept.tokens['frames'] == 64


# ---- MoE on several GPUs: every backend that fits, the fewest hours ----------------------------------------
@pytest.mark.parametrize('hardware', ['h200x2', 'h200x4', 'h200x8', 'h100x8'])
def test_moe_lora_on_several_gpus_plans_every_backend_and_takes_the_fewest_hours(replicas_allowed, hardware):
    p = make_plan(PlanRequest(model=MOE, hardware=hardware, samples_per_epoch=10000, search=SEARCHABLE))
    assert p.verdict == 'fits'
    by_backend = {o['backend']: o for o in p.options}
    # the data-parallel replicas where one replica fits one GPU, and Megatron's expert parallelism
    assert 'megatron_ep_lora' in by_backend
    chosen = next(o for o in p.options if o['chosen'])
    assert chosen['backend'] == p.backend
    measured = [o for o in p.options if o['est_measured']]
    assert min(measured, key=lambda o: o['est_hours_per_epoch']) is chosen
    for o in p.options:  # each with its tokens/s, hours, memory and what the estimate rests on -- a MoE run
        assert o['gpu_peak_gib'] <= p.gpu_capacity_gib and o['est_basis']
        assert o['est_measured'] and 'MoE' in o['est_basis'] and o['est_tokens_per_s'] and o['est_hours_per_epoch']
    if 'unsloth_split_lora' in by_backend:
        dp = by_backend['unsloth_split_lora']
        assert dp['num_gpus'] == p.num_gpus and 'replicas at an assumed' in dp['est_basis']
        assert 'all-reduce' in dp['est_source'] and 'assumed, not measured on several GPUs' in dp['est_source']
        assert dp['est_hours_per_epoch'] < by_backend['megatron_ep_lora']['est_hours_per_epoch']
        assert p.backend == 'unsloth_split_lora'


def test_the_data_parallel_estimate_is_one_gpu_times_n_times_the_all_reduce_scaling(replicas_allowed):
    eight = make_plan(PlanRequest(model=MOE, hardware='h200x8', micro_batch=4, checkpoint_layers=40,
                                  backend='unsloth_split_lora', lora_rank=16))
    one = make_plan(PlanRequest(model=MOE, hardware='h200x1', micro_batch=4, checkpoint_layers=40,
                                backend='unsloth_split_lora', lora_rank=16))
    scaling = eight.options[0]['est_samples_per_s'] / (8 * one.est_samples_per_s)
    assert 0.9 < scaling < 1.0
    assert eight.est_samples_per_s == pytest.approx(8 * one.est_samples_per_s * scaling, rel=1e-6)


def test_refusals_hold_for_moe_on_several_gpus(replicas_allowed):
    qlora = plan('h200x8', '--quant', '4bit')
    assert qlora.verdict == 'refused' and qlora.rule == 'qlora-moe'
    zero3 = plan('h200x8', '--backend', 'deepspeed_zero3')
    assert zero3.verdict == 'refused' and zero3.rule == 'zero3-moe'


def test_moe_full_sft_on_several_gpus_is_megatron_and_zero2_only_by_name():
    """Full SFT of the MoE on 8 x H200: Megatron's expert-parallel full SFT, priced from its own MoE run (the depth
    cut it ran at said), never faster than the LoRA the same GPUs train; DeepSpeed ZeRO-2 plans only when named, with
    the warning citing the failures upstream reported, and no number (it never ran on a MoE)."""
    p = make_plan(PlanRequest(model=MOE, hardware='h200x8', tuner='full', samples_per_epoch=10000, search=SEARCHABLE))
    assert p.backend == 'megatron_ep_full' and p.ep == 8
    assert p.est_measured and 'megatron-h100-full' in p.est_source and 'cut to 3 layers' in p.est_basis
    lora = make_plan(PlanRequest(model=MOE, hardware='h200x8', samples_per_epoch=10000, search=SEARCHABLE))
    assert p.est_hours_per_epoch >= lora.est_hours_per_epoch
    assert all(o['backend'] != 'deepspeed_zero2' for o in p.options + p.alternatives)
    named = make_plan(PlanRequest(model=MOE, hardware='h200x8', tuner='full', backend='deepspeed_zero2'))
    assert named.backend == 'deepspeed_zero2' and 'ms-swift#6473' in named.reasons[0]
    assert not named.est_measured


def test_every_moe_figure_comes_from_a_moe_run():
    """Across backends, tuners and GPUs, a MoE plan's speed either rests on a MoE measurement or is plainly none."""
    for hardware in ('h200x1', 'h200x8', 'h100x1'):
        for tuner in ('lora', 'full', 'selective'):
            for backend in ('auto', 'ddp', 'deepspeed_zero2', 'megatron_ep_lora', 'unsloth_split_lora'):
                p = make_plan(PlanRequest(model=MOE, hardware=hardware, tuner=tuner, backend=backend,
                                          search=SEARCHABLE))
                if p.verdict == 'refused':
                    continue
                for estimate in [p.__dict__] + p.options + p.alternatives:
                    basis = estimate.get('est_basis', '')
                    if estimate.get('est_measured'):
                        assert 'MoE' in basis and 'Qwen3-VL 2B' not in basis, (hardware, tuner, backend, basis)
                    else:
                        assert estimate.get('est_tokens_per_s') is None and basis.startswith('no measurement')


def test_search_is_said_only_for_what_applies():
    """Megatron recomputes by its own setting and has no CPU offload: the search sentence names neither."""
    p = plan('h200x8', '--backend', 'megatron_ep_lora')
    said = next(r for r in p.reasons if r.startswith('Searched'))
    assert 'checkpointed layers' not in said and 'offload' not in said and 'micro-batch' in said
    assert speed.NO_MEASUREMENT == 'no measurement'


def test_a_megatron_micro_batch_divides_the_global_batch():
    """megatron sft needs global batch = micro-batch x data-parallel size x steps: on 16 GPUs the default global batch
    of 16 takes micro-batch 1 only, so the search does not choose 2 there (it does on 8)."""
    eight = plan('h200x8', '--backend', 'megatron_ep_lora')
    sixteen = plan('h200x8', '--backend', 'megatron_ep_lora', '--nodes', '2')
    assert eight.micro_batch == 2 and sixteen.micro_batch == 1 and sixteen.verdict == 'fits'
    assert sixteen.command and sixteen.command[sixteen.command.index('--micro_batch_size') + 1] == '1'


def test_alternatives_are_searched_like_the_plan():
    """Full SFT of the MoE on one H200 does not fit; its LoRA alternatives come with the settings the search would
    choose for them (not the cautious micro-batch 1) and reach their commands."""
    p = plan('h200x1', '--tuner', 'full')
    assert p.verdict == 'does_not_fit'
    lora = next(a for a in p.alternatives if a['backend'] == 'unsloth_split_lora')
    assert lora['micro_batch'] == 4 and lora['checkpoint_layers'] is not None
    command = p.alternative['command'] if p.alternative['backend'] == 'unsloth_split_lora' else []
    if command:
        assert f'SWIFT_VORA_CHECKPOINT_LAYERS={lora["checkpoint_layers"]}' in command


@pytest.mark.parametrize('argv', [['--hardware', 'h200x1'], ['--hardware', 'h200x1', '--tuner', 'full'],
                                  ['--hardware', '3060x4', '--model', DENSE_2B], ['--hardware', 'h200x8']])
def test_reasons_speak_of_the_run_and_provenance_is_under_explain(capsys, argv):
    """The default text says what fits and what limits it; where each number comes from (result files, the
    derivations) is printed with --explain and is always in the JSON."""
    from swift_vora.cli import main
    model = [] if '--model' in argv else ['--model', MOE]
    main(['plan', *model, *argv, '--samples', '10000'])
    text = capsys.readouterr().out
    assert 'benchmarks/results' not in text and 'efficiency 0.' not in text and '(--explain' in text
    main(['plan', *model, *argv, '--samples', '10000', '--explain'])
    explained = capsys.readouterr().out
    assert 'where the numbers come from' in explained and 'benchmarks/results' in explained
    p = plan_from_argv([*model, *argv])
    assert p.explain and all(len(r) < 700 for r in p.reasons)


@pytest.mark.parametrize('argv', [['--model', MOE, '--hardware', 'h200x1'],
                                  ['--model', DENSE_2B, '--hardware', '3060x4'],
                                  ['--model', MOE, '--hardware', 'h200x8', '--tuner', 'full'],
                                  ['--model', 'Qwen/Qwen3-VL-8B-Instruct', '--hardware', 'h200x1', '--fp8',
                                   'frozen_base', '--seq-len', '512', '--as-given']])
def test_the_breakdown_adds_up_to_the_peak_or_says_where_the_peak_is(argv):
    """The breakdown's items add up to the GPU peak (rounded to match, memory freed within the step as a negative
    item); where the peak is another phase (an 8B loading in bf16 before its FP8 conversion), the text says so."""
    from swift_vora.cli.plan import render_plan
    p = plan_from_argv(argv)
    total = round(sum(p.breakdown.values()), 2)
    peak_phase = max(p.phases, key=lambda k: p.phases[k]['gpu_gib'])
    text = render_plan(p)
    assert 'total' in text and f'{total:.2f}' in text
    if peak_phase == 'load':
        assert total < p.gpu_peak_gib and f'the GPU peak, {p.gpu_peak_gib:.2f} GiB, is at load' in text
    else:
        assert total == p.gpu_peak_gib and 'the GPU peak,' not in text
