"""Guard `lora_update`: a frozen adapter tensor trains nothing, silently; the guard counts and stops."""
import json
import os
import textwrap
import types

import peft
import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])
import torch

from swift_vora.guards.lora_update import expert_group, split_unchanged


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _lora_model(freeze=None):
    torch.manual_seed(0)
    model = peft.get_peft_model(TinyNet(), peft.LoraConfig(r=4, target_modules=['up', 'down']))
    if freeze:
        dict(model.named_parameters())[freeze].requires_grad_(False)
    return model


def _train(model, guard, trainer, steps=3, lrs=None):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    trainer.optimizer = optimizer
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    guard.on_train_begin(trainer.args, trainer.state, None)
    losses = []
    for step in range(steps):
        lr = (lrs or [1e-2] * steps)[step]
        for group in optimizer.param_groups:
            group['lr'] = lr
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        guard.on_optimizer_step(trainer.args, trainer.state, None)
        optimizer.zero_grad()
        trainer.state.global_step += 1
        losses.append(float(loss))
    return losses


def _fake_trainer(model, tmp_path):
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    trainer = types.SimpleNamespace(args=args, model=model, accelerator=None, state=types.SimpleNamespace(
        global_step=0), is_deepspeed_enabled=False)
    trainer._get_learning_rate = lambda: trainer.optimizer.param_groups[0]['lr']
    return trainer


FROZEN = 'base_model.model.down.lora_B.default.weight'


def test_frozen_adapter_tensor_is_silent_then_caught(tmp_path):
    from swift_vora.guards.common import GuardError
    from swift_vora.guards.lora_update import LoraUpdateGuard

    # Reproduce: training runs, the loss goes down, and the frozen lora_B is still all zeros.
    model = _lora_model(freeze=FROZEN)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert float(dict(model.named_parameters())[FROZEN].abs().sum()) == 0.0

    # The guard: 3 of 4 updated, stop, naming the tensor.
    model = _lora_model(freeze=FROZEN)
    trainer = _fake_trainer(model, tmp_path)
    guard = LoraUpdateGuard(trainer.args, trainer)
    with pytest.raises(GuardError, match=r'3 of 4 adapter tensors updated.*down\.lora_B.*requires_grad=False'):
        _train(model, guard, trainer)
    report = json.load(open(tmp_path / 'lora_update.json'))
    assert report['not_updated'] == [FROZEN] and report['requires_grad_false'] == [FROZEN]


def test_healthy_adapter_and_warmup_step_not_counted(tmp_path):
    from swift_vora.guards.lora_update import LoraUpdateGuard
    model = _lora_model()
    trainer = _fake_trainer(model, tmp_path)
    guard = LoraUpdateGuard(trainer.args, trainer)
    # lr 0 on the first step (linear warm-up): nothing moves and that step must not count.
    _train(model, guard, trainer, steps=3, lrs=[0.0, 1e-2, 1e-2])
    report = json.load(open(tmp_path / 'lora_update.json'))
    assert report['updated'] == report['of'] == 4 and report['not_updated'] == []
    assert [s['counted'] for s in report['steps']] == [False, True, True]
    first = report['steps'][1]
    assert first['lora_B'] == [2, 2]


def test_checksum_sees_a_one_ulp_change():
    from swift_vora.guards.lora_update import AdapterTracker
    model = _lora_model()
    tracker = AdapterTracker(model)
    tracker.snapshot()
    param = tracker.params[0]
    with torch.no_grad():
        flat = param.view(-1)
        flat[3] = torch.nextafter(flat[3], torch.tensor(10.0))
    changed = tracker.changed_since_baseline()
    assert changed[0] and not any(changed[1:])


FREEZE_PLUGIN = textwrap.dedent('''
    """Test plugin: marks one adapter tensor frozen before the optimizer is built (a wrongly frozen module)."""
    from swift.callbacks import TrainerCallback, callbacks_map


    class FreezeOneLora(TrainerCallback):
        def on_init_end(self, args, state, control, **kwargs):
            for name, param in self.trainer.model.named_parameters():
                if 'layers.1.mlp.down_proj.lora_B' in name:
                    param.requires_grad_(False)


    callbacks_map['freeze_one_lora'] = FreezeOneLora
''')


