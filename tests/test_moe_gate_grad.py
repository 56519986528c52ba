"""SWIFT_VORA_MOE_GATE_GRAD=fused (swift_vora/speed/moe_gate_grad.py): unsloth_zoo's gate-gradient identity computes
its fp32 dot product as one compiled reduction. What a user relies on: the same input gradient (passed through) and
the same gate gradient -- bit for bit with the eager reduction, to fp32 summation order compiled; no fp32 copy of
the routed rows left; a source the rewrite was not written for is refused; the switch off changes nothing.
unsloth_zoo is GPU-only here: a stand-in module holds the class with upstream's statements, and the pin and the
rewrite are checked against the wheel's method where .whl/moe has it."""
import ast
import inspect
import os
import zipfile

import moe_wheels
import pytest
import torch

from swift_vora import patches
from swift_vora.speed import moe_gate_grad as mgg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T, F = 96, 24  # routed rows, expert intermediate

STAND_IN = '''
import torch


class _MoEGateGradIdentity(torch.autograd.Function):
    """upstream's identity, statement for statement"""

    @staticmethod
    def forward(ctx, inter, permuted_weights):
        ctx.save_for_backward(inter, permuted_weights)
        return inter

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_inter):
        if grad_inter is None:
            return None, None
        inter, gate = ctx.saved_tensors
        grad_gate = None
        if ctx.needs_input_grad[1]:
            dgate = (inter.to(torch.float32) * grad_inter.to(torch.float32)).sum(dim=-1)
            gate_f = gate.to(torch.float32)
            safe_gate = torch.where(
                gate_f >= 0, gate_f.clamp_min(1e-12), gate_f.clamp_max(-1e-12)
            )
            grad_gate = (dgate / safe_gate).to(gate.dtype)
        return grad_inter, grad_gate
'''


@pytest.fixture
def stand_in(load_cached_moe_utils, monkeypatch):
    module = load_cached_moe_utils(STAND_IN)
    digest = patches.source_hash(inspect.getsource(module._MoEGateGradIdentity.backward))
    monkeypatch.setitem(patches.BY_NAME, mgg.PATCH, patches.BY_NAME[mgg.PATCH]._replace(sources={'test': digest}))
    monkeypatch.setattr(patches, 'applicable', lambda name: True)
    monkeypatch.delenv(mgg.ENV, raising=False)
    return module


def run(module, dtype=torch.bfloat16):
    """The identity as upstream's forward uses it: inter multiplied by the gate afterwards, a loss on the product."""
    g = torch.Generator().manual_seed(0)
    inter = torch.randn(T, F, generator=g).to(dtype).requires_grad_()
    gate = torch.rand(T, generator=g).to(dtype).requires_grad_()
    probe = torch.randn(T, F, generator=g).to(dtype)
    out = module._MoEGateGradIdentity.apply(inter, gate) * gate.detach().unsqueeze(-1)
    (out * probe).float().sum().backward()
    return inter.grad, gate.grad


def test_the_same_gradients_bit_for_bit_with_the_eager_reduction(stand_in, monkeypatch):
    upstream = stand_in._MoEGateGradIdentity.backward
    before = run(stand_in)
    monkeypatch.setenv(mgg.ENV, 'fused')
    assert mgg.install() == {'setting': 'fused', 'patched': ['unsloth_cached_moe_utils']}
    patched = stand_in._MoEGateGradIdentity.backward
    assert patches.patched_by(patched) == mgg.PATCH and patches.upstream(patched) is patches.upstream(upstream)
    after = run(stand_in)  # off CUDA the statement is upstream's eager reduction
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_the_compiled_reduction_equals_upstreams_to_summation_order():
    g = torch.Generator().manual_seed(1)
    for rows in (T, 2 * T + 5):  # a dynamic row count: one compile
        a = torch.randn(rows, 512, generator=g).to(torch.bfloat16)
        b = torch.randn(rows, 512, generator=g).to(torch.bfloat16)
        try:
            fused = mgg.dot(a, b, compiled=True)
        except Exception as error:  # noqa: BLE001 - inductor's CPU kernels need a C++ compiler on the machine
            if 'compiler' in str(error).lower() or 'cpp' in str(error).lower():
                pytest.skip(f'inductor cannot build CPU kernels here ({str(error)[:200]}); the GPU build is Triton')
            raise
        torch.testing.assert_close(fused, mgg._dot(a, b), rtol=1e-5, atol=1e-4)
        assert fused.dtype == torch.float32


def test_the_rewritten_statement_hands_the_bf16_rows_to_the_fused_reduction(stand_in, monkeypatch):
    """The fp32 copies are the compiled kernel's to avoid: the statement gives it the rows as they are."""
    seen = []

    def recording(a, b):
        seen.append((a.dtype, b.dtype, tuple(a.shape)))
        return mgg._dot(a, b)
    monkeypatch.setenv(mgg.ENV, 'fused')
    mgg.install()
    monkeypatch.setattr(mgg, 'dot', recording)
    run(stand_in)
    assert seen == [(torch.bfloat16, torch.bfloat16, (T, F))]


def test_the_default_changes_nothing(stand_in):
    upstream = stand_in._MoEGateGradIdentity.backward
    assert mgg.install() == {'setting': 'eager', 'patched': []}
    assert stand_in._MoEGateGradIdentity.backward is upstream


def test_a_source_it_was_not_written_for_is_refused(stand_in, monkeypatch):
    with pytest.raises(mgg.RewriteMismatch, match='found 0 times'):
        mgg.rewrite(STAND_IN.replace('.sum(dim=-1)', '.sum(-1)'))
    monkeypatch.setitem(patches.BY_NAME, mgg.PATCH, patches.BY_NAME[mgg.PATCH]._replace(sources={'x': '0' * 16}))
    monkeypatch.setenv(mgg.ENV, 'fused')
    with pytest.raises(mgg.RewriteMismatch, match='not the source'):
        mgg.install()


WHEELS = [w for w in [moe_wheels.wheel('unsloth_zoo')] if w]  # .whl/moe, else .fetched/wheels


@pytest.mark.skipif(not WHEELS, reason=moe_wheels.MISSING)
def test_the_pinned_source_is_the_wheels_and_the_rewrite_compiles():
    with zipfile.ZipFile(WHEELS[-1]) as z:
        # CRLF in the wheel; inspect reads the source with universal newlines
        text = z.read('unsloth_zoo/temporary_patches/moe_utils.py').decode().replace('\r\n', '\n')
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == mgg.CLASS)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == 'backward')
    first = min([d.lineno for d in fn.decorator_list] + [fn.lineno])
    source = '\n'.join(text.split('\n')[first - 1:fn.end_lineno]) + '\n'
    assert patches.source_hash(source) in patches.BY_NAME[mgg.PATCH].sources.values()
    import textwrap
    compile(textwrap.dedent(mgg.rewrite(source)), 'backward (rewritten)', 'exec')
