"""Backend selection, refusals (exit 4), does-not-fit (exit 3) and the seed case, through the CLI."""
import json
import os

import pytest

from swift_vora.cli import main
from swift_vora.cli.plan import plan_from_argv
from swift_vora.plan import constants as C
from swift_vora.plan.hardware import custom, profile
from swift_vora.plan.request import Plan, PlanRequest
from swift_vora.plan.rules import MEGATRON_SUPPORTED_MODEL_TYPES
from swift_vora.plan.select import make_plan

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'configs')
SEED = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')


def cfg(name):
    return os.path.join(CONFIGS, f'{name}.json')


def planned(model, hardware, *flags):
    """The plan `swift-vora plan` prints, with its commands (the planner alone leaves them to the launch)."""
    return plan_from_argv(['--model', model, '--hardware', hardware, *flags])


def run_json(capsys, *argv):
    rc = main(['plan', *argv, '--json'])
    out = capsys.readouterr().out
    return rc, json.loads(out)


# ---- the seed case ------------------------------------------------------------------------------------------
def test_seed_full_sft_on_one_h200_does_not_fit(capsys):
    rc, p = run_json(capsys, '--model', SEED, '--hardware', 'h200x1', '--tuner', 'full')
    assert rc == 3 and p['verdict'] == 'does_not_fit'
    for key in ('backend', 'verdict', 'gpu_peak_gib', 'host_peak_gib', 'reasons', 'breakdown', 'command'):
        assert key in p
    # full SFT of a MoE goes to Megatron's expert parallelism (ZeRO-2 only when asked for by name)
    assert p['backend'] == 'megatron_ep_full' and p['gpu_peak_gib'] > 139.8
    assert p['est_measured'] and 'megatron-h100-full' in p['est_source']  # its own MoE run, not LoRA's
    text = ' '.join(p['reasons'])
    assert 'Too big on the GPU' in text and 'Fastest alternative that fits' in text
    assert p['alternative'] and p['alternative']['gpu_peak_gib'] <= 139.8
    assert all(a['backend'] != 'deepspeed_zero2' for a in p['alternatives'])
    # asked for by name, ZeRO-2: ~560 GB of model states (bf16 weights 70 + grads 70 + fp32 master 140 + Adam 280),
    # in the breakdown's GiB, and the warning that cites the upstream failures
    rc, z2 = run_json(capsys, '--model', SEED, '--hardware', 'h200x1', '--tuner', 'full', '--backend',
                      'deepspeed_zero2')
    assert rc == 3 and z2['reasons'][0].startswith('Warning: DeepSpeed ZeRO-2')
    assert 'ms-swift#6473' in z2['reasons'][0] and 'DeepSpeed #7156' in z2['reasons'][0]
    plan = make_plan(PlanRequest(model=SEED, hardware='h200x1', tuner='full', backend='deepspeed_zero2'))
    states = sum(v for k, v in plan.breakdown.items()
                 if k.startswith(('weights', 'gradients', 'optimizer'))) * C.GiB / C.GB
    assert 540 < states < 580, states
    text = ' '.join(z2['reasons'])
    for item in ('weights (bf16)', 'optimizer states (fp32 master + Adam m, v, partitioned)'):
        assert f'{item} {plan.breakdown[item]:.2f}' in text  # the breakdown's own name and number
    # ZeRO-2 offload: ~420 GB of host RAM for the fp32 master + Adam states against the 276 GB container limit
    assert 'CPU offload' in text and '276 GB' in text and 'SIGKILL' in text
    offload = make_plan(PlanRequest(model=SEED, hardware='h200x1', tuner='full', backend='deepspeed_zero2',
                                    offload='cpu'))
    opt_gb = offload.host_breakdown['offloaded optimizer states (fp32 master + Adam m, v)'] * C.GiB / C.GB
    assert 400 < opt_gb < 440, opt_gb
    assert offload.verdict == 'does_not_fit' and offload.host_peak_gib > offload.host_limit_gib
    assert f'{opt_gb:,.0f} GB' in text
    assert z2['est_tokens_per_s'] is None and 'no measurement' in z2['est_basis']


