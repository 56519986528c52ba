"""SWIFT_VORA_MOE_LORA_SCALE=rank (swift_vora/speed/moe_lora_scale.py): each expert LoRA's scaling moves from the
expert output to the rank-r intermediate in unsloth_zoo's grouped-GEMM MoE forward. What a user relies on: the
same outputs and gradients (bit for bit at scaling 2.0, the recipes' alpha = 2 x rank); no multiplication over the
expert output is left, forward or backward (the kernels the H200 profile showed); a source the rewrite was not
written for is refused, naming the statement; the switch off changes nothing. unsloth_zoo is GPU-only here: a
stand-in module holds the statements exactly as upstream writes them, and the real function's pinned source is
checked against the wheel where .whl/moe has it."""
import ast
import inspect
import os
import sys
import zipfile

import moe_wheels
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swift_vora import patches
from swift_vora.speed import moe_lora_scale as mls

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, D, F, R = 96, 32, 16, 4  # routed rows, hidden, expert intermediate (gate_up = 2 x F), rank

STAND_IN = '''
import torch


def forward_native_grouped_mm(self, hidden_states, top_k_index, top_k_weights):
    """upstream's two LoRA blocks, statement for statement, around plain matrix products"""
    permuted_input = hidden_states
    mm1_out = permuted_input @ self.gate_up
    first_weight, second_weight, scaling = self.gate_up_lora
    lora_out = permuted_input @ first_weight
    lora_out = lora_out.contiguous()
    lora_delta = lora_out @ second_weight
    mm1_out = mm1_out + lora_delta * scaling
    gate, up = mm1_out.chunk(2, dim=-1)
    inter = torch.nn.functional.silu(gate) * up
    mm2_out = inter @ self.down
    first_weight, second_weight, scaling = self.down_lora
    lora_out = inter @ first_weight
    lora_out = lora_out.contiguous()
    lora_delta = lora_out @ second_weight
    mm2_out = mm2_out + lora_delta * scaling
    return mm2_out * top_k_weights
'''


@pytest.fixture
def stand_in(load_pinned_moe_forward):
    """The stand-in loaded as unsloth_zoo's cached copy is (a module from a file), its source pinned for the test."""
    return load_pinned_moe_forward(STAND_IN, mls.PATCH)


class Experts:
    def __init__(self, scaling, dtype):
        g = torch.Generator().manual_seed(0)
        def p(*shape):
            return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(dtype).requires_grad_()
        self.gate_up, self.down = p(D, 2 * F), p(F, D)
        self.gate_up_lora = (p(D, R), p(R, 2 * F), scaling)
        self.down_lora = (p(F, R), p(R, D), scaling)

    def trained(self):
        return [self.gate_up_lora[0], self.gate_up_lora[1], self.down_lora[0], self.down_lora[1]]


def run(forward, experts, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g).to(dtype).requires_grad_()
    weights = torch.rand(N, 1, generator=g).to(dtype)
    out = forward(experts, x, None, weights)
    probe = torch.randn(N, D, generator=g).to(dtype)  # a loss whose backward multiplies by a tensor, not a number
    (out * probe).float().sum().backward()
    return out.detach(), x.grad, [w.grad for w in experts.trained()]


