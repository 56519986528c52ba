"""Unsloth split LoRA (one GPU, MoE): targets from the model's description, router exclusion on a live model, the
launch, and the whole runner loop on CPU with transformers + PEFT standing in for Unsloth's loader."""
import json
import os
import subprocess
import sys

import pytest

from swift_vora.backends import LaunchUsageError
from swift_vora.backends.launch import build_launch
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe
from swift_vora.backends.unsloth import (
    EXPERT_PARAMETERS,
    RouterTargeted,
    UnslothRunConfig,
    assert_router_frozen,
    from_pretrained_kwargs,
    lora_targets,
    peft_kwargs,
)
from swift_vora.plan.model_source import load_model_spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
H200X1 = os.path.join(REPO, 'recipes', 'h200x1.yaml')


def cfg(name):
    return load_model_spec(os.path.join(CONFIGS, name))


def test_targets_reach_the_experts_and_never_the_router():
    t = lora_targets(cfg('qwen3_vl_moe_30b_a3b.json'))
    assert t['target_modules'] == ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']
    assert t['target_parameters'] == EXPERT_PARAMETERS
    t = lora_targets(cfg('qwen3_5_moe_35b_a3b.json'))  # hybrid attention: Gated DeltaNet projections too
    assert {'in_proj_qkv', 'in_proj_z', 'out_proj'} <= set(t['target_modules'])
    assert not {'in_proj_a', 'in_proj_b', 'gate', 'shared_expert_gate'} & set(t['target_modules'])
    assert lora_targets(cfg('qwen3_vl_2b.json'))['target_parameters'] == []  # dense: no expert tensors
    assert lora_targets(cfg('qwen3_vl_moe_30b_a3b.json'), 'attention')['target_parameters'] == []
    assert lora_targets(cfg('qwen3_vl_moe_30b_a3b.json'), ['q_proj', 'down_proj'])['target_parameters'] == [
        'mlp.experts.down_proj']
    for bad in (['q_proj', 'gate'], ['shared_expert_gate'], ['mlp.gate'], ['router']):
        with pytest.raises(LaunchUsageError):
            lora_targets(cfg('qwen3_5_moe_35b_a3b.json'), bad)


def test_unsloth_call_arguments_are_16bit_language_only():
    c = UnslothRunConfig(model_path='/m', model_type='qwen3_5_moe', dataset=['d'], output_dir='/o',
                         target_modules=['q_proj', 'gate_proj'])
    kw = from_pretrained_kwargs(c)
    assert kw['load_in_4bit'] is False and kw['load_in_8bit'] is False and kw['full_finetuning'] is False
    assert kw['use_gradient_checkpointing'] is True  # checkpoints on the GPU unless the plan says otherwise
    pk = peft_kwargs(c)
    assert pk['finetune_vision_layers'] is False and pk['finetune_mlp_modules'] is True
    assert pk['target_modules'] == ['q_proj', 'gate_proj'] and pk['lora_dropout'] == 0.0
    assert UnslothRunConfig.from_json(c.to_json()) == c


def test_launch_is_one_process_with_offline_unsloth_env():
    recipe = load_recipe(H200X1, [f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}'])
    plan = plan_recipe(recipe)
    assert plan.backend == 'unsloth_split_lora' and plan.verdict == 'fits'
    launch = build_launch(plan, recipe, environ={})
    assert launch.argv[1:3] == ['-m', 'swift_vora.backends.unsloth_runner']
    assert 'NPROC_PER_NODE' not in launch.env and launch.env['UNSLOTH_DISABLE_STATISTICS'] == '1'
    assert launch.env['HF_HUB_OFFLINE'] == '1'
    # the kernel caches are placed by the runner at run time (kernel_cache.py): no folder of this machine printed
    assert not {'UNSLOTH_COMPILE_LOCATION', 'TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR'} & set(launch.env)
    (path, text), = launch.files.items()
    run = UnslothRunConfig.from_json(text)
    assert launch.argv[3] == path and run.loader == 'unsloth' and run.is_moe and run.save_merged
    assert run.target_parameters == EXPERT_PARAMETERS and run.micro_batch * run.grad_accum == 16
    # the full 35B-A3B on one H200 has room for its layer checkpoints: they stay on the GPU (the faster path)
    assert plan.checkpoints == 'gpu' and run.gradient_checkpointing is True
    assert any('Layer checkpoints stay on the GPU' in r for r in plan.explain)  # the default: under --explain
    assert run.autocast is True and run.dtype == 'bfloat16'  # the forward under bf16 autocast, as HF Trainer runs it
    off = load_recipe(H200X1, [f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}',
                               'unsloth.autocast=false'])
    (_, text), = build_launch(plan_recipe(off), off, environ={}).files.items()
    assert UnslothRunConfig.from_json(text).autocast is False
    assert run.encode_threads == 4  # samples encoded on 4 threads, one template each (prefetch.OrderedEncoder)


def test_encode_threads_reach_the_run_config_and_a_bad_value_names_the_key():
    from swift_vora.backends.recipe import RecipeError
    model = f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}'
    two = load_recipe(H200X1, [model, 'unsloth.encode_threads=2'])
    (_, text), = build_launch(plan_recipe(two), two, environ={}).files.items()
    assert UnslothRunConfig.from_json(text).encode_threads == 2
    for bad in ('0', '-1', 'true', 'four', '2.5'):
        with pytest.raises(RecipeError, match=r"'unsloth\.encode_threads'"):
            load_recipe(H200X1, [model, f'unsloth.encode_threads={bad}'])