def test_seed_lora_on_one_h200_fits(capsys):
    rc, p = run_json(capsys, '--model', SEED, '--hardware', 'h200x1', '--tuner', 'lora', '--as-given')
    assert rc == 0 and p['verdict'] == 'fits' and p['backend'] == 'unsloth_split_lora'
    peak_gb = p['gpu_peak_gib'] * C.GiB / C.GB
    # seed analysis: ~63-74 GB; the planner adds expert LoRA states (r=8) and a 6.6k-token video sample
    assert 63 < peak_gb < 90, peak_gb
    weights_gb = p['breakdown']['weights (frozen base, bf16)'] * C.GiB / C.GB
    assert 69 < weights_gb < 71.5
    assert p['command'] and any('unsloth' in a for a in p['command'])


def test_contract_json_keys_and_phases(capsys):
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--hardware', 'h200x1')
    assert rc == 0
    assert set(p['phases']) == {'load', 'first_step', 'steady'}
    assert p['phases']['load']['gpu_gib'] <= p['phases']['steady']['gpu_gib']
    assert p['predicted'] is True
    assert abs(sum(p['breakdown'].values()) - p['gpu_peak_gib']) < 0.05
    assert isinstance(p['command'], list) and any(a.endswith('swift') for a in p['command'])


# ---- automatic backend --------------------------------------------------------------------------------------
def test_auto_dense_is_zero3_even_on_one_gpu():
    p = planned(cfg('qwen3_vl_2b'), 'h200x1')
    assert p.backend == 'deepspeed_zero3' and p.verdict == 'fits'
    assert '--deepspeed' in p.command and any('zero3' in a for a in p.command)


def test_auto_moe_several_gpus_by_hours_and_megatron_ep_dividing_both():
    # one replica fits one H200: a replica per GPU is the fewest hours, Megatron EP 8 listed beside it
    p = planned(SEED, 'h200x8')
    assert p.backend == 'unsloth_split_lora' and p.verdict == 'fits'
    assert any(o['backend'] == 'megatron_ep_lora' and o.get('ep') == 8 for o in p.options), p.options
    mg = planned(SEED, 'h200x8', '--backend', 'megatron_ep_lora')
    assert mg.ep == 8 and mg.command[mg.command.index('--expert_model_parallel_size') + 1] == '8'
    # a replica does not fit a 24 GB GPU: the experts are split; 3 GPUs, 256 experts -> EP 1
    p3 = make_plan(PlanRequest(model=SEED, hardware='3090x3', backend='megatron_ep_lora'))
    assert p3.ep == 1
    p6 = make_plan(PlanRequest(model=cfg('tiny_qwen3_vl_moe'), backend='megatron_ep_lora'),
                   hardware=custom(6, 24, 128))
    assert p6.ep == 2  # gcd(8 experts, 6 GPUs)


def test_megatron_supported_list_matches_installed_mcore_bridge():
    """For the model types the planner can count, the list agrees with the installed mcore-bridge (source read,
    not imported)."""
    import importlib.util
    import re

    from swift_vora.plan.model_spec import SUPPORTED_MODEL_TYPES
    found = importlib.util.find_spec('mcore_bridge')
    assert found is not None and found.submodule_search_locations, \
        'mcore-bridge is not installed (pip install -e .[test])'
    root = os.path.join(list(found.submodule_search_locations)[0], 'model')
    registered = set()
    for dirpath, _, files in os.walk(root):
        for fn in files:
            if fn.endswith('.py'):
                src = open(os.path.join(dirpath, fn), encoding='utf-8').read()
                for block in re.findall(r'ModelMeta\(\s*[\w.]+,\s*\[([^\]]*)\]', src):
                    registered |= set(re.findall(r"'([a-z0-9_]+)'", block))
    assert registered, 'could not read the registrations'
    for t in SUPPORTED_MODEL_TYPES:
        assert (t in MEGATRON_SUPPORTED_MODEL_TYPES) == (t in registered), t


