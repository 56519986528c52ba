"""Regional torch.compile of the decoder layers (swift_vora/speed/compile_layers.py) on a tiny Qwen3-VL with PEFT LoRA,
transformers' gradient checkpointing (reentrant, as ms-swift uses on one process) and bf16 autocast: the same loss
and LoRA gradients as eager, no graph break (the lora_autocast check sits outside the compiled layers), one graph
shared by all layers, and the switch/skip rules a user sees."""
import functools
import types

import pytest
import torch
import torch._dynamo
import torch.utils.checkpoint as checkpoint_module
from peft import LoraConfig, get_peft_model

from swift_vora.speed import compile_layers, lora_autocast


def force_reentrant_checkpoint(monkeypatch):
    """What swift's `_fix_gradient_checkpointing` does on one process: every checkpoint call is reentrant, and
    torch's own function is kept as `torch.utils.checkpoint._old_checkpoint`."""
    original = checkpoint_module.checkpoint
    monkeypatch.setattr(checkpoint_module, '_old_checkpoint', original, raising=False)
    monkeypatch.setattr(checkpoint_module, 'checkpoint',
                        functools.wraps(original)(lambda *a, use_reentrant=None, **k: original(
                            *a, use_reentrant=True, **k)))


def lora_model(model_dir, dropout=0.0):
    from transformers import AutoModelForImageTextToText
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16)
    # LoRA on the language model's linear layers, as swift's all-linear does for a multimodal model
    model = get_peft_model(model, LoraConfig(r=8, target_modules=r'.*language_model.*_proj', lora_dropout=dropout))
    for name, p in model.named_parameters():
        if 'lora_B' in name:
            torch.nn.init.normal_(p, std=0.02)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})
    model.enable_input_require_grads()
    model.train()
    assert lora_autocast.keep_lora_inputs_in_autocast_dtype(model) == 14
    return model


def train_steps(model, lengths, seed=0, device='cpu'):
    losses = []
    for i, length in enumerate(lengths):
        ids = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
        torch.manual_seed(seed + i)  # dropout masks (CPU and CUDA generators)
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.item())
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses, grads


def grad_diff(a, b):
    return max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in b)


def test_finds_the_decoder_layers_not_the_vision_blocks(qwen3_vl_tiny_dir):
    model = lora_model(qwen3_vl_tiny_dir)
    layers = compile_layers.decoder_layers(model)
    assert [type(x).__name__ for x in layers] == ['Qwen3VLTextDecoderLayer'] * 2
    assert layers[0] is model.base_model.model.model.language_model.layers[0]


