"""The frozen experts under an expert LoRA as one grouped GEMM per product
(swift_vora/backends/megatron_expert_base.py), on the CPU, where torch._grouped_mm runs too. Transformer Engine's
grouped linear cannot be built without CUDA, so a stand-in with its interface (weight0..weightN, num_gemms,
use_bias, te_return_bias, parallel_mode, tp_size, config, forward(x, m_splits) -> (out, None)) computes the reference
as TE does: each expert's rows through that expert's weight."""
from types import SimpleNamespace

import pytest
import torch

from swift_vora import patches, switches
from swift_vora.backends import megatron_expert_base as meb
from swift_vora.backends import megatron_expert_lora as mel

SPLITS = [5, 0, 11, 8]  # one expert without a token


class StandInGroupedLinear(torch.nn.Module):
    """What megatron-core's TEGroupedLinear offers this module, with TE's per-expert product as its forward."""

    def __init__(self, num_gemms=4, inp=16, out=24, dtype=torch.float32, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        # what megatron-core's TEColumnParallelGroupedLinear leaves on an expert layer at EP 1, TP 1
        self.num_gemms, self.use_bias, self.te_return_bias = num_gemms, False, False
        self.parallel_mode, self.tp_size = 'column', 1
        self.config = SimpleNamespace(fp8=None, fp4=None, cpu_offloading=False)
        for i in range(num_gemms):
            self.register_parameter(f'weight{i}', torch.nn.Parameter(torch.randn(out, inp, dtype=dtype),
                                                                     requires_grad=False))
        self.te_calls = 0

    def forward(self, x, m_splits):
        self.te_calls += 1
        rows = x.reshape(-1, x.shape[-1])
        parts, start = [], 0
        for i, split in enumerate(m_splits):
            parts.append(rows[start:start + split] @ getattr(self, f'weight{i}').t())
            start += split
        out = torch.cat(parts)
        return out.view(*x.shape[:-1], out.shape[-1]), None


def grouped(**kwargs):
    layer = StandInGroupedLinear(**kwargs)
    lora = SimpleNamespace(is_grouped=True, is_expert=True, base_layer=layer)
    assert meb.use_grouped_base(lora)
    return layer


@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_products_and_input_gradients_equal_the_per_expert_ones(dtype, tol):
    reference, layer = StandInGroupedLinear(dtype=dtype), grouped(dtype=dtype)
    assert isinstance(layer, StandInGroupedLinear)  # mcore-bridge's isinstance checks still hold
    x = torch.randn(sum(SPLITS), 16, dtype=dtype)
    g = torch.randn(sum(SPLITS), 24, dtype=dtype)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    want, _ = reference(xs[0], SPLITS)
    got, bias = layer(xs[1], SPLITS)
    assert bias is None and got.dtype == dtype and layer.te_calls == 0
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    (want.float() * g.float()).sum().backward()
    (got.float() * g.float()).sum().backward()
    torch.testing.assert_close(xs[1].grad.float(), xs[0].grad.float(), atol=tol * 4, rtol=tol)
    assert all(getattr(layer, f'weight{i}').grad is None for i in range(4))


def test_a_token_dimension_in_front_is_kept():
    reference, layer = StandInGroupedLinear(), grouped()
    x = torch.randn(2, 12, 16)
    torch.testing.assert_close(layer(x, [6, 6, 0, 12])[0], reference(x, [6, 6, 0, 12])[0])
    assert layer(x, [6, 6, 0, 12])[0].shape == (2, 12, 24)


def test_the_weights_become_rows_of_one_stack_with_their_names_and_values():
    reference, layer = StandInGroupedLinear(), grouped()
    params = [getattr(layer, f'weight{i}') for i in range(4)]
    keys = list(layer.state_dict())
    layer(torch.randn(24, 16), SPLITS)
    stack = getattr(layer, meb.STACK)
    assert stack.shape == (4, 24, 16)
    for i, p in enumerate(params):
        assert getattr(layer, f'weight{i}') is p  # the same Parameter: optimizer, hooks, names untouched
        assert p.data_ptr() == stack[i].data_ptr() and torch.equal(p, getattr(reference, f'weight{i}'))
    assert list(layer.state_dict()) == keys  # the stack is not saved with the checkpoint
    layer(torch.randn(24, 16), SPLITS)
    assert getattr(layer, meb.STACK) is stack  # stacked once


def test_a_merge_into_the_weights_is_seen_in_place_or_replaced():
    """mcore-bridge's merge adds the LoRA delta in place (`orig_weight.data += delta`) or assigns a checked copy
    (`weight.data = orig_weights[i]`): the grouped forward computes with the merged weights either way."""
    reference, layer = StandInGroupedLinear(), grouped()
    x = torch.randn(24, 16)
    layer(x, SPLITS)
    delta = torch.randn(24, 16)
    layer.weight2.data += delta  # in place: a view of the stack
    reference.weight2.data += delta
    torch.testing.assert_close(layer(x, SPLITS)[0], reference(x, SPLITS)[0])
    layer.weight0.data = reference.weight0.data.clone() * 2  # replaced: stacked again
    reference.weight0.data = reference.weight0.data * 2
    torch.testing.assert_close(layer(x, SPLITS)[0], reference(x, SPLITS)[0])
    assert layer.weight0.data_ptr() == getattr(layer, meb.STACK)[0].data_ptr()


def test_what_it_cannot_take_runs_te_s_forward():
    x = torch.randn(24, 16)
    trainable = grouped()
    for i in range(4):
        getattr(trainable, f'weight{i}').requires_grad_(True)  # full SFT: TE computes the weight gradients
    trainable(x, SPLITS)
    assert trainable.te_calls == 1 and meb.STACK not in vars(trainable)
    fp8 = grouped()
    fp8.config.fp8 = 'hybrid'
    fp8(x, SPLITS)
    assert fp8.te_calls == 1
    unaligned = grouped(inp=12)
    unaligned(torch.randn(24, 12), SPLITS)
    assert unaligned.te_calls == 1 and 'multiples of 8' in vars(unaligned)[meb.WHY]
    returns_bias, tensor_parallel = grouped(), grouped()
    returns_bias.te_return_bias = True
    tensor_parallel.tp_size = 2
    for layer in (returns_bias, tensor_parallel):
        layer(x, SPLITS)
        assert layer.te_calls == 1
    assert meb.call_reason(grouped(), [torch.zeros(8, 8)]) is None


def test_only_an_expert_layers_base_changes_and_once():
    layer = StandInGroupedLinear()
    lora = SimpleNamespace(is_grouped=True, is_expert=True, base_layer=layer)
    assert meb.use_grouped_base(lora) and not meb.use_grouped_base(lora)
    assert type(layer).__name__ == 'GroupedMMFrozenExperts'
    dense = SimpleNamespace(is_grouped=False, is_expert=False, base_layer=StandInGroupedLinear())
    assert not meb.use_grouped_base(dense) and type(dense.base_layer) is StandInGroupedLinear


def test_the_wrapper_runs_after_mcore_bridges_update_layer_beside_the_lora_one(monkeypatch):
    monkeypatch.setattr(patches, 'applicable', lambda name: name in (meb.PATCH, mel.PATCH))

    class StandInLora:  # mcore-bridge's update_layer builds the factors around its base
        def update_layer(self, adapter_name, r, *, lora_alpha, **kwargs):
            self.is_grouped, self.is_expert, self.lora_bias = True, True, {}
            self.base_layer = StandInGroupedLinear()
            self.lora_A, self.lora_B = {}, {}
            return 'built'

    assert meb.install(StandInLora)
    assert not meb.install(StandInLora)  # already there
    layer = StandInLora()
    assert layer.update_layer('default', 8, lora_alpha=16, lora_dropout=0.0) == 'built'
    assert type(layer.base_layer).__name__ == 'GroupedMMFrozenExperts'
    assert patches.patched_by(StandInLora.update_layer) == meb.PATCH


def test_two_patches_on_one_target_each_install_once():
    def target():
        return 'upstream'

    first = patches.mark(lambda: target(), mel.PATCH, target)
    second = patches.mark(lambda: first(), meb.PATCH, first)
    assert patches.in_chain(second, mel.PATCH) and patches.in_chain(second, meb.PATCH)
    assert not patches.in_chain(first, meb.PATCH) and not patches.in_chain(target, mel.PATCH)
    assert patches.upstream(second) is target


def test_the_switch():
    assert not meb.wanted({}) and meb.wanted({meb.ENV: 'grouped_mm'})
    with pytest.raises(switches.SwitchError, match=meb.ENV):
        meb.wanted({meb.ENV: 'grouped'})
