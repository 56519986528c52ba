"""The Megatron GPU scripts as far as a CPU allows: the one-GPU (EP=1) and two-GPU (EP=2) launches the scripts
build, parsed by Megatron-SWIFT's own argument class; megatron_ep.sh's refusal on too few GPUs; and
megatron_report.py's checks on a run's files (fake small weights: a changed router or a flat loss must fail)."""
import ast
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from swift_vora.backends import LaunchUsageError
from swift_vora.backends.launch import build_launch
from swift_vora.backends.megatron import MEGATRON_CALLBACKS
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200X8 = os.path.join(REPO, 'recipes', 'h200x8.yaml')
MOE_30B_VL = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_vl_moe_30b_a3b.json')
EP_SCRIPT = os.path.join(REPO, 'scripts', 'gpu', 'megatron_ep.sh')
REPORT = os.path.join(REPO, 'scripts', 'gpu', 'megatron_report.py')
NCCL = ('NCCL_NVLS_ENABLE=0', 'TORCH_SYMM_MEM_DISABLE_MULTICAST=1', 'NVSHMEM_DISABLE_NVLS=1')


def flag(argv, name):
    return argv[argv.index(name) + 1]


def one_gpu_launch(*extra):
    """What scripts/gpu/megatron_smoke.sh asks for: the h200x8 recipe on one H200, EP 1."""
    from megatron_args import H200X8_AS_MEGATRON_LORA  # as the script: Megatron's LoRA by name, then EP 1
    recipe = load_recipe(H200X8, [*H200X8_AS_MEGATRON_LORA, f'model.path={MOE_30B_VL}', 'model.type=qwen3_vl_moe',
                                  'hardware=h200x1',
                                  'host_ram_gib=128', 'megatron.ep=1', 'megatron.tp=1', 'megatron.global_batch=2',
                                  'train.max_steps=8', 'train.save_steps=8', 'train.logging_steps=1', *extra])
    plan = plan_recipe(recipe)
    assert plan.verdict == 'fits', plan.reasons
    return build_launch(plan, recipe, environ={})


def test_one_gpu_override_gives_ep1_with_fused_attention():
    launch = one_gpu_launch()
    argv = launch.argv
    assert launch.env['NPROC_PER_NODE'] == '1'
    assert flag(argv, '--expert_model_parallel_size') == '1' and flag(argv, '--tensor_model_parallel_size') == '1'
    assert '--sequence_parallel' not in argv
    # no flash-attn for torch 2.11: flash would switch TE's fused and unfused attention off
    assert flag(argv, '--attention_backend') == 'fused'
    assert flag(argv, '--train_iters') == '8' and flag(argv, '--save_steps') == '8'


def test_megatron_callbacks_name_the_guards_that_run_there():
    with pytest.raises(LaunchUsageError, match='vora_coverage.*megatron sft'):
        one_gpu_launch('guards.callbacks=[vora_coverage]')
    argv = one_gpu_launch('guards.callbacks=[tensorboard]').argv
    start = argv.index('--callbacks') + 1
    assert argv[start:start + 6] == ['vora_fingerprint', 'vora_memory', 'vora_lora_update', 'vora_epoch_prefetch',
                                     'vora_coalesced_optimizer', 'tensorboard']


def test_megatron_callback_names_match_the_installed_ms_swift():
    spec = importlib.util.find_spec('swift')
    path = os.path.join(spec.submodule_search_locations[0], 'megatron', 'callbacks', 'mapping.py')
    tree = ast.parse(open(path).read())
    names = [k.value for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys]
    assert sorted(names) == sorted(MEGATRON_CALLBACKS)