@pytest.mark.parametrize('place, dropout', [('graph', 0.3), ('eager', 0.0)])
def test_compiled_layers_train_like_eager(qwen3_vl_tiny_dir, reentrant_checkpoint, place, dropout):
    """The same training as eager reentrant checkpointing: checkpointed inside the compiled graph, with LoRA dropout
    (AOTAutograd replays the forward's RNG state in the recompute: same seed, same masks, same loss); around it,
    bit-identical (its dropout is checked with inductor below)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them, and an earlier test compiled too
    lengths = (70, 67, 70)  # a second length: the dynamic-shape recompile is exercised too
    eager_losses, eager_grads = train_steps(lora_model(qwen3_vl_tiny_dir, dropout=dropout), lengths)
    other_losses, other_grads = train_steps(lora_model(qwen3_vl_tiny_dir, dropout=0.3), lengths, seed=1)
    assert other_losses != eager_losses  # other masks move the loss

    model = lora_model(qwen3_vl_tiny_dir, dropout=dropout)
    names_before = [n for n, _ in model.named_parameters()]
    assert compile_layers.compile_decoder_layers(model, backend='aot_eager', checkpoint=place) == 2
    layers = compile_layers.decoder_layers(model)
    assert [layer.gradient_checkpointing for layer in layers] == [place == 'eager'] * 2
    losses, grads = train_steps(model, lengths)

    assert [n for n, _ in model.named_parameters()] == names_before  # in place: adapter names/saving unchanged
    assert losses == eager_losses
    assert set(grads) == set(eager_grads) and len(grads) == 28  # 2 layers x 7 projections x (A, B)
    if place == 'eager':
        for name in grads:
            torch.testing.assert_close(grads[name], eager_grads[name], rtol=0, atol=0, msg=name)
    else:  # same masks; the compiled backward sums the recomputed bf16 terms in its own order
        assert grad_diff(grads, eager_grads) < 0.02 < 0.5 < grad_diff(other_grads, eager_grads)  # seen: 0.007
    counters = compile_layers.compile_counters()
    assert counters['graph_breaks'] == 0, counters['graph_break_reasons']
    # Shared by both layers: in the graph, one training graph per shape class; around it, one per grad mode
    # (checkpoint's no-grad forward, its recompute) and shape class.
    assert counters['unique_graphs'] == (2 if place == 'graph' else 4)
    assert checkpoint_module.checkpoint is not checkpoint_module._old_checkpoint  # ms-swift's is back after the calls
    assert not any(layer.cast_input_dtype_enabled for layer in lora_autocast.upcasting_lora_layers(model))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):  # eval / no-grad: no checkpoint
        model.eval()
        ids = torch.randint(0, 1000, (1, 70), generator=torch.Generator().manual_seed(70))
        assert torch.isfinite(model(input_ids=ids).logits).all()


@pytest.mark.slow
def test_inductor_checkpoint_in_graph_gradient_is_that_of_the_computed_loss(qwen3_vl_tiny_dir, reentrant_checkpoint):
    """Inductor draws its own dropout masks, so no eager run can serve as the reference. What must hold: the
    gradient that backward returns (from the recompute inside the compiled backward) is the derivative of the loss
    the forward computed, i.e. the recompute used the forward's masks. Checked against a central finite difference
    along a random direction of the LoRA weights, in float32; the gradient of the same loss under other masks
    (seed 8) misses it by far, so the check can fail. CPU only: on the H200's torch 2.11 inductor's partitioner
    rejects this graph (`AssertionError: Node add_538 was invalid, but is output`, docs/runs/benchmarks-log.md),
    which is why `SWIFT_VORA_COMPILE_CHECKPOINT=graph` is not the default."""
    from transformers import AutoModelForImageTextToText
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(qwen3_vl_tiny_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=r'.*language_model.*_proj', lora_dropout=0.5))
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    gen = torch.Generator().manual_seed(1)
    for name, p in lora.items():
        if 'lora_B' in name:  # small enough for the loss to be near-linear over eps (checked on eager: 0.1 %)
            torch.nn.init.normal_(p, std=0.02, generator=gen)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})
    model.enable_input_require_grads()
    model.train()
    compile_layers.compile_decoder_layers(model, backend='inductor', checkpoint='graph')
    ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(3))

    def loss(seed):
        torch.manual_seed(seed)
        return model(input_ids=ids, labels=ids).loss

    def gradient(seed):
        model.zero_grad()
        loss(seed).backward()
        return {n: p.grad.detach().clone() for n, p in lora.items()}

    grad, other_grad = gradient(7), gradient(8)
    direction = {n: torch.randn(p.shape, generator=gen) for n, p in lora.items()}

    def loss_moved(step):  # the loss (same masks: same seed, same training graph) at weights + step * direction
        with torch.no_grad():
            for n, p in lora.items():
                p += step * direction[n]
        value = loss(7).item()
        with torch.no_grad():
            for n, p in lora.items():
                p -= step * direction[n]
        return value

    eps = 1e-3
    up, down = loss_moved(eps), loss_moved(-eps)
    finite_difference = (up - down) / (2 * eps)
    analytic = sum((grad[n] * direction[n]).sum().item() for n in lora)
    other = sum((other_grad[n] * direction[n]).sum().item() for n in lora)
    assert abs(analytic - finite_difference) < 0.02 * abs(finite_difference), (analytic, finite_difference)
    assert abs(other - finite_difference) > 0.2 * abs(finite_difference), (other, finite_difference)
    assert compile_layers.compile_counters()['graph_breaks'] == 0


def inductor_dropout_run(qwen3_vl_tiny_dir, monkeypatch, seed, use_checkpoint, device, lengths):
    """The tiny LoRA model with dropout 0.5 and a large adapter path (so that masks show in loss and gradients),
    layers compiled with inductor, trained on `device` with or without the reentrant checkpoint around them."""
    torch._dynamo.reset()
    model = lora_model(qwen3_vl_tiny_dir, dropout=0.5).to(device)
    for name, p in model.named_parameters():
        if 'lora_B' in name:
            torch.nn.init.normal_(p, std=0.5, generator=torch.Generator(device=device).manual_seed(1))
    if use_checkpoint:
        force_reentrant_checkpoint(monkeypatch)
    else:
        model.gradient_checkpointing_disable()
    compile_layers.compile_decoder_layers(model, backend='inductor', checkpoint='eager')
    result = train_steps(model, lengths, seed=seed, device=device)
    monkeypatch.undo()
    return result


@pytest.mark.slow
def test_inductor_dropout_under_checkpoint_keeps_the_masks(qwen3_vl_tiny_dir, monkeypatch):
    """Checkpointing around the compiled layer (`SWIFT_VORA_COMPILE_CHECKPOINT=eager`). Inductor itself (C++
    kernels on CPU) with LoRA dropout: checkpointing must not change what is trained. The
    checkpointed forward runs the no-grad graph and its recompute the training graph; had either drawn other
    dropout masks, loss and gradients would move as far as with another seed (the contrast below), not by the
    bf16 rounding of differently fused kernels."""

    def run(use_checkpoint, seed):
        losses, grads = inductor_dropout_run(qwen3_vl_tiny_dir, monkeypatch, seed, use_checkpoint, 'cpu', (64,))
        return losses[0], grads

    plain_loss, plain_grads = run(False, seed=7)
    ckpt_loss, ckpt_grads = run(True, seed=7)
    other_loss, other_grads = run(False, seed=8)
    assert abs(ckpt_loss - plain_loss) < 1e-4 * plain_loss < abs(other_loss - plain_loss)  # seen: 2e-6 vs 4e-3
    assert grad_diff(ckpt_grads, plain_grads) < 0.2 < grad_diff(other_grads, plain_grads)  # seen: 0.06 vs 1.96


@pytest.mark.gpu
def test_cuda_checkpointed_compiled_layers_keep_the_masks(qwen3_vl_tiny_dir, monkeypatch):
    """The test above on the GPU (Triton kernels, Philox RNG) over four steps: checkpointed around the compiled
    layers, the no-grad forward and its recompute draw the same masks, so losses and gradients are those of the same
    compiled layers without checkpointing (seen on the H200: within 4e-4 of 11.9), not those of another seed."""
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU (run on the GPU machine: bash scripts/gpu/run_all.sh e2e)')
    def run(use_checkpoint, seed):
        return inductor_dropout_run(qwen3_vl_tiny_dir, monkeypatch, seed, use_checkpoint, 'cuda', (64, 64, 64, 64))

    plain_losses, plain_grads = run(False, seed=7)
    losses, grads = run(True, seed=7)
    other_losses, other_grads = run(False, seed=100)  # seeds 100-103: no overlap with 7-10
    tolerance = 2e-4 * max(plain_losses)
    assert max(abs(a - b) for a, b in zip(losses, plain_losses)) < tolerance, (losses, plain_losses)
    assert max(abs(a - b) for a, b in zip(other_losses, plain_losses)) > tolerance, (other_losses, plain_losses)
    assert grad_diff(grads, plain_grads) < 0.2 < grad_diff(other_grads, plain_grads)


class DropoutBlock(torch.nn.Module):
    """Two dropouts on two branches, like PEFT's per-projection lora_dropout."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        self.drop_a, self.drop_b = torch.nn.Dropout(0.3), torch.nn.Dropout(0.3)

    def forward(self, x):
        return self.a(self.drop_a(x)) + self.b(self.drop_b(torch.nn.functional.silu(x)))


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.gpu)])
def test_compiled_recompute_redraws_the_same_dropout_masks(device):
    """What torch.utils.checkpoint relies on: same RNG state -> the no-grad graph and the training graph draw the
    same masks. Checked with inductor on the GPU too (Triton Philox there, C++ here)."""
    if device == 'cuda' and not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU (run on the GPU machine: bash scripts/gpu/run_all.sh e2e)')
    torch._dynamo.reset()
    block = DropoutBlock().to(device)
    block.compile()
    x = torch.randn(4, 100, 64, device=device, requires_grad=True)
    for _ in range(2):
        cpu_state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state() if device == 'cuda' else None
        with torch.no_grad():
            first = block(x)
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state)
        again = block(x)
        assert torch.equal(first, again.detach())
        assert not torch.equal(first, block(x).detach())  # and a later call draws new masks