class BigMultiplications(TorchDispatchMode):
    """aten.mul calls whose result has as many elements as an expert output (N x 2F or N x D)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.mul and isinstance(out, torch.Tensor) and \
                out.numel() in (N * 2 * F, N * D) and all(isinstance(a, torch.Tensor) for a in args[:1]) and \
                not isinstance(args[1], torch.Tensor):
            self.count += 1
        return out


def test_same_outputs_and_gradients_bit_for_bit_at_scaling_two(stand_in, monkeypatch):
    upstream = stand_in.forward_native_grouped_mm
    monkeypatch.setenv(mls.ENV, 'rank')
    state = mls.install()
    assert state == {'setting': 'rank', 'patched': ['unsloth_cached_moe_utils'], 'rebound': []}
    patched = stand_in.forward_native_grouped_mm
    assert patches.patched_by(patched) == mls.PATCH and patches.upstream(patched) is upstream
    out_a, gx_a, gw_a = run(upstream, Experts(2.0, torch.bfloat16), torch.bfloat16)
    out_b, gx_b, gw_b = run(patched, Experts(2.0, torch.bfloat16), torch.bfloat16)
    assert torch.equal(out_a, out_b) and torch.equal(gx_a, gx_b)
    assert all(torch.equal(a, b) for a, b in zip(gw_a, gw_b))


def test_other_scalings_agree_to_rounding(stand_in, monkeypatch):
    upstream = stand_in.forward_native_grouped_mm
    monkeypatch.setenv(mls.ENV, 'rank')
    mls.install()
    out_a, gx_a, gw_a = run(upstream, Experts(0.37, torch.float64), torch.float64)
    out_b, gx_b, gw_b = run(stand_in.forward_native_grouped_mm, Experts(0.37, torch.float64), torch.float64)
    torch.testing.assert_close(out_a, out_b)
    torch.testing.assert_close(gx_a, gx_b)
    for a, b in zip(gw_a, gw_b):
        torch.testing.assert_close(a, b)


def test_no_multiplication_over_the_expert_output_is_left(stand_in, monkeypatch):
    upstream = stand_in.forward_native_grouped_mm
    monkeypatch.setenv(mls.ENV, 'rank')
    mls.install()
    counts = []
    for forward in (upstream, stand_in.forward_native_grouped_mm):
        with BigMultiplications() as mode:
            run(forward, Experts(2.0, torch.float32), torch.float32)
        counts.append(mode.count)
    assert counts[0] >= 4 and counts[1] == 0, counts  # upstream: two forward + two backward scalings


def test_a_family_patch_that_imported_the_function_by_name_calls_the_rewrite(stand_in, monkeypatch):
    """unsloth_zoo's qwen3_vl_moe (and gpt_oss, the 4-bit and FP8 expert paths) do `from .moe_utils import
    forward_native_grouped_mm` and call it through their own global: rebound to the rewrite, by identity only."""
    import types
    upstream = stand_in.forward_native_grouped_mm
    family = types.ModuleType('unsloth_zoo.temporary_patches.qwen3_vl_moe')
    family.forward_native_grouped_mm = upstream
    other = types.ModuleType('unsloth_zoo.temporary_patches.other')
    other.forward_native_grouped_mm = lambda *a: None  # a different function of the same name: left alone
    unrelated = types.ModuleType('someone_else')
    unrelated.forward_native_grouped_mm = upstream  # not unsloth_zoo's: left alone
    for module in (family, other, unrelated):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setenv(mls.ENV, 'rank')
    state = mls.install()
    assert state['rebound'] == ['unsloth_zoo.temporary_patches.qwen3_vl_moe']
    assert family.forward_native_grouped_mm is stand_in.forward_native_grouped_mm is not upstream
    assert other.forward_native_grouped_mm is not stand_in.forward_native_grouped_mm
    assert unrelated.forward_native_grouped_mm is upstream
    out_a, _, _ = run(upstream, Experts(2.0, torch.bfloat16), torch.bfloat16)
    out_b, _, _ = run(family.forward_native_grouped_mm, Experts(2.0, torch.bfloat16), torch.bfloat16)
    assert torch.equal(out_a, out_b)


def test_a_source_it_was_not_written_for_is_refused():
    with pytest.raises(mls.RewriteMismatch, match=r"'mm2_out = mm2_out \+ lora_delta \* scaling' found 0 times"):
        mls.rewrite(STAND_IN.replace('mm2_out = mm2_out + lora_delta * scaling', 'mm2_out += lora_delta * scaling'))


def test_a_changed_source_is_not_patched(stand_in, monkeypatch):
    monkeypatch.setitem(patches.BY_NAME, mls.PATCH, patches.BY_NAME[mls.PATCH]._replace(sources={'x': '0' * 16}))
    monkeypatch.setenv(mls.ENV, 'rank')
    with pytest.raises(mls.RewriteMismatch, match='not the source'):
        mls.install()


def test_the_default_changes_nothing(stand_in, monkeypatch):
    upstream = stand_in.forward_native_grouped_mm
    monkeypatch.delenv(mls.ENV, raising=False)
    assert mls.install() == {'setting': 'output', 'patched': []}
    assert stand_in.forward_native_grouped_mm is upstream


def test_without_unsloth_loaded_it_says_so(monkeypatch):
    monkeypatch.setenv(mls.ENV, 'rank')
    for name in mls.MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert 'not loaded' in mls.install()['skipped']


WHEELS = [w for w in [moe_wheels.wheel('unsloth_zoo')] if w]  # .whl/moe, else .fetched/wheels


@pytest.mark.skipif(not WHEELS, reason=moe_wheels.MISSING)
def test_the_pinned_source_is_the_wheels_and_the_rewrite_applies(tmp_path):
    wheel = WHEELS[-1]
    version = os.path.basename(wheel).split('-')[1]
    with zipfile.ZipFile(wheel) as z:
        text = z.read('unsloth_zoo/temporary_patches/moe_utils.py').decode()
    path = tmp_path / 'moe_utils.py'
    path.write_text(text)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == mls.FUNCTION)
    defined = {'torch': torch}  # the function alone, at its line numbers: inspect reads its source from the file
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), 'exec'), defined)
    source = inspect.getsource(defined[mls.FUNCTION])
    assert patches.BY_NAME[mls.PATCH].sources.get(version) == patches.source_hash(source)
    rewritten = mls.rewrite(source)
    assert 'lora_delta * scaling' not in rewritten and rewritten.count('(lora_out * scaling)') == 2