def fake_bin(tmp_path, gpus):
    """nvidia-smi listing `gpus` GPUs, and swift-vora running this checkout."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    smi = bin_dir / 'nvidia-smi'
    smi.write_text('#!/bin/sh\n' + ''.join(f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i})"\n' for i in range(gpus)))
    sv = bin_dir / 'swift-vora'
    sv.write_text(f'#!/bin/sh\nexec {sys.executable} -m swift_vora "$@"\n')
    smi.chmod(0o755)
    sv.chmod(0o755)
    return str(bin_dir)


def run_ep(tmp_path, gpus, **env):
    work = tmp_path / 'work'
    environ = dict(os.environ, PATH=fake_bin(tmp_path, gpus) + os.pathsep + os.environ['PATH'], PY=sys.executable,
                   PYTHONPATH=REPO, MODEL=MOE_30B_VL, DRY_RUN='1', **env)
    environ.pop('OUT', None)
    proc = subprocess.run(['bash', EP_SCRIPT, str(work)], env=environ, capture_output=True, text=True, timeout=180)
    return proc, work


def test_ep2_refuses_on_one_gpu_before_doing_anything(tmp_path):
    proc, work = run_ep(tmp_path, gpus=1)
    assert proc.returncode == 4
    assert 'refused' in proc.stderr and 'EP=2 needs 2 GPUs' in proc.stderr
    assert not work.exists()


def test_ep2_launch_on_two_gpus(tmp_path, megatron_parser):
    proc, work = run_ep(tmp_path, gpus=2)
    assert proc.returncode == 0, proc.stderr
    launch_line = next(line for line in proc.stdout.splitlines() if line.startswith('launch:'))
    assert all(v in launch_line for v in NCCL), launch_line
    d = json.loads((work / 'logs' / '2-plan.json').read_text())
    assert d['plan']['backend'] == 'megatron_ep_lora' and d['plan']['num_gpus'] == 2
    assert d['launch']['env']['NPROC_PER_NODE'] == '2'
    argv = d['launch']['argv'][2:]
    values = megatron_parser([argv])[0]['values']
    assert values['expert_model_parallel_size'] == 2 and values['tensor_model_parallel_size'] == 1
    assert values['attention_backend'] == 'fused' and values['global_batch_size'] == 4
    assert values['target_modules'] == ['all-linear'] and values['moe_grouped_gemm'] is True


@pytest.fixture(scope='module')
def megatron_parser():
    for name in ('megatron', 'mcore_bridge'):  # test dependencies (pyproject [test])
        assert importlib.util.find_spec(name) is not None, f'{name} is not installed (pip install -e .[test])'
    sys.path.insert(0, os.path.join(REPO, 'tests'))
    from megatron_args import validate_argv
    return validate_argv


# ---- megatron_report.py ----------------------------------------------------------------------------------------

def write_run(tmp_path, losses, router_delta=0.0, expert_delta=0.1, attention_delta=0.1):
    import torch
    from safetensors.torch import save_file
    layer = 'model.language_model.layers.0.'
    router, experts = layer + 'mlp.gate.weight', layer + 'mlp.experts.gate_up_proj'
    attention = layer + 'self_attn.q_proj.weight'
    base = {router: torch.ones(4, 8), experts: torch.ones(4, 8, 16), attention: torch.ones(8, 8),
            'model.visual.blocks.0.attn.qkv.weight': torch.ones(8, 8)}
    merged = dict(base)
    merged[router] = base[router] + router_delta
    merged[experts] = base[experts] + expert_delta
    merged[attention] = base[attention] + attention_delta
    for name, tensors in (('base', base), ('run/v0/checkpoint-8-merged', merged)):
        os.makedirs(tmp_path / name, exist_ok=True)
        save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(tmp_path / name / 'model.safetensors'))
    os.makedirs(tmp_path / 'run/v0/checkpoint-8', exist_ok=True)
    with open(tmp_path / 'run/v0/logging.jsonl', 'w') as f:
        for i, loss in enumerate(losses, 1):
            # Megatron-SWIFT's running mean: a 20 s first step, then 0.5 s per step
            f.write(json.dumps({'loss': loss, 'iteration': f'{i}/8', 'memory(GiB)': 10.0 + i,
                                'train_speed(s/it)': (20.0 + 0.5 * (i - 1)) / i}) + '\n')
    (tmp_path / 'plan.json').write_text(json.dumps({'plan': {'backend': 'megatron_ep_lora', 'gpu_peak_gib': 9.8,
                                                             'phases': {'steady': {'gpu_reserved_gib': 8.0}}}}))
    with open(tmp_path / 'encode.jsonl', 'w') as f:
        for _ in range(3):
            f.write(json.dumps({'mode': 'train', 'total_tokens': 1000}) + '\n')


def report(tmp_path):
    out = tmp_path / 'result.json'
    ckpt = tmp_path / 'run' / 'v0' / 'checkpoint-8'
    proc = subprocess.run([sys.executable, REPORT, '--base', str(tmp_path / 'base'), '--checkpoint', str(ckpt),
                           '--merged', f'{ckpt}-merged',
                           '--plan', str(tmp_path / 'plan.json'), '--encode-log', str(tmp_path / 'encode.jsonl'),
                           '--gpus', '1', '--ep', '1', '--tp', '1', '--global-batch', '2', '--skip-load', '--out',
                           str(out)], capture_output=True, text=True, timeout=120)
    return proc, json.loads(out.read_text())


def test_report_of_a_good_run(tmp_path):
    write_run(tmp_path, [11.9, 11.5, 11.0, 10.2, 9.8, 9.1])
    proc, result = report(tmp_path)
    assert proc.returncode == 0, proc.stderr
    for key in ('backend', 'gpus', 'ep', 'tp', 'steps', 'losses', 'expert_lora_tensors', 'router_trainable',
                'merged_loads', 'peak_reserved_gib', 'planned_peak_gib', 'tokens_per_s'):
        assert key in result
    assert result['steps'] == 6 and result['router_trainable'] is False and result['expert_lora_tensors'] == 1
    assert result['peak_reserved_gib'] == 16.0 and result['planned_peak_gib'] == 9.8
    # steps after the first two: 1000 tokens x global batch 2 / 0.5 s per step (the 20 s first step left out)
    assert result['seconds_per_step'] == 0.5 and result['tokens_per_s'] == 4000.0
    assert result['planned_reserved_gib'] == 8.0 and result['plan_error'] == 1.0  # 16 GiB reserved measured


@pytest.mark.parametrize('case, expected', [
    ('router', 'router tensors changed'), ('flat', 'loss did not fall'), ('short', 'logged steps'),
    ('nan', 'non-finite'), ('no_expert', 'no expert weight changed')])
def test_report_fails_what_a_user_must_not_get(tmp_path, case, expected):
    losses = {'flat': [10.0] * 6, 'short': [11.0, 10.0], 'nan': [11.0, float('nan'), 9.0, 8.0, 7.0]}.get(
        case, [11.0, 10.0, 9.0, 8.0, 7.0])
    write_run(tmp_path, losses, router_delta=0.5 if case == 'router' else 0.0,
              expert_delta=0.0 if case == 'no_expert' else 0.1)
    proc, result = report(tmp_path)
    assert proc.returncode == 1
    assert any(expected in f for f in result['failures']), result['failures']


def write_layouts(tmp_path, merged_fused_shape=None, expert_delta=0.1):
    """Call h of #31: the base saved per expert (hub layout), Megatron's merged export with one fused tensor per
    projection (transformers' layout, [E, 2I, H] and [E, H, I])."""
    import torch
    from safetensors.torch import save_file
    write_run(tmp_path, [11.0, 10.0, 9.0, 8.0, 7.0])
    layer, experts, inter, hidden = 'model.language_model.layers.0.', 3, 4, 6
    base = {layer + 'mlp.gate.weight': torch.ones(experts, hidden),
            layer + 'self_attn.q_proj.weight': torch.ones(hidden, hidden)}
    gen = torch.Generator().manual_seed(0)
    for e in range(experts):
        for proj, shape in (('gate_proj', (inter, hidden)), ('up_proj', (inter, hidden)),
                            ('down_proj', (hidden, inter))):
            base[f'{layer}mlp.experts.{e}.{proj}.weight'] = torch.randn(*shape, generator=gen)
    merged = {k: v for k, v in base.items() if '.experts.' not in k}
    merged[layer + 'self_attn.q_proj.weight'] = base[layer + 'self_attn.q_proj.weight'] + 0.1
    gate_up = torch.stack([torch.cat([base[f'{layer}mlp.experts.{e}.gate_proj.weight'],
                                      base[f'{layer}mlp.experts.{e}.up_proj.weight']]) for e in range(experts)])
    gate_up[1, inter:] += expert_delta  # expert 1's up projection moved by LoRA
    down = torch.stack([base[f'{layer}mlp.experts.{e}.down_proj.weight'] for e in range(experts)])
    if merged_fused_shape is not None:
        gate_up = gate_up.reshape(merged_fused_shape)
    merged[layer + 'mlp.experts.gate_up_proj'] = gate_up
    merged[layer + 'mlp.experts.down_proj'] = down
    for name, tensors in (('base', base), ('run/v0/checkpoint-8-merged', merged)):
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
                  str(tmp_path / name / 'model.safetensors'))


