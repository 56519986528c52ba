"""SWIFT_VORA_MOE_GATHER=permutation (swift_vora/speed/moe_gather.py): unsloth_zoo's routed-row gather takes its own
permutation-undoing autograd function in eager mode too. What a user relies on: the same rows forward and the same
input gradient (each token's top_k routed gradients summed); no sort-based index_put backward is left; upstream's
path where the condition does not hold (no grad) and with the switch off; the patch found in the inventory and
recorded. unsloth_zoo is GPU-only here: a stand-in module holds `gather_routed_rows` as upstream writes it (its
compiled-only branch, its eager indexing) and an autograd function with `_RoutedRowGather`'s contract; the real
function is checked against the inventory where .whl/moe has the wheel."""
import os
import sys
import zipfile

import moe_wheels
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swift_vora import patches
from swift_vora.speed import moe_gather as mg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS, TOP_K, HIDDEN = 24, 8, 16

STAND_IN = '''
import torch


class _RoutedRowGather(torch.autograd.Function):
    """rows in the routed order; backward: the gradient through the inverse permutation, summed over top_k"""

    @staticmethod
    def forward(ctx, hidden_states, sorted_indices, top_k):
        ctx.save_for_backward(sorted_indices)
        ctx.num_tokens, ctx.top_k = hidden_states.shape[0], top_k
        return hidden_states.index_select(0, sorted_indices // top_k)

    @staticmethod
    def backward(ctx, grad_rows):
        (sorted_indices,) = ctx.saved_tensors
        inverse = torch.empty_like(sorted_indices)
        inverse.scatter_(0, sorted_indices, torch.arange(sorted_indices.numel()))
        grad = grad_rows.index_select(0, inverse).view(ctx.num_tokens, ctx.top_k, -1).sum(dim=1)
        return grad, None, None


def gather_routed_rows(hidden_states, sorted_indices, top_k):
    if (
        top_k >= 8
        and torch.compiler.is_compiling()
        and hidden_states.requires_grad
        and torch.is_grad_enabled()
        and sorted_indices.numel() == hidden_states.shape[0] * top_k
    ):
        return _RoutedRowGather.apply(hidden_states, sorted_indices, top_k)
    return hidden_states[sorted_indices // top_k]
'''


@pytest.fixture
def stand_in(load_cached_moe_utils, monkeypatch):
    """The stand-in loaded as unsloth_zoo's cached copy is, with a module that imported the function by name."""
    module = load_cached_moe_utils(STAND_IN)
    importer = type(sys)('unsloth_zoo.temporary_patches.stand_in_importer')
    importer.gather_routed_rows = module.gather_routed_rows
    monkeypatch.setitem(sys.modules, importer.__name__, importer)
    monkeypatch.setattr(patches, 'applicable', lambda name: True)
    return module, importer


def routed(dtype=torch.float64):
    """Hidden states and the argsort of a random top_k assignment (as moe_routing_sort makes it)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=dtype)
    experts = torch.randint(0, 32, (TOKENS, TOP_K), generator=g)
    return x, torch.argsort(experts.view(-1), stable=True)


class IndexPutBackward(TorchDispatchMode):
    """aten.index_put (accumulate) and sort calls: what the eager indexing's backward runs."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.index_put, torch.ops.aten.index_put_,
                                   torch.ops.aten._index_put_impl_, torch.ops.aten.sort):
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def gradients(gather, x, sorted_indices):
    x = x.clone().requires_grad_()
    rows = gather(x, sorted_indices, TOP_K)
    probe = torch.randn(rows.shape, generator=torch.Generator().manual_seed(1), dtype=rows.dtype)
    with IndexPutBackward() as seen:
        (rows * probe).sum().backward()
    return rows.detach(), x.grad, seen.calls


def test_same_rows_and_input_gradient_without_the_sorting_backward(stand_in, monkeypatch):
    module, importer = stand_in
    upstream = module.gather_routed_rows
    monkeypatch.setenv(mg.ENV, 'permutation')
    state = mg.install()
    assert state == {'setting': 'permutation', 'patched': ['unsloth_cached_moe_utils'],
                     'rebound': ['unsloth_zoo.temporary_patches.stand_in_importer']}
    patched = module.gather_routed_rows
    assert importer.gather_routed_rows is patched  # the by-name importer calls the wrapper too
    assert patches.patched_by(patched) == mg.PATCH and patches.upstream(patched) is upstream
    x, order = routed()
    rows_a, grad_a, calls_a = gradients(upstream, x, order)
    rows_b, grad_b, calls_b = gradients(patched, x, order)
    assert torch.equal(rows_a, rows_b)
    torch.testing.assert_close(grad_a, grad_b)  # the same sums, in another order
    assert calls_a and not calls_b  # upstream's eager backward accumulates by index; the permutation's does not
    # each token's gradient is the sum of its top_k routed rows' gradients
    assert grad_b.shape == x.shape
    # installing again changes nothing
    assert mg.install()['patched'] == ['unsloth_cached_moe_utils'] and module.gather_routed_rows is patched


def test_upstream_runs_where_the_condition_does_not_hold_and_with_the_switch_off(stand_in, monkeypatch):
    module, _ = stand_in
    upstream = module.gather_routed_rows
    assert mg.install({mg.ENV: 'index'}) == {'setting': 'index', 'patched': []}
    assert module.gather_routed_rows is upstream
    monkeypatch.setenv(mg.ENV, 'permutation')
    mg.install()
    x, order = routed()
    with torch.no_grad():  # inference: upstream's indexing, the same rows
        assert torch.equal(module.gather_routed_rows(x, order, TOP_K), upstream(x, order, TOP_K))
    partial = order[:-1]  # not a full permutation: upstream's path (its backward handles any index)
    y = x.clone().requires_grad_()
    module.gather_routed_rows(y, partial, TOP_K).sum().backward()
    assert y.grad is not None


def test_nothing_loaded_is_said():
    assert 'not loaded' in mg.install({mg.ENV: 'permutation'})['skipped']


def test_the_switch_and_the_inventory_agree():
    from swift_vora import switches
    assert switches.read(mg.ENV, {}) == 'index'  # opt-in until measured against its twin
    assert switches.read(mg.ENV, {mg.ENV: 'permutation'}) == 'permutation'
    patch = patches.BY_NAME[mg.PATCH]
    assert patch.target == f'{mg.MODULES[0]}:{mg.FUNCTION}' and patch.where == 'speed/moe_gather.py'
    assert patch.params == ('hidden_states', 'sorted_indices', 'top_k')
    assert mg.GATHER_CLASS in ''.join(patch.uses)


WHEELS = [w for w in [moe_wheels.wheel('unsloth_zoo')] if w]  # .whl/moe, else .fetched/wheels


@pytest.mark.skipif(not WHEELS, reason=moe_wheels.MISSING)
def test_the_real_function_is_the_one_the_wrapper_was_written_for():
    with zipfile.ZipFile(WHEELS[-1]) as z:
        source = z.read('unsloth_zoo/temporary_patches/moe_utils.py').decode()
    patch = patches.BY_NAME[mg.PATCH]
    at = source.index(f'def {mg.FUNCTION}(')
    body = source[at:source.index('\ndef ', at + 1)]
    assert f'def {mg.FUNCTION}({", ".join(patch.params)})' in body
    assert all(name in body for name in patch.uses)
    assert f'class {mg.GATHER_CLASS}(torch.autograd.Function)' in source
