"""SWIFT_VORA_MOE_DOWN_LORA=fold (swift_vora/speed/moe_down_fold.py): the experts' down-projection LoRA folded into
the base grouped GEMM of unsloth_zoo's MoE forward. What a user relies on: the same outputs and gradients as
upstream up to one rounding (against an fp32 reference, no further off than upstream's own bf16 path), alone and
with the rank-scale rewrite; no 1 GB delta and no addition over the routed rows left; B's gradient zero for an expert
no row reached; every call that cannot fold (no LoRA on the down projection, a recomputed quantized base, trained
experts) runs upstream's statements bit for bit and is counted, while upstream's recompute of a plain frozen stack
folds (rebuilding a parameter in the backward is taking it again); the switch off changes nothing. unsloth_zoo is
GPU-only here: a stand-in module holds upstream's statements exactly as written around torch._grouped_mm (which
runs on the CPU), and the rewrite is applied to the wheel's real source where .whl/moe has it."""
import os
import zipfile

import moe_wheels
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swift_vora import patches
from swift_vora.speed import moe_down_fold as fold
from swift_vora.speed import moe_lora_scale as mls

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T, D, F, R = 64, 32, 24, 8  # routed rows, hidden, expert intermediate, rank ((F + R) x 2 bytes: 16-byte rows)
OFFSETS = [16, 16, 40, 64]  # four experts, the second reached by no row

STAND_IN = '''
import torch


def _grouped_mm_with_backward_fix(inputs, weight, offsets):
    return torch._grouped_mm(inputs.contiguous(), weight, offs=offsets)


def _base_grouped_mm(inputs, offsets, weight_provider, recompute, plan = None):
    if recompute:  # upstream rebuilds a quantized stack in the backward; the product is the same here
        return torch._grouped_mm(inputs.contiguous(), weight_provider(), offs=offsets)
    return _grouped_mm_with_backward_fix(inputs, weight_provider(), offsets)


def forward_native_grouped_mm(self, hidden_states, top_k_index, top_k_weights):
    """upstream's statements where the rewrites apply, around torch._grouped_mm"""
    offsets = self.offsets
    permuted_input = hidden_states
    mm1_out = _grouped_mm_with_backward_fix(permuted_input, self.gate_up, offsets)
    first_weight, second_weight, scaling = self.gate_up_lora
    lora_out = _grouped_mm_with_backward_fix(permuted_input, first_weight, offsets)
    lora_out = lora_out.contiguous()
    lora_delta = _grouped_mm_with_backward_fix(
        lora_out, second_weight, offsets
    )
    mm1_out = mm1_out + lora_delta * scaling
    gate, up = mm1_out.chunk(2, dim=-1)
    inter = torch.nn.functional.silu(gate) * up
    down_lora = self.down_lora
    selective_plan = None

    _down_src = self.down_src

    def _down_provider():
        return self.down

    if hasattr(self, "down"):
        if down_lora is None or True:
            _recompute = self.recompute
            mm2_out = _base_grouped_mm(
                inter, offsets, _down_provider, _recompute, selective_plan if _recompute else None,
            )

        if down_lora is not None:
            first_weight, second_weight, scaling = down_lora
            lora_out = _grouped_mm_with_backward_fix(inter, first_weight, offsets)
            lora_out = lora_out.contiguous()

            try:
                lora_delta = _grouped_mm_with_backward_fix(lora_out, second_weight, offsets)
            except RuntimeError:
                raise
            mm2_out = mm2_out + lora_delta * scaling
    return mm2_out * top_k_weights
'''


@pytest.fixture
def stand_in(load_pinned_moe_forward, monkeypatch):
    """The stand-in loaded as unsloth_zoo's cached copy is, its source pinned for both patches in the test."""
    module = load_pinned_moe_forward(STAND_IN, mls.PATCH, fold.PATCH)
    monkeypatch.setattr(fold, 'COUNTS', {})
    for env in (mls.ENV, fold.ENV):
        monkeypatch.delenv(env, raising=False)
    return module


class QuantizedStandIn(torch.nn.Parameter):
    """A stack of a class of its own, as bitsandbytes' Params4bit is: upstream dequantizes it in its provider."""