def test_auto_moe_not_supported_by_megatron_never_falls_back_to_zero2():
    """A MoE type mcore-bridge does not support: LoRA goes to a backend with a measured speed, full SFT is refused
    under auto -- DeepSpeed ZeRO-2 trains a MoE only when asked for by name."""
    assert 'mixtral' not in MEGATRON_SUPPORTED_MODEL_TYPES
    p = make_plan(PlanRequest(model=cfg('tiny_mixtral')), hardware=custom(2, 24, 64))
    assert p.backend in ('unsloth_split_lora', 'ddp') and p.verdict == 'fits' and p.est_measured
    full = make_plan(PlanRequest(model=cfg('tiny_mixtral'), tuner='full'), hardware=custom(2, 24, 64))
    assert full.verdict == 'refused' and full.rule == 'moe-full-auto'
    assert 'deepspeed_zero2' in full.alternative['suggestion']
    by_name = make_plan(PlanRequest(model=cfg('tiny_mixtral'), tuner='full', backend='deepspeed_zero2'),
                        hardware=custom(2, 24, 64))
    assert by_name.backend == 'deepspeed_zero2' and by_name.reasons[0].startswith('Warning')


# ---- refusals: exit 4, reason names the rule and the alternative --------------------------------------------
REFUSALS = [
    ('zero3-moe', [SEED, '--hardware', 'h200x8', '--backend', 'deepspeed_zero3'], 'megatron_ep_lora'),
    ('zero3-moe', [SEED, '--hardware', 'h200x1', '--backend', 'deepspeed_zero3', '--offload', 'cpu'],
     'unsloth_split_lora'),
    ('qlora-moe', [SEED, '--hardware', 'h200x1', '--quant', '4bit'], 'unsloth_split_lora'),
    ('megatron-model-type', [cfg('tiny_mixtral'), '--gpus', '2', '--gpu-mem-gib', '24', '--backend',
                             'megatron_ep_lora'], 'deepspeed_zero2'),
    ('unsloth-lora-only', [SEED, '--hardware', 'h200x1', '--backend', 'unsloth_split_lora', '--tuner', 'full'],
     'megatron_ep_full'),
    ('quant-needs-lora', [cfg('qwen3_vl_2b'), '--hardware', 'h200x1', '--quant', '4bit', '--tuner', 'full'],
     '--tuner lora'),
    ('offload-deepspeed-only', [SEED, '--hardware', 'h200x1', '--offload', 'cpu'], 'deepspeed_zero2 --offload cpu'),
    ('ep-divides', [SEED, '--hardware', '3090x3', '--ep', '2'], '--ep 1'),
    ('parallel-megatron-only', [cfg('qwen3_vl_2b'), '--hardware', 'h200x8', '--ep', '2'], 'megatron_ep_lora'),
    ('quant-megatron', [cfg('qwen3_vl_2b'), '--hardware', 'h200x8', '--backend', 'megatron_ep_lora', '--quant',
                        '4bit'], 'deepspeed_zero3'),
    ('ep-needs-moe', [cfg('qwen3_vl_2b'), '--hardware', 'h200x8', '--backend', 'megatron_ep_lora', '--ep', '2'],
     '--ep 1'),
    ('tp-divides', [SEED, '--hardware', 'h200x8', '--tp', '3'], '--tp 1'),
    ('megatron-full-only', [SEED, '--hardware', 'h200x8', '--backend', 'megatron_ep_full'],
     '--backend megatron_ep_lora'),
    ('megatron-lora-only', [SEED, '--hardware', 'h200x8', '--backend', 'megatron_ep_lora', '--tuner', 'full'],
     'megatron_ep_full'),
    ('parallel-megatron-only', [SEED, '--hardware', 'h200x8', '--tuner', 'full', '--backend', 'deepspeed_zero2',
                                '--ep', '8'], 'megatron_ep_full'),
    ('ep-divides', [SEED, '--hardware', 'h200x8', '--tuner', 'full', '--backend', 'megatron_ep_full', '--ep', '3'],
     '--ep 8'),
]


@pytest.mark.parametrize('rule,argv,alternative', REFUSALS, ids=[f'{r[0]}-{i}' for i, r in enumerate(REFUSALS)])
def test_refusals_exit_4(capsys, rule, argv, alternative):
    rc, p = run_json(capsys, '--model', *argv)
    assert rc == 4, p['reasons']
    assert p['verdict'] == 'refused' and p['rule'] == rule and p['command'] == []
    text = ' '.join(p['reasons'])
    assert f'rule {rule}' in text and 'Alternative' in text and alternative in text