def test_report_compares_a_fused_merged_export_with_a_per_expert_base_expert_by_expert(tmp_path):
    """#31 call h failed a good run with "6144 base tensors missing" and "no expert weight changed": the merged
    export fuses the experts the base holds one by one. Read in one layout, exactly the moved expert counts."""
    write_layouts(tmp_path)
    proc, result = report(tmp_path)
    assert proc.returncode == 0, (proc.stderr, result['failures'])
    assert result['weights_changed'] == {'experts': 1, 'attention': 1, 'router': 0}
    assert result['weights_total'] == {'experts': 9, 'attention': 1, 'router': 1}

    write_layouts(tmp_path, expert_delta=0.0)  # the same layouts, no expert moved: still caught
    proc, result = report(tmp_path)
    assert proc.returncode == 1 and any('no expert weight changed' in f for f in result['failures'])


def test_report_refuses_a_fused_export_whose_shape_is_not_the_experts(tmp_path):
    write_layouts(tmp_path, merged_fused_shape=(3, 6, 8))  # [E, H, 2I]: transposed, not transformers' layout
    proc, result = report(tmp_path)
    assert proc.returncode == 1
    assert any('layout the comparison cannot read' in f and 'gate_up_proj [3, 6, 8]' in f for f in result['failures'])


def test_report_counts_experts_no_token_reached_without_failing(tmp_path):
    """The guard's own split (call h: 1877 of 8192 expert LoRA tensors of a random router's 8 layers got no token in
    the two counted steps): counted in the result, not a failure; unchanged tensors nothing explains still fail."""
    write_run(tmp_path, [11.0, 10.0, 9.0, 8.0, 7.0])
    guard = {'tensors': 10, 'updated': 7, 'expert_tensors': 8, 'expert_updated': 5, 'not_updated': [],
             'experts_not_reached': 3, 'steps_counted': 2}
    (tmp_path / 'run/v0/lora_update.json').write_text(json.dumps(guard))
    proc, result = report(tmp_path)
    assert proc.returncode == 0, (proc.stderr, result['failures'])
    assert result['lora_update']['experts_not_reached'] == 3
    (tmp_path / 'run/v0/lora_update.json').write_text(json.dumps({**guard, 'experts_not_reached': 2}))
    proc, result = report(tmp_path)
    assert proc.returncode == 1
    assert any(f.startswith('1 of 10 LoRA tensors did not update') and '2 more: experts no token reached' in f
               for f in result['failures']), result['failures']


