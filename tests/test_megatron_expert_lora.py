"""MoE LoRA under `megatron sft` as one grouped GEMM per product (swift_vora/backends/megatron_expert_lora.py), on the
CPU, where torch._grouped_mm runs too: the products and gradients of every expert against mcore-bridge's own per-expert
reference (tuners/npu_lora.py `NpuGroupedLoraLinear._fallback_forward`, the installed source loaded with its two
imports that need transformer_engine stood in for), Megatron's fp32 main gradients filled as TE's fused accumulation
fills them, and an expert layer's factors replaced with their weights and Megatron attributes kept."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swift_vora import patches, switches
from swift_vora.backends import megatron_expert_lora as mel

NPU_LORA = Path(importlib.util.find_spec('mcore_bridge').submodule_search_locations[0], 'tuners', 'npu_lora.py')
TE_IMPORT = 'from megatron.core.extensions.transformer_engine import TEGroupedLinear'
DEVICE_IMPORT = 'from mcore_bridge.utils import get_current_device'


def _upstream_factor_class():
    """mcore-bridge's NpuGroupedLoraLinear from the installed source: its TE import (an isinstance target only) and
    its device helper stood in for, the rest as shipped."""
    source = NPU_LORA.read_text()
    assert TE_IMPORT in source and DEVICE_IMPORT in source, 'mcore-bridge\'s npu_lora.py imports changed'
    source = source.replace(TE_IMPORT, 'TEGroupedLinear = type("TEGroupedLinear", (), {})')
    source = source.replace(DEVICE_IMPORT, 'def get_current_device():\n    return "cpu"')
    namespace = {'__name__': 'vora_upstream_npu_lora'}
    exec(compile(source, str(NPU_LORA), 'exec'), namespace)
    return namespace['NpuGroupedLoraLinear']


NpuGroupedLoraLinear = _upstream_factor_class()
CONFIG = SimpleNamespace(use_cpu_initialization=True, params_dtype=torch.float32)
SPLITS = [5, 0, 11, 8]  # one expert without a token


def factor(n=4, inp=16, out=24, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    f = NpuGroupedLoraLinear(n, inp, out, config=SimpleNamespace(use_cpu_initialization=True, params_dtype=dtype),
                             bias=False, is_expert=True)
    with torch.no_grad():
        for i in range(n):
            getattr(f, f'weight{i}').normal_()
    return f


@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_products_and_gradients_equal_mcore_bridges_per_expert_ones(dtype, tol):
    reference = factor(dtype=dtype)
    grouped = mel.grouped_factor(reference, NpuGroupedLoraLinear, CONFIG, True)
    assert isinstance(grouped, NpuGroupedLoraLinear) and grouped.num_gemms == 4
    x = torch.randn(sum(SPLITS), 16, dtype=dtype)
    g = torch.randn(sum(SPLITS), 24, dtype=dtype)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    ref_out, _ = reference._fallback_forward(xs[0], SPLITS)
    out, bias = grouped(xs[1], SPLITS)
    assert bias is None and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref_out.float(), atol=tol, rtol=tol)
    (ref_out.float() * g.float()).sum().backward()
    (out.float() * g.float()).sum().backward()
    torch.testing.assert_close(xs[1].grad.float(), xs[0].grad.float(), atol=tol * 4, rtol=tol)
    for i in range(4):
        want = getattr(reference, f'weight{i}').grad
        got = getattr(grouped, f'weight{i}').grad
        if want is None:  # the expert without a token: upstream's loop never touched its weight
            assert i == 1 and not got.any()
        else:
            torch.testing.assert_close(got.float(), want.float(), atol=tol * 4, rtol=tol)


def factor_under_megatron_ddp():
    """A replaced factor whose weights carry what Megatron's DDP gives them (an fp32 main_grad, the accumulation
    flag), an input of SPLITS rows and an output gradient."""
    f = mel.grouped_factor(factor(), NpuGroupedLoraLinear, CONFIG, True)
    weights = [getattr(f, f'weight{i}') for i in range(4)]
    for w in weights:
        w.main_grad = torch.zeros_like(w, dtype=torch.float32)
        w.grad_added_to_main_grad = False
    return f, weights, torch.randn(24, 16), torch.randn(24, 24)


def test_gradients_go_into_megatrons_main_grad_and_accumulate():
    """As TE's fused accumulation: each weight's gradient added to its fp32 main_grad, the weight marked
    grad_added_to_main_grad (Megatron's hook then adds nothing), a zero gradient handed to autograd; a second
    micro-batch adds to the first."""
    f, weights, x, g = factor_under_megatron_ddp()
    expected = []
    start = 0
    for split in SPLITS:
        expected.append(g[start:start + split].t() @ x[start:start + split])
        start += split
    for micro_batch in (1, 2):
        out, _ = f(x, SPLITS)
        (out * g).sum().backward()
        for w, want in zip(weights, expected):
            torch.testing.assert_close(w.main_grad, micro_batch * want, atol=1e-4, rtol=1e-5)
            assert w.grad_added_to_main_grad and not w.grad.any()


def test_autograd_keeps_the_zero_gradient_it_is_handed_without_a_copy_per_expert():
    """Under Megatron's DDP (its hook clears each weight's .grad after every backward) the zero gradient handed to
    autograd becomes the weight's .grad as it is: no copy per expert weight -- with the cached tensor itself autograd
    copied it, one kernel per expert weight and micro-batch (8,192 a step on the 35B-A3B cut to 8 layers). Without the
    hook's clearing, a second backward accumulates zeros into that shared tensor: it stays zero."""
    f, weights, x, g = factor_under_megatron_ddp()
    for _ in range(2):
        out, _ = f(x, SPLITS)
        (out * g).sum().backward()
        for w in weights:
            kept = mel._dummy_grad(w)
            assert w.grad.untyped_storage().data_ptr() == kept.untyped_storage().data_ptr()
            assert not kept.any()
            w.grad = None  # Megatron's backward hook, once it has seen grad_added_to_main_grad
    assert [bool(w.main_grad.any()) for w in weights] == [split > 0 for split in SPLITS]  # the sums still land
    for _ in range(2):  # no hook clearing .grad
        out, _ = f(x, SPLITS)
        (out * g).sum().backward()
    assert not any(mel._dummy_grad(w).any() for w in weights)