class Experts:
    """The expert stacks as upstream hands them to the GEMMs: the frozen base as a transposed view of [E, out, in],
    the LoRA tensors cast to the GEMM's dtype from trained parameters."""

    def __init__(self, dtype, scaling=2.0, recompute=False, train_base=False, down_lora=True, quantized=False):
        g = torch.Generator().manual_seed(0)
        E = len(OFFSETS)

        def p(*shape, trained=True):
            return (torch.randn(*shape, generator=g) / shape[-2] ** 0.5).requires_grad_(trained)
        self.params = {'gate_up': p(E, 2 * F, D, trained=False), 'down': p(E, D, F, trained=train_base),
                       'gate_up_a': p(E, D, R), 'gate_up_b': p(E, R, 2 * F), 'down_a': p(E, F, R),
                       'down_b': p(E, R, D)}
        self.dtype, self.scaling, self.recompute, self.with_down_lora = dtype, scaling, recompute, down_lora
        # the stack as upstream reads it (`self.down_proj`): a parameter, or a quantized one's own class
        self.down_src = QuantizedStandIn(self.params['down']) if quantized else self.params['down']
        self.offsets = torch.tensor(OFFSETS, dtype=torch.int32)

    def view(self, dtype=None):
        dtype = dtype or self.dtype
        t = {k: v.to(dtype) for k, v in self.params.items()}
        self.gate_up = t['gate_up'].transpose(-2, -1)
        self._down, self.down_taken = t['down'].transpose(-2, -1), 0
        self.gate_up_lora = (t['gate_up_a'], t['gate_up_b'], self.scaling)
        self.down_lora = (t['down_a'], t['down_b'], self.scaling) if self.with_down_lora else None
        return self

    def trained(self):
        return [v for v in self.params.values() if v.requires_grad]

    @property
    def down(self):
        """The stack as upstream's provider hands it, counted (upstream's recompute takes it again in the backward)."""
        self.down_taken += 1
        return self._down


def run(forward, experts, dtype=None):
    g = torch.Generator().manual_seed(1)
    dtype = dtype or experts.dtype
    x = torch.randn(T, D, generator=g).to(dtype).requires_grad_()
    weights = torch.rand(T, 1, generator=g).to(dtype)
    probe = torch.randn(T, D, generator=g).to(dtype)  # a loss whose backward multiplies by a tensor
    for p in experts.trained():
        p.grad = None
    out = forward(experts.view(dtype), x, None, weights)
    (out.float() * probe.float()).sum().backward()
    return [out.detach().float(), x.grad.float()] + [p.grad.clone() if p.grad is not None else None
                                                     for p in experts.trained()]


def install(monkeypatch, rank=False):
    monkeypatch.setenv(fold.ENV, 'fold')
    if rank:
        monkeypatch.setenv(mls.ENV, 'rank')
    return mls.install()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize('rank', [False, True], ids=['fold', 'fold_with_rank_scale'])
def test_bf16_fold_is_as_close_to_an_fp32_reference_as_upstream_is(stand_in, monkeypatch, rank):
    upstream = stand_in.forward_native_grouped_mm
    experts = Experts(torch.bfloat16)
    reference = run(upstream, experts, torch.float32)
    plain = run(upstream, experts)
    state = install(monkeypatch, rank)
    assert state['down_lora'] == 'fold' and state['patched'] == ['unsloth_cached_moe_utils']
    patched = stand_in.forward_native_grouped_mm
    assert patches.patched_by(patched) == (mls.PATCH if rank else fold.PATCH)
    assert patches.upstream(patched) is upstream
    folded = run(patched, experts)
    assert fold.counts() == {'folded': 1}  # the forward folded; the backward calls nothing of the rewrite
    names = ['output', 'input grad'] + list(experts.params)[2:]
    for name, f, u, ref in zip(names, folded, plain, reference):
        assert rel(f, ref) <= 1.5 * rel(u, ref) + 1e-3, (name, rel(f, ref), rel(u, ref))
        assert rel(f, ref) < 2e-2, name


def test_fp32_fold_equals_upstream_to_float_rounding(stand_in, monkeypatch):
    upstream = stand_in.forward_native_grouped_mm
    experts = Experts(torch.float32, scaling=0.37)
    plain = run(upstream, experts)
    install(monkeypatch)
    folded = run(stand_in.forward_native_grouped_mm, experts)
    for f, u in zip(folded, plain):
        torch.testing.assert_close(f, u, rtol=1e-4, atol=1e-4)


