"""Gradient checkpointing of the first N decoder layers only (swift_vora/speed/partial_checkpoint.py) on a tiny
Qwen3-VL with PEFT LoRA under bf16 autocast, checkpointed the way ms-swift does it on one process (reentrant): the
same losses and LoRA gradients as checkpointing every layer, only N layers recomputed in the backward (counted from
the run, not assumed), the report a user reads, and the recipe / launch rules."""
import json
import types

import pytest
import torch
from test_compile_layers import lora_model, train_steps

from swift_vora.speed import compile_layers, partial_checkpoint


@pytest.mark.parametrize('n, recomputed', [(2, 2), (1, 1), (0, 0), (5, 2)])
def test_same_losses_and_gradients_with_only_n_layers_recomputed(qwen3_vl_tiny_dir, reentrant_checkpoint, n,
                                                                  recomputed):
    lengths = (70, 67)
    ref_losses, ref_grads = train_steps(lora_model(qwen3_vl_tiny_dir), lengths)

    model = lora_model(qwen3_vl_tiny_dir)
    layers = compile_layers.decoder_layers(model)
    done = partial_checkpoint.checkpoint_first(layers, n)
    assert done == {'layers': 2, 'asked': n, 'checkpointed_before': 2, 'checkpointed': min(n, 2),
                    'not_checkpointed': 2 - min(n, 2)}
    assert [layer.gradient_checkpointing for layer in layers] == [i < n for i in range(2)]  # the first n
    counter = partial_checkpoint.ForwardCounter(layers)
    losses, grads = train_steps(model, lengths)
    counts = counter.close()

    assert counts['forward_calls'] == [2, 2]  # one forward per layer per micro-batch
    assert counts['recompute_calls'] == [2 if i < n else 0 for i in range(2)]
    assert counts['recomputed_layers'] == recomputed
    assert losses == ref_losses
    assert set(grads) == set(ref_grads) and len(grads) == 28
    for name in grads:  # a kept layer runs the same ops once; a recomputed one replays them: bit-equal
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=0, msg=name)


def test_counter_sees_non_reentrant_recomputes_too(qwen3_vl_tiny_dir):
    model = lora_model(qwen3_vl_tiny_dir)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})
    layers = compile_layers.decoder_layers(model)
    partial_checkpoint.checkpoint_first(layers, 1)
    counter = partial_checkpoint.ForwardCounter(layers)
    train_steps(model, (70, ))
    assert counter.close()['recompute_calls'] == [1, 0]


def test_callback_applies_at_train_begin_and_reports_after_the_first_step(qwen3_vl_tiny_dir, reentrant_checkpoint,
                                                                           monkeypatch, tmp_path):
    monkeypatch.setenv('SWIFT_VORA_CHECKPOINT_LAYERS', '1')
    model = lora_model(qwen3_vl_tiny_dir)
    callback = partial_checkpoint.PartialCheckpoint.__new__(partial_checkpoint.PartialCheckpoint)
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    state = types.SimpleNamespace(is_world_process_zero=True, global_step=1)
    callback.on_train_begin(args, state, None, model=model)
    train_steps(model, (70, ))
    callback.on_step_end(args, state, None)
    report = json.loads((tmp_path / partial_checkpoint.REPORT).read_text())
    assert report['checkpointed'] == 1 and report['not_checkpointed'] == 1 and report['recomputed_layers'] == 1
    assert callback.counter is None  # the hooks are gone after the first step
    assert not any(layer._forward_pre_hooks for layer in compile_layers.decoder_layers(model))

    # compiled layers: no hooks (dynamo would trace them, and their removal would recompile every layer)
    monkeypatch.setenv('SWIFT_VORA_COMPILE', 'layers')
    model = lora_model(qwen3_vl_tiny_dir)
    callback.on_train_begin(types.SimpleNamespace(output_dir=str(tmp_path), deepspeed=None), state, None, model=model)
    assert callback.counter is None and callback.done['recomputed_layers'].startswith('not counted')
    assert json.loads((tmp_path / partial_checkpoint.REPORT).read_text())['recomputed_layers'].startswith('not')
    assert not any(layer._forward_pre_hooks for layer in compile_layers.decoder_layers(model))


def test_nothing_changes_where_the_decoder_is_not_checkpointed(qwen3_vl_tiny_dir):
    model = lora_model(qwen3_vl_tiny_dir)
    model.gradient_checkpointing_disable()
    done, counter = partial_checkpoint.apply(model, 1, count=False)
    assert done['checkpointed_before'] == 0 and done['checkpointed'] == 0 and counter is None
    assert '(gradient checkpointing is off); nothing changed' in partial_checkpoint.describe(done)


def test_switch_unset_means_every_layer_and_bad_values_are_refused(monkeypatch):
    from swift_vora.switches import SwitchError
    monkeypatch.delenv('SWIFT_VORA_CHECKPOINT_LAYERS', raising=False)
    assert partial_checkpoint.layers_to_checkpoint() is None and not partial_checkpoint.enabled()
    monkeypatch.setenv('SWIFT_VORA_CHECKPOINT_LAYERS', '30')
    assert partial_checkpoint.layers_to_checkpoint() == 30
    monkeypatch.setenv('SWIFT_VORA_CHECKPOINT_LAYERS', 'half')
    with pytest.raises(SwitchError, match='SWIFT_VORA_CHECKPOINT_LAYERS'):
        partial_checkpoint.layers_to_checkpoint()


def test_unsloth_runner_applies_it_and_reports_the_first_steps_recomputes(qwen3_vl_tiny_dir, reentrant_checkpoint,
                                                                          monkeypatch):
    from swift_vora.backends import unsloth_runner
    model, info = lora_model(qwen3_vl_tiny_dir), {}
    monkeypatch.delenv('SWIFT_VORA_CHECKPOINT_LAYERS', raising=False)
    assert unsloth_runner._partial_checkpoint(model, info) is None and 'partial_checkpoint' not in info
    monkeypatch.setenv('SWIFT_VORA_CHECKPOINT_LAYERS', '1')
    counter = unsloth_runner._partial_checkpoint(model, info)
    train_steps(model, (70, ))
    info['partial_checkpoint'].update(counter.close())
    assert info['partial_checkpoint']['checkpointed'] == 1 and info['partial_checkpoint']['recomputed_layers'] == 1
    assert '1 decoder layers ran their forward again' in partial_checkpoint.describe_recomputes(
        info['partial_checkpoint'])