def test_mode_switch(monkeypatch):
    assert compile_layers.checkpoint_place({}) == 'eager'
    assert compile_layers.checkpoint_place({compile_layers.CHECKPOINT_ENV: 'graph'}) == 'graph'
    with pytest.raises(ValueError, match='SWIFT_VORA_COMPILE_CHECKPOINT'):
        compile_layers.checkpoint_place({compile_layers.CHECKPOINT_ENV: 'outside'})
    assert compile_layers.mode({}) == 'off'
    assert compile_layers.mode({compile_layers.ENV: 'layers'}) == 'layers'
    assert compile_layers.mode({compile_layers.ENV: '0'}) == 'off'
    with pytest.raises(ValueError, match='SWIFT_VORA_COMPILE'):
        compile_layers.mode({compile_layers.ENV: 'everything'})


def test_callback_skips_deepspeed_and_off(monkeypatch, qwen3_vl_tiny_dir):
    model = lora_model(qwen3_vl_tiny_dir)
    callback = compile_layers.CompileDecoderLayers.__new__(compile_layers.CompileDecoderLayers)
    monkeypatch.setenv(compile_layers.ENV, 'off')
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=model)
    assert callback.compiled == 0
    monkeypatch.setenv(compile_layers.ENV, 'layers')
    callback.on_train_begin(types.SimpleNamespace(deepspeed='zero3'), None, None, model=model)
    assert callback.compiled == 0
    assert all(layer._compiled_call_impl is None for layer in compile_layers.decoder_layers(model))
    monkeypatch.setenv(compile_layers.BACKEND_ENV, 'aot_eager')
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=model)
    assert callback.compiled == 2
    assert all(layer._compiled_call_impl is not None for layer in compile_layers.decoder_layers(model))