def test_an_expert_layers_factors_are_replaced_with_their_weights_and_attributes(monkeypatch):
    a, b = factor(inp=16, out=8, seed=1), factor(inp=8, out=24, seed=2)
    for f in (a, b):
        for i in range(4):
            getattr(f, f'weight{i}').tensor_model_parallel = False  # what Megatron reads off a parameter
    layer = SimpleNamespace(is_grouped=True, is_expert=True, config=CONFIG, lora_bias={'default': False},
                            lora_A={'default': a}, lora_B={'default': b})
    x = torch.randn(24, 16)
    before = b._fallback_forward(a._fallback_forward(x, SPLITS)[0], SPLITS)[0]
    assert mel.replace_expert_factors(layer, 'default', NpuGroupedLoraLinear) == 2
    new_a, new_b = layer.lora_A['default'], layer.lora_B['default']
    assert type(new_a).__name__ == 'GroupedMMLoraFactor' and isinstance(new_b, NpuGroupedLoraLinear)
    for old, new in ((a, new_a), (b, new_b)):
        for i in range(4):
            w = getattr(new, f'weight{i}')
            assert torch.equal(w, getattr(old, f'weight{i}')) and w.allreduce is False
            assert w.tensor_model_parallel is False
    after = new_b(new_a(x, SPLITS)[0], SPLITS)[0]
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-5)
    assert mel.replace_expert_factors(layer, 'default', NpuGroupedLoraLinear) == 0  # not twice
    dense = SimpleNamespace(is_grouped=False, is_expert=False)
    assert mel.replace_expert_factors(dense, 'default', NpuGroupedLoraLinear) == 0