def test_refusal_text_output(capsys):
    rc = main(['plan', '--model', SEED, '--hardware', 'h200x8', '--backend', 'deepspeed_zero3'])
    out = capsys.readouterr().out
    assert rc == 4 and 'REFUSED' in out and 'zero3-moe' in out


# ---- does not fit: exit 3, the numbers, the component, the cheapest alternative ------------------------------
def test_does_not_fit_names_component_and_alternative(capsys):
    # full SFT of the 30B-A3B MoE (the vision-language one: video_ora trains only those) on 4 x 12 GiB RTX 3060
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_moe_30b_a3b'), '--hardware', '3060x4', '--tuner', 'full')
    assert rc == 3 and p['verdict'] == 'does_not_fit'
    text = ' '.join(p['reasons'])
    assert 'Too big on the GPU' in text and 'experts' in text
    assert p['gpu_peak_gib'] > 11.76


def test_where_host_memory_is_the_limit_the_advice_is_fewer_processes_or_more_host_memory(capsys):
    # the 2B model on 4 x 3060 in a 20 GiB container: each GPU has room, the four processes do not fit the host
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--hardware', '3060x4', '--host-ram-gib', '20')
    assert rc == 3 and p['gpu_peak_gib'] < 11.76 < p['host_peak_gib']
    text = ' '.join(p['reasons'])
    assert 'host memory is the limit' in text and 'train on 2 of the 4 GPUs (recipe gpus: 2, plan --gpus 2)' in text
    assert 'No video budget fits' not in text and 'bigger or more GPUs' not in text
    # a shard is at most the whole checkpoint (the 2B model's 4.26 GB in bf16, not a 5 GB shard)
    assert any(k.startswith('safetensors shard being loaded (4 x 4.26 GB') for k in p['host_breakdown'])
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--hardware', '3060x4', '--host-ram-gib', '20',
                     '--gpus', '2')
    assert rc == 0, p['reasons']  # the advice, followed, fits


def test_does_not_fit_dense_full_suggests_something_that_fits(capsys):
    rc, p = run_json(capsys, '--model', cfg('qwen3_5_dense'), '--hardware', '3090x3', '--tuner', 'full')
    assert rc == 3
    alt = p['alternative']
    assert alt and alt['gpu_peak_gib'] <= alt['gpu_mem_gib']
    assert alt['tuner'] in ('selective', 'lora', 'full')
    assert 'Fastest alternative that fits' in ' '.join(p['reasons'])
    assert alt['command']


def test_host_ram_limit_is_checked():
    # LoRA fits the GPU, but ZeRO-3 offload of a dense 9 B model needs more host RAM than 8 GiB
    p = make_plan(PlanRequest(model=cfg('qwen3_5_dense'), backend='deepspeed_zero3', offload='cpu',
                              tuner='full'), hardware=custom(1, 80, 8))
    assert p.verdict == 'does_not_fit' and p.host_peak_gib > 8
    assert any('host RAM' in r for r in p.reasons)


def test_text_output_is_readable(capsys):
    rc = main(['plan', '--model', SEED, '--hardware', 'h200x1', '--tuner', 'full'])
    out = capsys.readouterr().out
    assert rc == 3
    for s in ('backend  : megatron_ep_full', 'verdict  : DOES NOT FIT', 'GPU peak', 'host peak', 'per-GPU breakdown',
              'reasons', 'predicted', 'speed    : ', 'what fits instead'):
        assert s in out
    # a backend no run measured on this kind of model says so, with no number
    main(['plan', '--model', SEED, '--hardware', 'h200x8', '--tuner', 'full', '--backend', 'deepspeed_zero2'])
    assert 'speed    : no measurement' in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    assert main(['plan', '--model', SEED, '--hardware', 'nope']) == 2
    assert main(['plan', '--model', '/nonexistent/dir']) == 2
    assert main(['plan', '--model', SEED, '--hardware', 'h200x1', '--seq-len', '100', '--fps', '1']) == 2
    capsys.readouterr()


def test_custom_hardware_and_seq_len(capsys):
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--gpus', '1', '--gpu-mem-gib', '24',
                     '--host-ram-gib', '64', '--seq-len', '4096')
    assert rc == 0 and p['hardware']['source'] == 'custom' and p['tokens']['total_tokens'] == 4096
    assert not any(k.startswith('activations: vision') for k in p['breakdown'])


