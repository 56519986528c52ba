"""train.packing on each backend (swift_vora/backends/packing.py): applied, or refused before anything loads --
never a recipe key a backend silently ignores."""
import os

import pytest

from swift_vora.backends import LaunchRefused, LaunchUsageError, packing
from swift_vora.backends.launch import build_launch
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
QWEN3_5_DENSE = os.path.join(CONFIGS, 'qwen3_5_dense.json')  # 24 Gated DeltaNet layers of 32
QWEN3_VL_2B = os.path.join(CONFIGS, 'qwen3_vl_2b.json')  # attention only


def _launch(recipe_name, *overrides):
    recipe = load_recipe(os.path.join(REPO, 'recipes', recipe_name), list(overrides))
    return build_launch(plan_recipe(recipe), recipe, environ={})


def _flag(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize('value', ['micro_batch', 'dataset'])
def test_gated_deltanet_model_packs_only_with_flash_linear_attention(monkeypatch, value):
    overrides = (f'model.path={QWEN3_5_DENSE}', 'model.type=qwen3_5',
                 'train.backend=deepspeed_zero3', f'train.packing={value}', 'data.max_length=20000')
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: False)
    with pytest.raises(LaunchRefused) as refused:
        _launch('h200x1.yaml', *overrides)
    # the plan's own reasons come along (the planner builds the command it prints through the same launcher)
    [reason] = [r for r in refused.value.reasons if r.startswith('train.packing')]
    assert f'train.packing={value}' in reason and '24 of the model\'s 32 decoder layers' in reason
    assert 'train.packing=off' in reason and 'flash-linear-attention' in reason
    # where fla is installed, ms-swift's varlen path for the Gated DeltaNet layers runs: the launch packs
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: True)
    argv = _launch('h200x1.yaml', *overrides).argv
    flag = {'micro_batch': '--padding_free', 'dataset': '--packing'}[value]
    assert _flag(argv, flag) == 'true' and _flag(argv, '--attn_impl') == 'vora_varlen'
    # off: nothing to keep apart, no refusal
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: False)
    argv = _launch('h200x1.yaml', *overrides[:-2], 'train.packing=off').argv
    assert '--padding_free' not in argv and '--packing' not in argv


@pytest.mark.parametrize('value', ['micro_batch', 'dataset'])
def test_megatron_packs_a_gated_deltanet_moe_only_with_flash_linear_attention(monkeypatch, value):
    """mcore-bridge's Gated DeltaNet asserts at the first packed step without fla: the Megatron launch refuses first
    (the h200x8 recipe's Qwen3.5-MoE: 30 of its 40 layers), and packs where fla is installed."""
    from megatron_args import H200X8_AS_MEGATRON_LORA
    overrides = (f'model.path={os.path.join(CONFIGS, "qwen3_5_moe_35b_a3b.json")}', f'train.packing={value}',
                 'data.max_length=20000', *H200X8_AS_MEGATRON_LORA)
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: False)
    with pytest.raises(LaunchRefused) as refused:
        _launch('h200x8.yaml', *overrides)
    [reason] = [r for r in refused.value.reasons if r.startswith('train.packing')]
    assert '30 of the model\'s 40 decoder layers' in reason and "mcore-bridge's Gated DeltaNet" in reason
    assert 'train.packing=off' in reason
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: True)
    argv = _launch('h200x8.yaml', *overrides).argv
    flag = {'micro_batch': '--padding_free', 'dataset': '--packing'}[value]
    assert _flag(argv, flag) == 'true'
    # the recipe as shipped trains padded rows, fla or not
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: False)
    argv = _launch('h200x8.yaml', overrides[0], *H200X8_AS_MEGATRON_LORA).argv
    assert _flag(argv, '--padding_free') == 'false' and '--packing' not in argv


def test_attention_only_model_packs_without_flash_linear_attention(monkeypatch):
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: False)
    argv = _launch('3090x3.yaml', f'model.path={QWEN3_VL_2B}', 'train.packing=micro_batch').argv
    assert _flag(argv, '--padding_free') == 'true'


def test_unsloth_runner_refuses_packing():
    moe = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')
    with pytest.raises(LaunchUsageError, match='train.packing=micro_batch: the Unsloth split-LoRA runner'):
        _launch('h200x1.yaml', f'model.path={moe}', 'model.type=qwen3_5_moe', 'train.backend=unsloth_split_lora',
                'train.packing=micro_batch')
    launch = _launch('h200x1.yaml', f'model.path={moe}', 'model.type=qwen3_5_moe', 'train.backend=unsloth_split_lora')
    assert launch.backend == 'unsloth_split_lora'


def test_kernels_installed_is_what_python_can_import(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: object() if name == 'fla' else None)
    assert packing.linear_attention_kernels_installed()
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    assert not packing.linear_attention_kernels_installed()


def test_the_launch_counts_linear_attention_as_the_planner_did(tmp_path, monkeypatch):
    """The launcher sees the Gated DeltaNet layers through the plan's model description, counted by the planner's
    model_spec even from a config that gives only `full_attention_interval`."""
    import json

    from swift_vora.backends.base import PlanView
    config = json.load(open(QWEN3_5_DENSE))
    del config['text_config']['layer_types']
    model_dir = tmp_path / 'qwen3_5'
    model_dir.mkdir()
    (model_dir / 'config.json').write_text(json.dumps(config))
    recipe = load_recipe(os.path.join(REPO, 'recipes', 'h200x1.yaml'),
                         [f'model.path={model_dir}', 'model.type=qwen3_5', 'train.packing=micro_batch'])
    view = PlanView.of(plan_recipe(recipe), recipe)
    assert (view.num_layers, view.linear_attention_layers) == (32, 24)
    monkeypatch.setattr(packing, 'linear_attention_kernels_installed', lambda: False)
    with pytest.raises(LaunchRefused, match='24 of the model\'s 32 decoder layers'):
        packing.swift_sft_packing_args(recipe, view)