def test_factors_it_cannot_take_stay_as_they_are():
    assert mel.applies_to(factor()) is None
    assert 'multiples of 8' in mel.applies_to(factor(inp=12))
    with_bias = NpuGroupedLoraLinear(2, 16, 8, config=CONFIG, bias=True, is_expert=True)
    assert mel.applies_to(with_bias) == 'a LoRA bias'
    assert 'not a grouped factor' in mel.applies_to(torch.nn.Linear(16, 8))
    # Transformer Engine's grouped linear without a bias keeps an empty tensor as each bias{i}: not a bias
    te_like = factor()
    for i in range(4):
        setattr(te_like, f'bias{i}', torch.Tensor())
    te_like.use_bias = False
    assert mel.applies_to(te_like) is None
    te_like.bias2 = torch.zeros(24)
    assert mel.applies_to(te_like) == 'a LoRA bias'
    layer = SimpleNamespace(is_grouped=True, is_expert=True, config=CONFIG, lora_bias={'default': False},
                            lora_A={'default': factor(inp=12)}, lora_B={'default': factor(inp=8)})
    kept = layer.lora_A['default']
    assert mel.replace_expert_factors(layer, 'default', NpuGroupedLoraLinear) == 1
    assert layer.lora_A['default'] is kept


def test_the_wrapper_replaces_after_mcore_bridges_update_layer_once(monkeypatch):
    monkeypatch.setattr(patches, 'applicable', lambda name: name == mel.PATCH)

    class StandInLora:  # mcore-bridge's update_layer builds and initialises the factors
        def update_layer(self, adapter_name, r, *, lora_alpha, **kwargs):
            self.is_grouped, self.is_expert, self.config, self.lora_bias = True, True, CONFIG, {}
            self.lora_A = {adapter_name: factor(inp=16, out=r)}
            self.lora_B = {adapter_name: factor(inp=r, out=24)}
            return 'built'

    assert mel.install(StandInLora, NpuGroupedLoraLinear)
    assert not mel.install(StandInLora, NpuGroupedLoraLinear)  # already there
    layer = StandInLora()
    assert layer.update_layer('default', 8, lora_alpha=16, lora_dropout=0.0) == 'built'
    assert type(layer.lora_A['default']).__name__ == type(layer.lora_B['default']).__name__ == 'GroupedMMLoraFactor'
    assert patches.patched_by(StandInLora.update_layer) == mel.PATCH


def test_a_factor_class_of_another_signature_is_not_used(monkeypatch):
    monkeypatch.setattr(patches, 'applicable', lambda name: True)

    class Other(torch.nn.Module):
        def __init__(self, num_gemms, input_size, output_size):
            super().__init__()

    class StandInLora:
        def update_layer(self, adapter_name, r, *, lora_alpha, **kwargs):
            return 'built'

    assert not mel.install(StandInLora, Other)
    assert patches.patched_by(StandInLora.update_layer) is None


def test_the_switch():
    assert not mel.wanted({}) and mel.wanted({mel.ENV: 'grouped_mm'})
    with pytest.raises(switches.SwitchError, match=mel.ENV):
        mel.wanted({mel.ENV: 'grouped'})


def test_the_gpu_check_script_runs_its_checks_on_the_cpu(tmp_path):
    """scripts/gpu/expert_lora_check.py (run on an H100: docs/runs/h100-expert-lora-check-2026-12-06/) on a few
    rows on the CPU: every factor shape of the 35B-A3B expert LoRA within bf16 rounding of the fp32 oracle."""
    import json
    import runpy
    check = runpy.run_path(str(Path(__file__).resolve().parents[1] / 'scripts' / 'gpu' / 'expert_lora_check.py'))
    assert check['main'](['--device', 'cpu', '--rows', '600', '--no-timing', '--out', str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob('expert-lora-check-*.json')).read_text())
    assert report['ok'] and [f['factor'] for f in report['factors']] == [
        'fc1.lora_A', 'fc1.lora_B', 'fc2.lora_A', 'fc2.lora_B']
    assert all(f['experts_without_rows'] > 0 and f['out_rel_err'] < 1e-2 for f in report['factors'])


def test_offsets_are_the_experts_end_rows_and_are_reused_for_the_same_list_only():
    splits = [3, 0, 5]
    first = mel.offsets_of(splits, torch.device('cpu'))
    assert first.tolist() == [3, 3, 8] and first.dtype == torch.int32
    assert mel.offsets_of(splits, torch.device('cpu')) is first  # a layer's second factor: the same list
    splits[0] = 4  # the same list with other counts is computed again
    assert mel.offsets_of(splits, torch.device('cpu')).tolist() == [4, 4, 9]
    assert mel.offsets_of([4, 0, 5], torch.device('cpu')).tolist() == [4, 4, 9]
    assert mel.offsets_of(torch.tensor([1, 2]), torch.device('cpu')).tolist() == [1, 3]