def test_compile_mode_reaches_inductor_and_is_ignored_elsewhere(monkeypatch, caplog):
    """SWIFT_VORA_COMPILE_MODE (reduce-overhead: CUDA graphs) is what torch.compile gets for the decoder layers
    and the vision blocks with inductor; with another backend torch would hand the mode to it as an unknown
    argument, so it is dropped, saying so."""
    import logging
    assert compile_layers.compile_options('inductor', 'default') == {'backend': 'inductor'}
    assert compile_layers.compile_options('inductor', 'reduce-overhead') == {'backend': 'inductor',
                                                                              'mode': 'reduce-overhead'}
    with caplog.at_level(logging.WARNING, logger='swift'):
        assert compile_layers.compile_options('aot_eager', 'max-autotune') == {'backend': 'aot_eager'}
    assert 'applies to the inductor backend only' in caplog.text

    seen = []

    class Layer(torch.nn.Module):
        def compile(self, **kwargs):
            seen.append(kwargs)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

    monkeypatch.setattr(compile_layers, 'decoder_layers', lambda model: list(model.layers))
    assert compile_layers.compile_decoder_layers(Model(), backend='inductor', inductor_mode='reduce-overhead') == 2
    assert seen == [{'backend': 'inductor', 'mode': 'reduce-overhead'}] * 2
    from swift_vora import switches
    with pytest.raises(ValueError, match='SWIFT_VORA_COMPILE_MODE'):
        switches.read('SWIFT_VORA_COMPILE_MODE', {'SWIFT_VORA_COMPILE_MODE': 'fastest'})
