"""LoRA inputs in the autocast dtype: same outputs and LoRA gradients as PEFT's fp32 cast, no fp32 copy of the input,
and PEFT's cast comes back when autocast is off."""
import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from swift_vora.speed import lora_autocast


class Block(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def peft_model(seed=0):
    torch.manual_seed(seed)
    base = Block().to(torch.bfloat16)  # bf16 base, PEFT makes the adapters fp32 (autocast_adapter_dtype=True)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=['up', 'down']))
    for name, p in model.named_parameters():
        if 'lora_B' in name:  # non-zero B so that the adapter path contributes
            torch.nn.init.normal_(p, std=0.02)
    return model


def lora_input_dtypes(model):
    seen = []
    for module in lora_autocast.upcasting_lora_layers(model):
        for a in module.lora_A.values():
            a.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    return seen


def run(model, x):
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(x)
    out.float().pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def test_same_output_and_lora_grads_without_the_fp32_copy():
    x = torch.randn(4, 16, 64, dtype=torch.bfloat16)
    reference = peft_model()
    fast = copy.deepcopy(reference)
    ref_dtypes, fast_dtypes = lora_input_dtypes(reference), lora_input_dtypes(fast)

    assert lora_autocast.keep_lora_inputs_in_autocast_dtype(fast) == 2
    ref_out, ref_grads = run(reference, x)
    fast_out, fast_grads = run(fast, x)

    assert set(ref_dtypes) == {torch.float32}  # PEFT's default: an fp32 copy of every LoRA input
    assert set(fast_dtypes) == {torch.bfloat16}  # the fast path: the input as autocast has it
    assert torch.equal(ref_out, fast_out)
    assert set(ref_grads) == set(fast_grads) and any('lora_A' in n for n in fast_grads)
    for name in ref_grads:
        if 'lora_' in name:
            assert fast_grads[name].dtype == torch.float32  # the adapters (and their Adam states) stay fp32
        torch.testing.assert_close(fast_grads[name], ref_grads[name], rtol=1e-2, atol=1e-5, msg=name)


def test_peft_cast_restored_when_autocast_is_off():
    model = peft_model()
    assert lora_autocast.keep_lora_inputs_in_autocast_dtype(model) == 2
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError):  # bf16 input into fp32 adapters without autocast: what the check prevents
        torch.nn.functional.linear(x, torch.zeros(8, 64))
    out = model(x)  # the first forward sees no autocast and switches PEFT's cast back on: no dtype error
    assert out.dtype == torch.bfloat16
    assert all(layer.cast_input_dtype_enabled for layer in lora_autocast.upcasting_lora_layers(model))


def test_nothing_to_do_when_adapters_have_the_base_dtype():
    torch.manual_seed(0)
    model = get_peft_model(Block(), LoraConfig(r=4, target_modules=['up']))  # fp32 base, fp32 adapters
    assert lora_autocast.keep_lora_inputs_in_autocast_dtype(model) == 0


def test_env_switch(monkeypatch):
    monkeypatch.setenv(lora_autocast.ENV, '0')
    assert not lora_autocast.enabled()
    monkeypatch.setenv(lora_autocast.ENV, '1')
    assert lora_autocast.enabled()
