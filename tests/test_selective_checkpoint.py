"""Selective activation checkpointing (swift_vora/speed/selective_checkpoint.py) on a tiny Qwen3-VL with PEFT LoRA
under bf16 autocast: the same loss and LoRA gradients as ms-swift's whole-layer (reentrant) checkpointing, LoRA
dropout included; the policy is engaged (it sees the layers' operators and saves the ones it names); and the
switch / skip rules a user sees."""
import types

import pytest
import torch
import torch.utils.checkpoint as checkpoint_module
from test_compile_layers import lora_model, train_steps

from swift_vora.speed import compile_layers, selective_checkpoint


class CountCalls:
    """Counts the calls of torch's own checkpoint made with a selective-checkpoint context_fn."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = checkpoint_module._old_checkpoint

        def counted(*args, **kwargs):
            if kwargs.get('context_fn') is not None:
                assert kwargs['use_reentrant'] is False
                self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(checkpoint_module, '_old_checkpoint', counted)


@pytest.mark.parametrize('which, dropout', [('attention', 0.3), ('matmul', 0.3), ('matmul', 0.0)])
def test_same_loss_and_lora_gradients_as_whole_layer_checkpointing(qwen3_vl_tiny_dir, reentrant_checkpoint, monkeypatch,
                                                                    which, dropout):
    lengths = (70, 67)
    ref_losses, ref_grads = train_steps(lora_model(qwen3_vl_tiny_dir, dropout=dropout), lengths)
    if dropout:
        other_losses, _ = train_steps(lora_model(qwen3_vl_tiny_dir, dropout=dropout), lengths, seed=1)
        assert other_losses != ref_losses  # the masks move the loss: equal losses below mean equal masks

    model = lora_model(qwen3_vl_tiny_dir, dropout=dropout)
    selective_checkpoint.reset_stats()
    calls = CountCalls(monkeypatch)
    assert selective_checkpoint.apply(model, which) == 2
    losses, grads = train_steps(model, lengths)

    assert calls.calls == 2 * len(lengths)  # each layer, each forward, went through the selective checkpoint
    stats = selective_checkpoint.stats()
    assert stats['layers'] == 2 and stats['saved'] > 0 and stats['recomputed'] > 0
    assert stats['policy_calls'] == stats['saved'] + stats['recomputed']
    assert losses == ref_losses
    assert set(grads) == set(ref_grads) and len(grads) == 28  # 2 layers x 7 projections x (A, B)
    for name in grads:  # the saved outputs are the forward's tensors, the recompute replays the same ops: bit-equal
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=0, msg=name)


def test_matmul_policy_saves_more_than_attention_policy(qwen3_vl_tiny_dir, reentrant_checkpoint):
    saved = {}
    for which in ('attention', 'matmul'):
        model = lora_model(qwen3_vl_tiny_dir)
        selective_checkpoint.reset_stats()
        selective_checkpoint.apply(model, which)
        train_steps(model, (70, ))
        saved[which] = selective_checkpoint.stats()['saved']
    # 2 layers x (7 projections + 7 LoRA A + 7 LoRA B) matmuls at least, on top of the attention kernels
    assert saved['matmul'] >= saved['attention'] + 2 * 21


def test_saved_ops_are_matmuls_and_attention():
    assert torch.ops.aten.mm.default in selective_checkpoint.saved_ops('matmul')
    assert torch.ops.aten.mm.default not in selective_checkpoint.saved_ops('attention')
    assert selective_checkpoint.saved_ops('attention') <= selective_checkpoint.saved_ops('matmul')
    assert torch.ops.aten.mul.Tensor not in selective_checkpoint.saved_ops('matmul')
    with pytest.raises(ValueError, match='SWIFT_VORA_SELECTIVE_CHECKPOINT'):
        selective_checkpoint.saved_ops('everything')


def test_mode_switch():
    env = selective_checkpoint.ENV
    assert selective_checkpoint.mode({}) == 'off' and not selective_checkpoint.enabled({})
    assert selective_checkpoint.mode({env: 'matmul'}) == 'matmul'
    assert selective_checkpoint.mode({env: '0'}) == 'off'
    with pytest.raises(ValueError, match=env):
        selective_checkpoint.mode({env: 'all'})


def test_callback_leaves_compiled_uncheckpointed_and_deepspeed_layers(monkeypatch, qwen3_vl_tiny_dir):
    callback = selective_checkpoint.SelectiveCheckpoint.__new__(selective_checkpoint.SelectiveCheckpoint)
    model = lora_model(qwen3_vl_tiny_dir)
    monkeypatch.setenv(selective_checkpoint.ENV, 'attention')
    callback.on_train_begin(types.SimpleNamespace(deepspeed='zero3'), None, None, model=model)
    assert callback.applied == 0
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=model)
    assert callback.applied == 2
    layers = compile_layers.decoder_layers(model)
    assert all(layer._gradient_checkpointing_func.saves == 'attention' for layer in layers)

    plain = lora_model(qwen3_vl_tiny_dir)
    plain.gradient_checkpointing_disable()  # --gradient_checkpointing false: nothing to make selective
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=plain)
    assert callback.applied == 0

    compiled = lora_model(qwen3_vl_tiny_dir)
    compile_layers.compile_decoder_layers(compiled, backend='aot_eager')  # compiled, checkpointed around: left alone
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=compiled)
    assert callback.applied == 0