def test_video_budget_changes_tokens(capsys):
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--hardware', 'h200x1', '--fps', '1', '--max-frames',
                     '32', '--frame-tokens', '100', '--clip-seconds', '20')
    assert p['tokens']['frames'] == 20 and p['tokens']['vision_tokens'] == 10 * 100


def test_profiles_gib():
    assert profile('h200x1').gpu_mem_gib == pytest.approx(139.8)
    assert profile('h200x1').host_ram_gib == pytest.approx(276e9 / 2 ** 30)
    assert profile('3060x4').num_gpus == 4 and profile('3090x3').num_gpus == 3
    assert profile('h200x8').world == 8


def test_plan_command_is_what_train_runs(tmp_path):
    """One argv builder: a plan's `command` is the backends' launch for the recipe it was planned from; the planner
    itself builds none."""
    from swift_vora.backends.common import SELECTIVE_REGEX
    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    from swift_vora.cli.compose import launch_plan
    assert make_plan(PlanRequest(model=SEED, hardware='h200x8')).command == []
    recipe = load_recipe(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'recipes',
                                      'h200x8.yaml'), [f'model.path={SEED}'])
    plan, launch = launch_plan(plan_recipe(recipe), recipe, environ={})
    assert plan.command == launch.command() == build_launch(plan, recipe, environ={}).command()
    for p in (planned(SEED, 'h200x8'), planned(SEED, 'h200x1'), planned(cfg('qwen3_vl_2b'), 'h200x1', '--tuner',
                                                                         'selective')):
        # no qwen_vl_utils globals: the video_ora template applies the budget itself (SWIFT_VORA_* switches)
        assert not any(a.startswith(('FPS=', 'FPS_MAX_FRAMES=', 'VIDEO_MAX_TOKEN_NUM=')) for a in p.command)
    argv = planned(SEED, 'h200x8', '--backend', 'megatron_ep_lora').command
    assert argv[:1] == ['env'] and 'sft' in argv and argv[argv.index('--expert_model_parallel_size') + 1] == '8'
    (tmp_path / 'config.json').write_text(open(SEED).read())
    argv = planned(str(tmp_path / 'config.json'), 'h200x8', '--backend', 'megatron_ep_lora').command
    assert argv[argv.index('--model') + 1] == str(tmp_path)  # a planned config.json trains its directory
    argv = planned(SEED, 'h200x1').command
    assert any(a.endswith('unsloth_runner') for a in argv)
    argv = planned(cfg('qwen3_vl_2b'), 'h200x1', '--tuner', 'selective').command
    # the selective regex unfreezes what the planner counts: attention and the shared expert with its gate
    assert argv[argv.index('--trainable_parameters_regex') + 1] == SELECTIVE_REGEX
    assert 'shared_expert_gate' in SELECTIVE_REGEX
    assert planned(SEED, 'h200x1', '--quant', '4bit').command == []  # refused: nothing to run


def test_the_budget_travels_as_the_cap():
    """`plan --window 8` at the default 64-frame cap: the clip gets 16 frames, and the command still caps at 64 (a
    16-frame cap would train longer clips with a quarter of their frames)."""
    plan = planned(cfg('qwen3_vl_2b'), 'h200x1', '--window', '8')
    assert plan.tokens['frames'] == 16
    assert 'SWIFT_VORA_MAX_FRAMES=64' in plan.command and 'SWIFT_VORA_WINDOW=8' in plan.command
    plan = planned(cfg('qwen3_vl_2b'), 'h200x1', '--window', '8', '--max-frames', '12', '--min-frames', '6')
    assert plan.tokens['frames'] == 12
    assert 'SWIFT_VORA_MAX_FRAMES=12' in plan.command and 'SWIFT_VORA_MIN_FRAMES=6' in plan.command


def test_plan_dataclass_roundtrip():
    p = make_plan(PlanRequest(model=cfg('tiny_qwen3_5_moe'), hardware='h200x1'))
    assert isinstance(p, Plan) and p.exit_code == 0
    d = p.to_dict()
    json.dumps(d)
    assert d['model']['kind'] == 'moe' and d['model']['linear_attention_layers'] == 3