def test_no_lora_delta_and_no_addition_over_the_routed_rows_is_left(stand_in, monkeypatch):
    class RowsWide(TorchDispatchMode):
        """adds, and grouped GEMMs of rank-deep inputs, whose result is routed rows x hidden"""

        def __init__(self):
            super().__init__()
            self.adds, self.b_products = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and tuple(out.shape) == (T, D):
                if func.overloadpacket is torch.ops.aten.add:
                    self.adds += 1
                if func.overloadpacket is torch.ops.aten._grouped_mm and args[0].shape[-1] == R:
                    self.b_products += 1
            return out

    upstream = stand_in.forward_native_grouped_mm
    counted = []
    for step in ('upstream', 'fold'):
        if step == 'fold':
            install(monkeypatch)
        experts = Experts(torch.bfloat16).view()
        x = torch.randn(T, D).to(torch.bfloat16).requires_grad_()
        with RowsWide() as mode:  # the forward (the backward's input gradients of the gate/up side are T x D too)
            (stand_in.forward_native_grouped_mm if step == 'fold' else upstream)(experts, x, None, 1.0)
        counted.append((mode.adds, mode.b_products))
    assert counted[0][0] >= 1 and counted[0][1] >= 1 and counted[1] == (0, 0), counted


def test_b_gets_no_gradient_from_an_expert_no_row_reached(stand_in, monkeypatch):
    install(monkeypatch)
    experts = Experts(torch.bfloat16)
    run(stand_in.forward_native_grouped_mm, experts)
    grad_b = experts.params['down_b'].grad
    assert grad_b[1].abs().max() == 0 and grad_b[0].abs().max() > 0  # OFFSETS: expert 1 holds no row


@pytest.mark.parametrize('case,counted', [({'quantized': True, 'recompute': True}, 'base_quantized'),
                                          ({'train_base': True}, 'base_trained'),
                                          ({'down_lora': False}, 'no_down_lora')])
def test_calls_that_cannot_fold_run_upstreams_statements_bit_for_bit(stand_in, monkeypatch, case, counted):
    upstream = stand_in.forward_native_grouped_mm
    plain = run(upstream, Experts(torch.bfloat16, **case))
    install(monkeypatch)
    again = run(stand_in.forward_native_grouped_mm, Experts(torch.bfloat16, **case))
    assert fold.counts() == {counted: 1}
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(plain, again))


def test_upstreams_recompute_of_a_plain_frozen_stack_folds(stand_in, monkeypatch):
    """unsloth_zoo recomputes a bf16 stack by default outside a checkpoint replay (it rebuilds the parameter in the
    backward): the common case at full depth, so it must fold."""
    upstream = stand_in.forward_native_grouped_mm
    plain = run(upstream, Experts(torch.float32, recompute=True))
    install(monkeypatch)
    experts = Experts(torch.float32, recompute=True)
    folded = run(stand_in.forward_native_grouped_mm, experts)
    assert fold.counts() == {'folded': 1}
    # the stand-in's `hasattr`, the forward's, and the backward's again: like upstream's recompute, no stack is kept
    assert experts.down_taken == 3
    for f, u in zip(folded, plain):
        torch.testing.assert_close(f, u, rtol=1e-4, atol=1e-4)


def test_the_default_changes_nothing(stand_in):
    upstream = stand_in.forward_native_grouped_mm
    assert mls.install() == {'setting': 'output', 'patched': []}
    assert stand_in.forward_native_grouped_mm is upstream and not hasattr(stand_in, fold.GLOBAL)


def test_a_source_without_the_statements_is_refused():
    changed = STAND_IN.replace('lora_delta = _grouped_mm_with_backward_fix(lora_out, second_weight, offsets)',
                               'lora_delta = _grouped_mm_with_backward_fix(lora_out, second_weight, offs)')
    with pytest.raises(mls.RewriteMismatch, match='found 0 times'):
        mls.rewrite(changed, fold.rewrites(rank_scaled=False))


WHEELS = [w for w in [moe_wheels.wheel('unsloth_zoo')] if w]  # .whl/moe, else .fetched/wheels


@pytest.mark.skipif(not WHEELS, reason=moe_wheels.MISSING)
@pytest.mark.parametrize('rank', [False, True], ids=['fold', 'fold_with_rank_scale'])
def test_the_rewrites_apply_to_the_wheels_function_and_compile(rank):
    with zipfile.ZipFile(WHEELS[-1]) as z:
        # the wheel's file has CRLF line ends; inspect reads the source with universal newlines
        text = z.read('unsloth_zoo/temporary_patches/moe_utils.py').decode().replace('\r\n', '\n')
    at = text.index(f'def {mls.FUNCTION}(')
    source = text[at:text.index('\ndef ', at + 1)].rstrip() + '\n'
    assert patches.source_hash(source) in patches.BY_NAME[fold.PATCH].sources.values()
    rewrites = (mls.REWRITES if rank else ()) + fold.rewrites(rank_scaled=rank)
    rewritten = mls.rewrite(source, rewrites)
    compile(rewritten, 'forward_native_grouped_mm (rewritten)', 'exec')
    assert rewritten.count(fold.GLOBAL + '.') == 3 and 'lora_delta * scaling' not in rewritten.split(
        'down_lora = None')[1]