def test_checkpoints_offload_to_host_only_when_the_gpu_has_no_room():
    # every layer checkpointed: the recipe's train.checkpoint_layers=auto would spend the room this test measures
    every_layer = 'train.checkpoint_layers=null'

    def plan(*overrides):
        return plan_recipe(load_recipe(H200X1, [f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}',
                                                'hardware=null', 'gpus=1', every_layer, *overrides]))

    on_gpu = plan('gpu_mem_gib=139.8', 'unsloth.gradient_checkpointing=true')
    on_host = plan('gpu_mem_gib=139.8', 'unsloth.gradient_checkpointing=unsloth')
    assert on_gpu.checkpoints == 'gpu' and on_host.checkpoints == 'host'
    assert on_host.gpu_peak_gib < on_gpu.gpu_peak_gib and on_host.host_peak_gib > on_gpu.host_peak_gib
    assert plan('gpu_mem_gib=139.8').checkpoints == 'gpu'  # room: auto keeps them on the GPU
    # a GPU between the two peaks: only the offloaded plan fits, and auto takes it
    between = f'gpu_mem_gib={(on_gpu.gpu_peak_gib + on_host.gpu_peak_gib) / 2:.2f}'
    tight = load_recipe(H200X1, [f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}', 'hardware=null',
                                 'gpus=1', every_layer, between])
    chosen = plan_recipe(tight)
    assert chosen.verdict == 'fits' and chosen.checkpoints == 'host'
    assert any('offloaded to pinned host RAM' in r and 'on the GPU they would need' in r for r in chosen.reasons)
    run = UnslothRunConfig.from_json(next(iter(build_launch(chosen, tight, environ={}).files.values())))
    assert run.gradient_checkpointing == 'unsloth'
    assert plan(between, 'unsloth.gradient_checkpointing=true').verdict == 'does_not_fit'


def test_unsloth_gradient_checkpointing_values_are_checked():
    model = f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}'
    recipe = load_recipe(H200X1, [model, 'unsloth.gradient_checkpointing=sometimes'])
    with pytest.raises(LaunchUsageError, match='unsloth.gradient_checkpointing'):
        build_launch(plan_recipe(recipe), recipe, environ={})


@pytest.fixture(scope='module')
def peft_moe(tiny_moe_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from swift_vora.backends.unsloth_runner import _language_regex

    def build(modules, parameters):
        model = AutoModelForImageTextToText.from_pretrained(tiny_moe_model_dir, dtype=torch.float32)
        return get_peft_model(model, LoraConfig(r=4, target_modules=_language_regex(modules),
                                                target_parameters=parameters or None))
    return build


def test_router_check_on_a_live_moe(peft_moe, tiny_moe_model_dir):
    t = lora_targets(load_model_spec(tiny_moe_model_dir))
    counts = assert_router_frozen(peft_moe(t['target_modules'], t['target_parameters']))
    assert counts['expert_lora_tensors'] > 0 and counts['lora_tensors'] > counts['expert_lora_tensors']
    with pytest.raises(RouterTargeted, match='mlp.gate'):  # LoRA on the router's weight
        assert_router_frozen(peft_moe(['q_proj'], ['mlp.gate.weight']))
    model = peft_moe(['q_proj'], [])
    next(p for n, p in model.named_parameters() if n.endswith('mlp.gate.weight')).requires_grad_(True)
    with pytest.raises(RouterTargeted):  # a trainable router without LoRA is caught too
        assert_router_frozen(model)


@pytest.mark.slow
def test_runner_trains_a_tiny_moe_on_cpu(tiny_moe_model_dir, tiny_annotations, tmp_path):
    """The runner's loop end to end (PEFT standing in for Unsloth's loader): template encode, experts trained,
    router and base weights untouched, adapter + marker saved."""
    import torch
    from safetensors.torch import load_file
    out = tmp_path / 'run'
    argv = [sys.executable, '-m', 'swift_vora.backends.unsloth_runner', H200X1, f'model.path={tiny_moe_model_dir}',
            'model.type=qwen3_vl_moe', f'data.dataset={tiny_annotations}', f'train.output_dir={out}',
            'train.max_steps=2', 'train.grad_accum=1', 'train.dtype=float32', 'train.lr=1e-2', 'video.fps=1.0',
            'video.max_frames=4', 'video.pair_tokens=16', 'video.min_pair_tokens=4', 'data.window=8',
            'data.stride=8', 'data.max_length=2048', 'train.logging_steps=1', '--loader', 'peft']
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, 'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ckpt = out / 'checkpoint-2'
    marker = json.loads((ckpt / 'swift_vora_adapter.json').read_text())
    assert marker['source'] == 'peft' and marker['target_parameters'] == EXPERT_PARAMETERS
    weights = load_file(str(ckpt / 'adapter_model.safetensors'))
    expert_b = [k for k in weights if '.experts.' in k and 'lora_B' in k]
    assert expert_b and all(weights[k].abs().sum() > 0 for k in expert_b)  # B starts at 0: experts were trained
    assert not [k for k in weights if '.gate.' in k or 'visual' in k]
    log = [json.loads(line) for line in (out / 'train_log.jsonl').read_text().splitlines()]
    assert [r['step'] for r in log] == [1, 2] and all(torch.isfinite(torch.tensor(r['loss'])) for r in log)
    result = json.loads((out / 'unsloth_run_result.json').read_text())
    assert result['expert_lora_tensors'] > 0 and result['loader'] == 'peft'