def test_dataset_packing_is_planned_at_the_full_row():
    """`--pack-length N` (swift sft --packing, recipe train.packing=dataset): a row holds up to N tokens of several
    samples, and the plan sizes activations for that row, not for one sample."""
    hw = profile('3090x3')
    plain = make_plan(PlanRequest(model=cfg('qwen3_vl_2b'), hardware=hw))
    per_sample = plain.tokens['total_tokens']
    packed = planned(cfg('qwen3_vl_2b'), '3090x3', '--pack-length', str(3 * per_sample), '--as-given')
    ckpt = 'activations: layer checkpoints'
    assert packed.breakdown[ckpt] == pytest.approx(3 * plain.breakdown[ckpt], rel=0.01)
    assert packed.gpu_peak_gib > plain.gpu_peak_gib
    assert any('dataset packing' in a and '3.00 samples' in a for a in packed.assumptions)
    assert '--packing' in packed.command and '--attn_impl' in packed.command
    assert packed.command[packed.command.index('--max_length') + 1] == str(3 * per_sample)
    assert packed.command[packed.command.index('--attn_impl') + 1] == 'vora_varlen'
    # a row shorter than one sample: the sample loses frames until it fits the row, as the template cuts it
    short = make_plan(PlanRequest(model=cfg('qwen3_vl_2b'), hardware=hw, pack_length=per_sample // 2))
    assert short.tokens['total_tokens'] <= per_sample // 2 and short.breakdown[ckpt] < plain.breakdown[ckpt]


def test_packing_that_cannot_fit_offers_shorter_rows():
    plan = planned(cfg('qwen3_vl_2b'), '3090x3', '--pack-length', '65536')
    assert plan.verdict == 'does_not_fit'
    per_sample = plan.tokens['total_tokens']
    cheapest = next(r for r in plan.reasons if r.startswith('Fastest alternative'))
    assert f'packed rows of up to {2 * per_sample} tokens' in cheapest
    alt = plan.alternatives[0]
    assert alt['pack_length'] == 2 * per_sample
    command = plan.alternative['command']
    assert command[command.index('--max_length') + 1] == str(2 * per_sample) and '--packing' in command


def test_compiled_layers_are_planned_where_they_are_applied(capsys):
    """`--compile layers` (recipe train.compile) shrinks the plan on the ddp backend, where swift-vora compiles the
    layers; under DeepSpeed they run uncompiled, so the plan does not change. A recipe's train.compile reaches the
    planner, and the plan's command carries it."""
    from swift_vora.backends.planning import plan_request
    from swift_vora.backends.recipe import recipe_from_dict
    argv = ['--model', cfg('qwen3_vl_2b'), '--hardware', 'h200x1', '--no-gradient-checkpointing', '--as-given']
    peaks = {}
    for backend in ('ddp', 'deepspeed_zero3'):
        for compiled in ('off', 'layers'):
            rc, out = run_json(capsys, *argv, '--backend', backend, '--compile', compiled)
            assert rc == 0
            peaks[backend, compiled] = out['gpu_peak_gib']
            if backend == 'ddp' and compiled == 'layers':
                assert 'SWIFT_VORA_COMPILE=layers' in out['command']
                assert any('compiled' in a for a in out['assumptions'])
    assert peaks['ddp', 'layers'] < 0.9 * peaks['ddp', 'off']
    assert peaks['deepspeed_zero3', 'layers'] == peaks['deepspeed_zero3', 'off']
    recipe = recipe_from_dict({'model': {'path': cfg('qwen3_vl_2b')}, 'data': {'dataset': 'a.jsonl'},
                               'hardware': 'h200x1', 'train': {'backend': 'ddp', 'compile': 'layers'}},
                              where='<test>')
    assert plan_request(recipe).compile == 'layers'
    rc = main(['plan', *argv, '--compile', 'everything'])
    assert rc == 2


def test_memory_to_spare_offers_training_without_checkpointing():
    """A compiled, checkpointed ddp plan on a big GPU names what no checkpointing would cost (at its micro-batch and
    at 4) when that fits; on a 24 GB card, where it does not, it says nothing; nor does an uncompiled plan (no
    measurement behind the claim)."""
    request = PlanRequest(model=cfg('qwen3_vl_2b'), hardware='h200x1', backend='ddp', compile='layers')
    plan = make_plan(request)
    spare = [r for r in plan.reasons if r.startswith('Memory to spare')]
    assert len(spare) == 1 and 'micro-batch 1:' in spare[0] and 'micro-batch 4:' in spare[0]
    no_gc = make_plan(PlanRequest(model=cfg('qwen3_vl_2b'), hardware='h200x1', backend='ddp', compile='layers',
                                  gradient_checkpointing=False, micro_batch=4))
    assert f'micro-batch 4: {no_gc.gpu_peak_gib:.1f} GiB' in spare[0]
    for other in (PlanRequest(model=cfg('qwen3_vl_2b'), hardware='3090x3', backend='ddp', compile='layers'),
                  PlanRequest(model=cfg('qwen3_vl_2b'), hardware='h200x1', backend='ddp'),
                  PlanRequest(model=cfg('qwen3_vl_2b'), hardware='h200x1', backend='ddp', compile='layers',
                              gradient_checkpointing=False)):
        assert not any(r.startswith('Memory to spare') for r in make_plan(other).reasons)


def test_megatron_full_sft_asked_by_name_splits_the_experts_over_every_gpu(capsys):
    """megatron_ep_full takes the expert-parallel size the planner picks for Megatron (EP divides the experts and the
    GPUs), and plans its model states per GPU: the routed experts' optimizer states unsharded at EP 8."""
    rc, p = run_json(capsys, '--model', SEED, '--hardware', 'h200x8', '--tuner', 'full', '--backend',
                     'megatron_ep_full')
    assert rc == 0 and p['verdict'] == 'fits' and (p['ep'], p['tp']) == (8, 1)
    assert p['breakdown']['distributed optimizer: Adam m, v fp32 (sharded over DP)'] > 20
    assert any('optimizer states sharded over 8 data-parallel rank(s) for the dense parts and 1 for the routed '
               'experts' in a for a in p['assumptions'])


def test_a_speed_for_a_gpu_of_no_known_rate_says_it_is_an_upper_bound(capsys):
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--gpus', '3', '--gpu-mem-gib', '23.69',
                     '--host-ram-gib', '128')
    assert rc == 0 and 'upper bound: no rate is known for this GPU' in ' '.join(p['reasons'])
    assert main(['plan', '--model', cfg('qwen3_vl_2b'), '--gpus', '3', '--gpu-mem-gib', '23.69', '--host-ram-gib',
                 '128']) == 0
    assert "[estimated; upper bound: no rate is known for this GPU, an H200's is assumed" in capsys.readouterr().out
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--hardware', '3090x3')
    assert rc == 0 and 'upper bound' not in ' '.join(p['reasons'])  # an RTX 3090's rate is known


def test_a_sample_over_max_length_is_planned_as_the_template_cuts_it(capsys):
    rc, p = run_json(capsys, '--model', cfg('qwen3_vl_2b'), '--hardware', '3060x4', '--pack-length', '4096')
    assert rc == 0 and p['tokens']['total_tokens'] <= 4096 and p['tokens']['frames'] == 30
    assert any('max_length 4096: a 8576-token sample (64 frames) loses frames until it fits' in r for r in p['reasons'])
    assert main(['plan', '--model', cfg('qwen3_vl_2b'), '--hardware', '3060x4', '--pack-length', '100']) == 2
    assert 'max_length 100 holds no sample: even 2 frames make' in capsys.readouterr().err


def test_a_megatron_global_batch_the_gpus_do_not_divide_is_refused_with_the_nearest_and_can_be_set(capsys):
    argv = ['--model', cfg('qwen3_vl_2b'), '--hardware', '3090x3', '--backend', 'megatron_ep_lora']
    rc, p = run_json(capsys, *argv)
    assert rc == 4 and any('megatron.global_batch 16 must be a multiple of micro_batch 1 x data-parallel size 3: '
                           'give megatron.global_batch=18 (or 15)' in r for r in p['reasons']), p['reasons']
    rc, p = run_json(capsys, *argv, '--global-batch', '18')
    assert rc == 0 and '--global_batch_size' in p['command'] and '18' in p['command']