@pytest.mark.slow
def test_real_run_with_a_frozen_adapter(tiny_model_dir, guard_sft, tmp_path):
    from safetensors.torch import load_file
    plugin = tmp_path / 'freeze_plugin.py'
    plugin.write_text(FREEZE_PLUGIN)
    rows = guard_sft.text_rows(tmp_path / 'rows.jsonl', 3)
    extra = ('--custom_register_path', 'swift_vora', str(plugin), '--callbacks', 'freeze_one_lora')
    # Reproduce (guards off): the run succeeds; the saved adapter has that lora_B all zero.
    off = guard_sft(tiny_model_dir, rows, tmp_path / 'off', extra=extra, env={'SWIFT_VORA_GUARDS': 'none'})
    assert off['rc'] == 0, off['log'][-3000:]
    ckpt = sorted(p for p in os.listdir(off['run_dir']) if p.startswith('checkpoint-'))[-1]
    saved = load_file(os.path.join(off['run_dir'], ckpt, 'adapter_model.safetensors'))
    frozen = [k for k in saved if 'layers.1.mlp.down_proj.lora_B' in k]
    assert frozen and all(float(saved[k].abs().sum()) == 0 for k in frozen)
    assert all(float(saved[k].abs().sum()) > 0 for k in saved if 'lora_B' in k and k not in frozen)
    # Guard on: stops after the second optimizer step with the count and the name.
    on = guard_sft(tiny_model_dir, rows, tmp_path / 'on', extra=extra, env={'SWIFT_VORA_GUARDS': 'lora_update'})
    assert on['rc'] != 0
    assert '[swift-vora guard lora_update] 27 of 28 adapter tensors updated' in on['log']
    assert 'layers.1.mlp.down_proj.lora_B.default.weight (requires_grad=False)' in on['log']


@pytest.mark.slow
def test_ddp_run_reports_all_updated(guards_ddp_run):
    assert guards_ddp_run['rc'] == 0, guards_ddp_run['log'][-3000:]
    report = json.load(open(os.path.join(guards_ddp_run['run_dir'], 'lora_update.json')))
    assert report['updated'] == report['of'] == 28
    assert 'swift-vora lora_update: 28 of 28 adapter tensors updated' in guards_ddp_run['log']


@pytest.mark.parametrize('name, group', [
    ('language_model.decoder.layers.3.mlp.experts.linear_fc1.lora_A.default.weight10',  # Megatron TE grouped
     'language_model.decoder.layers.3.mlp.experts.linear_fc1.lora_A.default.weight*'),
    ('pp1/ep3/decoder.layers.0.mlp.experts.linear_fc2.lora_B.default.weight0',  # expert rank 3 of stage 1
     'pp1/decoder.layers.0.mlp.experts.linear_fc2.lora_B.default.weight*'),
    ('model.layers.0.mlp.experts.17.gate_proj.lora_A.default.weight',  # HF per-expert modules
     'model.layers.0.mlp.experts.*.gate_proj.lora_A.default.weight'),
    ('model.layers.0.mlp.experts.gate_up_proj.lora_A.default.weight', None),  # fused 3-D: all experts in one
    ('model.layers.0.self_attn.q_proj.lora_A.default.weight', None),
    ('decoder.layers.0.self_attention.linear_qkv.lora_A.default.weight', None),
])
def test_expert_group_names_the_layer_an_expert_adapter_belongs_to(name, group):
    assert expert_group(name) == group


def test_unchanged_experts_pass_only_beside_a_moved_expert_of_their_layer():
    grouped = 'decoder.layers.{}.mlp.experts.linear_fc1.lora_A.default.weight{}'
    names = [grouped.format(0, 0), grouped.format(0, 1), grouped.format(1, 0), grouped.format(1, 1),
             'decoder.layers.0.self_attention.linear_qkv.lora_A.default.weight']
    changed = [True, False, False, False, False]  # layer 1's experts all unchanged, attention unchanged
    stale, not_reached = split_unchanged(names, changed)
    assert not_reached == [grouped.format(0, 1)]
    assert stale == [grouped.format(1, 0), grouped.format(1, 1), names[4]]


def test_checksums_go_a_chunk_at_a_time_and_still_see_one_element_move(monkeypatch):
    """A float64 reduction casts its whole input first; the guard reduces big tensors a chunk at a time (Megatron full
    SFT checks a 0.5 B-element embedding), with the same sums, and a one-ulp change anywhere still shows."""
    import torch

    from swift_vora.guards import lora_update
    data = torch.randn(1000, 7, dtype=torch.bfloat16)
    whole = lora_update.checksum(data)
    monkeypatch.setattr(lora_update, 'CHECKSUM_CHUNK', 64)
    chunked = lora_update.checksum(data)
    assert torch.allclose(whole, chunked, rtol=1e-12)
    moved = data.clone()
    moved[999, 6] += 2 ** -4  # in the last chunk; more than one bf16 step for any |value| < 8
    assert (lora_update.checksum(moved) != chunked).any()