def test_report_reads_the_lora_update_guard(tmp_path):
    write_run(tmp_path, [11.0, 10.0, 9.0, 8.0, 7.0])
    guard = {'tensors': 6, 'updated': 6, 'expert_tensors': 4, 'expert_updated': 4, 'not_updated': [],
             'steps_counted': 2}
    (tmp_path / 'run/v0/lora_update.json').write_text(json.dumps(guard))
    proc, result = report(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert result['lora_update']['checked'] is True and result['lora_update']['expert_updated'] == 4

    stale = 'decoder.layers.3.mlp.experts.linear_fc1.lora_A.default.weight7'
    (tmp_path / 'run/v0/lora_update.json').write_text(json.dumps({**guard, 'updated': 5, 'expert_updated': 3,
                                                                   'not_updated': [stale]}))
    proc, result = report(tmp_path)
    assert proc.returncode == 1
    assert any(f.startswith('1 of 6 LoRA tensors did not update') and stale in f for f in result['failures'])

    (tmp_path / 'run/v0/lora_update.json').write_text(json.dumps({'tensors_here': 6, 'note': 'not checked'}))
    proc, result = report(tmp_path)  # the run ended before the check: recorded, not a failure of its own
    assert proc.returncode == 0, proc.stderr
    assert result['lora_update']['checked'] is False and result['lora_update']['note'] == 'not checked'


# ---- megatron_report.py --full: a full-SFT run's checkpoint-N (the converted HF model) -------------------------------
def write_full_run(tmp_path, router_delta=0.1, vision_delta=0.0, expert_delta=0.1, guard=None):
    """write_run's base; checkpoint-N itself holds the trained model (no -merged copy)."""
    import torch
    from safetensors.torch import save_file
    write_run(tmp_path, [11.9, 11.5, 11.0, 10.2, 9.8, 9.1])
    from safetensors.torch import load_file
    base = load_file(str(tmp_path / 'base' / 'model.safetensors'))
    layer = 'model.language_model.layers.0.'
    saved = {k: v.float() for k, v in base.items()}
    saved[layer + 'mlp.gate.weight'] += router_delta
    saved[layer + 'mlp.experts.gate_up_proj'] += expert_delta
    saved[layer + 'self_attn.q_proj.weight'] += 0.1
    saved['model.visual.blocks.0.attn.qkv.weight'] += vision_delta
    save_file({k: v.to(torch.bfloat16) for k, v in saved.items()},
              str(tmp_path / 'run/v0/checkpoint-8' / 'model.safetensors'))
    if guard is not None:
        (tmp_path / 'run/v0/lora_update.json').write_text(json.dumps(guard))


def full_report(tmp_path, router='trained'):
    out = tmp_path / 'full.json'
    proc = subprocess.run([sys.executable, REPORT, '--full', '--router', router, '--base', str(tmp_path / 'base'),
                           '--checkpoint', str(tmp_path / 'run' / 'v0' / 'checkpoint-8'),
                           '--plan', str(tmp_path / 'plan.json'), '--encode-log', str(tmp_path / 'encode.jsonl'),
                           '--gpus', '1', '--ep', '1', '--tp', '1', '--global-batch', '2', '--skip-load', '--out',
                           str(out)], capture_output=True, text=True, timeout=120)
    return proc, json.loads(out.read_text())


def test_full_report_of_a_good_run(tmp_path):
    write_full_run(tmp_path, guard={'mode': 'full', 'tensors': 10, 'updated': 10, 'failures': []})
    proc, result = full_report(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert result['tuner'] == 'full' and result['router'] == 'trained' and result['router_trainable'] is True
    assert result['weights_changed'] == {'attention': 1, 'experts': 1, 'router': 1, 'vision': 0}
    assert result['expert_lora_tensors'] is None and result['lora_update']['mode'] == 'full'
    assert result['tokens_per_s'] == 4000.0 and result['failures'] == []


@pytest.mark.parametrize('kwargs, router, expected', [
    ({'vision_delta': 0.5}, 'trained', '1 vision-tower tensors changed'),
    ({'router_delta': 0.0}, 'trained', 'the router is trained'),
    ({'router_delta': 0.5}, 'frozen', 'router tensors changed: megatron.freeze_router froze them'),
    ({'expert_delta': 0.0}, 'trained', 'no experts weight changed'),
    ({'guard': {'mode': 'full', 'failures': ['no trainable attention tensor changed (of 4)']}}, 'trained',
     'lora_update.json (full SFT): no trainable attention tensor changed')])
def test_full_report_fails_what_a_user_must_not_get(tmp_path, kwargs, router, expected):
    write_full_run(tmp_path, **kwargs)
    proc, result = full_report(tmp_path, router)
    assert proc.returncode == 1
    assert any(expected in f for f in result['failures']), result['failures']


def test_a_depth_cut_with_no_attention_layer_still_loads_and_gives_logits(tmp_path):
    """A full-SFT run on the 35B-A3B shape cut to 3 layers (all Gated DeltaNet: the full-attention layer is every
    4th) wrote a good checkpoint-N, but the report's logits check ran with transformers' default cache, whose
    get_seq_length fails without an attention layer, and called the checkpoint unloadable. The check runs uncached."""
    from swift_vora.tiny_model import build_qwen3_5_moe
    build_qwen3_5_moe(str(tmp_path), shape='tiny', num_layers=3, dtype='float32')
    with open(tmp_path / 'config.json') as f:
        config = json.load(f)
    assert 'full_attention' not in config['text_config']['layer_types']
    spec = importlib.util.spec_from_file_location('megatron_report_for_load', REPORT)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.merged_loads(str(tmp_path)) is None
