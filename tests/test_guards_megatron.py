"""The guards under `megatron sft`: Megatron-SWIFT callbacks driven the way its trainer drives them
(swift/megatron/trainers/base.py: on_train_begin, then per step on_step_begin / optimizer step /
`state.iteration += 1` / on_step_end), on a stand-in trainer with Megatron-style LoRA names (TE grouped experts:
`...experts.linear_fc1.lora_A.default.weight0`). Megatron itself needs CUDA and Transformer Engine."""
import json
import os
import subprocess
import sys
import types

import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])
import torch

from swift_vora.guards.common import GuardError
from swift_vora.guards.megatron import (
    MegatronFingerprintGuard,
    MegatronLoraUpdateGuard,
    MegatronMemoryGuard,
    qualified_names,
)
from swift_vora.guards.registry import MEGATRON_GUARDS


class LoraLinear(torch.nn.Module):
    """`linear_qkv.lora_A.default.weight` / `lora_B.default.weight`, lora_B zero as PEFT and mcore-bridge init it."""

    def __init__(self):
        super().__init__()
        self.lora_A = torch.nn.ModuleDict({'default': torch.nn.Linear(8, 2, bias=False)})
        self.lora_B = torch.nn.ModuleDict({'default': torch.nn.Linear(2, 8, bias=False)})
        torch.nn.init.zeros_(self.lora_B['default'].weight)

    def forward(self, x):
        return x + self.lora_B['default'](self.lora_A['default'](x))


class GroupedLora(torch.nn.Module):
    """TEGroupedLinear's per-expert parameters `weight0`, `weight1`."""

    def __init__(self, shape, zero=False):
        super().__init__()
        for i in range(2):
            self.register_parameter(f'weight{i}', torch.nn.Parameter(torch.zeros(shape) if zero
                                                                     else torch.randn(shape) * 0.1))


class ExpertsLora(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.lora_A = torch.nn.ModuleDict({'default': GroupedLora((2, 8))})
        self.lora_B = torch.nn.ModuleDict({'default': GroupedLora((8, 2), zero=True)})

    def forward(self, x, experts):
        out = x
        for i in experts:  # the experts tokens were routed to
            a, b = getattr(self.lora_A['default'], f'weight{i}'), getattr(self.lora_B['default'], f'weight{i}')
            out = out + x @ a.t() @ b.t()
        return out


class Layer(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.self_attention = torch.nn.Module()
        self.self_attention.linear_qkv = LoraLinear()
        self.mlp = torch.nn.Module()
        self.mlp.experts = torch.nn.Module()
        self.mlp.experts.linear_fc1 = ExpertsLora()
        self.frozen_base = torch.nn.Parameter(torch.ones(8), requires_grad=False)


class Chunk(torch.nn.Module):
    """One model chunk (`trainer.unwrapped_models[0]`): `decoder.layers.0....`"""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList([Layer()])

    def forward(self, x, experts):
        layer = self.decoder.layers[0]
        return layer.mlp.experts.linear_fc1(layer.self_attention.linear_qkv(x) * layer.frozen_base, experts)


class FakeTrainer:
    """What the callbacks read from Megatron-SWIFT's trainer, plus a training step that does what train_step does:
    forward/backward, optimizer step, the scheduler advancing only after an update that was applied."""

    def __init__(self, tmp_path, lrs, experts=(0, 1), skipped=()):
        self.args = types.SimpleNamespace(output_dir=str(tmp_path), tuner_type='lora')
        self.state = types.SimpleNamespace(iteration=0)
        self.unwrapped_models = [Chunk()]
        params = [p for p in self.unwrapped_models[0].parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(params, lr=lrs[0])
        self.opt_param_scheduler = types.SimpleNamespace(num_steps=0)
        self.lrs, self.experts, self.skipped = lrs, experts, skipped

    def _get_reported_learning_rate(self):
        return self.optimizer.param_groups[0]['lr']

    def run(self, callbacks, steps):
        for cb in callbacks:
            cb.on_train_begin()
        torch.manual_seed(1)
        x, y = torch.randn(16, 8), torch.randn(16, 8)
        for _ in range(steps):
            for group in self.optimizer.param_groups:  # the scheduler set it after the previous update
                group['lr'] = self.lrs[min(self.state.iteration, len(self.lrs) - 1)]
            for cb in callbacks:
                cb.on_step_begin()
            loss = torch.nn.functional.mse_loss(self.unwrapped_models[0](x, self.experts), y)
            loss.backward()
            if self.state.iteration not in self.skipped:  # an overflow step updates nothing
                self.optimizer.step()
                self.opt_param_scheduler.num_steps += 16
            self.optimizer.zero_grad()
            self.state.iteration += 1
            for cb in callbacks:
                cb.on_step_end()
        for cb in callbacks:
            cb.on_train_end()


ATTENTION = 'decoder.layers.0.self_attention.linear_qkv'
EXPERTS = 'decoder.layers.0.mlp.experts.linear_fc1'


def test_lora_update_all_updated_writes_counts(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FakeTrainer(tmp_path, lrs=[0.0, 0.1])  # warm-up starts at lr 0: that step does not count
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=4)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['tensors'] == 6 and report['updated'] == 6 and report['not_updated'] == []
    assert report['expert_tensors'] == 4 and report['expert_updated'] == 4
    assert report['by_kind'] == {'A': {'updated': 3, 'total': 3}, 'B': {'updated': 3, 'total': 3}}
    assert report['steps_counted'] == 2 and report['iteration'] == 3  # iteration 1 had lr 0
    assert report['steps'] == [{'iteration': 1, 'lr': 0.0, 'applied': True, 'counted': False}]
    assert report['requires_grad_false'] == []  # the frozen base weight is not a LoRA tensor


def test_lora_update_counts_an_expert_no_token_reached_without_stopping(tmp_path, monkeypatch):
    # expert 1 gets no token: its adapter stays, expert 0 of the same grouped layer moved -> reported, not fatal
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FakeTrainer(tmp_path, lrs=[0.1], experts=(0,))
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    assert trainer.state.iteration == 3
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['expert_tensors'] == 4 and report['expert_updated'] == 2 and report['updated'] == 4
    assert report['not_updated'] == [] and report['experts_not_reached'] == 2
    assert report['experts_not_reached_by_layer'] == {f'{EXPERTS}.lora_A.default.weight*': 1,
                                                      f'{EXPERTS}.lora_B.default.weight*': 1}


def test_lora_update_stops_when_no_expert_of_a_layer_moved(tmp_path, monkeypatch):
    # no expert of the grouped layer moves (a frozen or disconnected grouped adapter): stop, naming them
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FakeTrainer(tmp_path, lrs=[0.1], experts=())
    guard = MegatronLoraUpdateGuard(trainer)
    with pytest.raises(GuardError, match='2 of 6 LoRA tensors updated after 2 optimizer steps') as error:
        trainer.run([guard], steps=3)
    for i in (0, 1):
        assert f'{EXPERTS}.lora_A.default.weight{i}' in str(error.value)
        assert f'{EXPERTS}.lora_B.default.weight{i}' in str(error.value)
    assert f'{ATTENTION}.lora_A' not in str(error.value)
    assert trainer.state.iteration == 2  # stopped at the check, not at the end
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['expert_updated'] == 0 and report['experts_not_reached'] == 0
    assert len(report['not_updated']) == 4


def test_lora_update_stops_on_a_frozen_adapter_tensor(tmp_path, monkeypatch):
    # a freeze pattern that caught an adapter: it never trains, and the check says which, marked as frozen
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FakeTrainer(tmp_path, lrs=[0.1])
    frozen = f'{ATTENTION}.lora_A.default.weight'
    dict(trainer.unwrapped_models[0].named_parameters())[frozen].requires_grad_(False)
    with pytest.raises(GuardError, match='5 of 6 LoRA tensors updated') as error:
        trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    assert f'{frozen} (requires_grad=False)' in str(error.value)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['requires_grad_false'] == [frozen] and report['not_updated'] == [frozen]


def test_lora_update_does_not_count_a_skipped_step(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FakeTrainer(tmp_path, lrs=[0.1], skipped=(0,))
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['steps'] == [{'iteration': 1, 'lr': 0.1, 'applied': False, 'counted': False}]
    assert report['iteration'] == 3 and report['updated'] == 6


def test_lora_update_too_few_steps_is_reported_not_passed(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '5')
    trainer = FakeTrainer(tmp_path, lrs=[0.1])
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=2)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert 'not checked' in report['note'] and 'updated' not in report


def test_names_are_qualified_where_ranks_hold_different_tensors():
    chunks = [[f'{ATTENTION}.lora_A.default.weight', f'{EXPERTS}.lora_A.default.weight0']]
    assert qualified_names(chunks, (0, 1, 0, 1)) == chunks[0]
    assert qualified_names(chunks, (1, 2, 3, 4)) == [f'pp1/{ATTENTION}.lora_A.default.weight',
                                                      f'pp1/ep3/{EXPERTS}.lora_A.default.weight0']
    assert qualified_names(chunks * 2, (0, 1, 0, 1))[2].startswith('chunk1/')


def test_memory_records_phases_only_on_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_MEMORY_FIRST', '2')
    monkeypatch.setenv('SWIFT_VORA_MEMORY_EVERY', '3')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    trainer = FakeTrainer(tmp_path, lrs=[0.1])
    trainer.run([MegatronMemoryGuard(trainer)], steps=4)
    assert not list(tmp_path.glob('memory_phases*'))  # CPU: nothing

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr('swift_vora.guards.megatron.measure', lambda: {'source': 'cuda.max_memory_allocated',
                                                                       'allocated_gib': 1.0, 'reserved_gib': 2.0})
    trainer = FakeTrainer(tmp_path, lrs=[0.1])
    trainer.run([MegatronMemoryGuard(trainer)], steps=7)
    rows = [json.loads(line) for line in (tmp_path / 'memory_phases.rank0.jsonl').read_text().splitlines()]
    phases = [(r['phase'], r['global_step']) for r in rows]
    # steps 0, 1 (the first two), then every third: 3, 6; step_end is after state.iteration += 1
    assert phases == [('model_loaded', 0), ('train_begin', 0), ('step_begin', 0), ('step_end', 1),
                      ('step_begin', 1), ('step_end', 2), ('step_begin', 3), ('step_end', 4), ('step_begin', 6),
                      ('step_end', 7), ('train_end', 7)]
    assert rows[2]['allocated_gib'] == 1.0 and rows[2]['reserved_gib'] == 2.0


def test_memory_guard_says_how_long_the_first_step_took_and_whether_the_caches_were_warm(tmp_path, monkeypatch):
    """Under `megatron sft` nothing said why a first step took 211 s in one launch and 32 s in the next (#31 call g):
    the memory guard now times the first step and counts what it wrote to the kernel caches, as the Unsloth runner
    does -- a log line and `first_step.json` on rank 0; a launch that compiled nothing says its caches were warm."""
    from swift_vora.backends import kernel_cache
    monkeypatch.setenv('SWIFT_VORA_CACHE_DIR', str(tmp_path / 'cache'))
    for var in kernel_cache.CACHE_FOLDERS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    triton = kernel_cache.cache_dirs()['TRITON_CACHE_DIR']

    class Compiles:  # a kernel written to Triton's cache during the first step only
        def __init__(self, trainer, kernels):
            self.trainer, self.kernels = trainer, kernels

        def on_step_begin(self):
            if self.trainer.state.iteration == 0:
                for i in range(self.kernels):
                    os.makedirs(os.path.join(triton, f'k{i}'), exist_ok=True)
                    with open(os.path.join(triton, f'k{i}', 'kernel.cubin'), 'w') as f:
                        f.write('x')

        def __getattr__(self, name):  # the other events: nothing
            return lambda *a, **k: None

    reports = []
    for launch, kernels in (('cold', 2), ('warm', 2)):  # the same kernels again: already in the cache
        out = tmp_path / launch
        out.mkdir()
        trainer = FakeTrainer(out, lrs=[0.1])
        trainer.run([MegatronMemoryGuard(trainer), Compiles(trainer, kernels)], steps=3)
        reports.append(json.loads((out / 'first_step.json').read_text()))
    cold, warm = reports
    assert cold['warm'] is False and cold['cache_entries_written']['TRITON_CACHE_DIR'] == 2
    assert warm['warm'] is True and warm['cache_entries_before']['TRITON_CACHE_DIR'] == 2
    assert cold['first_step_s'] >= 0 and cold['cache_dirs']['TRITON_CACHE_DIR'] == triton
    assert 'cold cache: wrote 2 triton entries' in kernel_cache.describe(cold)


def test_fingerprint_written_when_the_trainer_is_built(tmp_path):
    trainer = FakeTrainer(tmp_path, lrs=[0.1])
    MegatronFingerprintGuard(trainer)
    fp = json.loads((tmp_path / 'fingerprint.json').read_text())
    assert fp['trainer'] == 'FakeTrainer' and fp['tuner_type'] == 'lora'
    assert 'megatron-core' in fp['packages'] and fp['swift_vora']['plugin']['combined_sha256']


def test_plugin_registers_megatron_callbacks_inside_megatron(tmp_path, monkeypatch):
    from swift_vora import swift_registry

    class MegatronCallback:  # stand-in for swift.megatron.callbacks.base.MegatronCallback
        def __init__(self, trainer):
            raise AssertionError('the guards set trainer/args/state themselves')

        def on_event_added_later(self):
            return 'base no-op'

    callbacks = types.ModuleType('swift.megatron.callbacks')
    callbacks.megatron_callbacks_map = {'print': object}
    callbacks.MegatronCallback = MegatronCallback
    monkeypatch.setitem(sys.modules, 'swift.megatron', types.ModuleType('swift.megatron'))
    monkeypatch.setitem(sys.modules, 'swift.megatron.callbacks', callbacks)
    from swift_vora.backends import kernel_cache
    monkeypatch.setenv('SWIFT_VORA_CACHE_DIR', str(tmp_path / 'cache'))
    for key in kernel_cache.cache_env():  # set by the call below; restored (unset) after the test
        monkeypatch.setenv(key, '')
        monkeypatch.delenv(key)
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path / 'mine'))  # a user's value is kept
    assert swift_registry.register_megatron_callbacks() is True
    # the kernel caches persist across launches, as in the Unsloth runner (backends/kernel_cache.py)
    assert os.environ['TRITON_CACHE_DIR'] == str(tmp_path / 'cache' / 'triton')
    assert os.environ['TRITON_CACHE_AUTOTUNING'] == '1' and os.environ['FLA_CACHE_RESULTS'] == '1'
    assert os.environ['TORCHINDUCTOR_CACHE_DIR'] == str(tmp_path / 'mine')
    registered = callbacks.megatron_callbacks_map
    # the guards, and the step profile (backends/megatron_profile.py) the launch names when SWIFT_VORA_PROFILE_STEP
    # is set
    assert set(registered) == ({'print', 'vora_step_profile', 'vora_epoch_prefetch', 'vora_coalesced_optimizer'}
                               | {f'vora_{name}' for name in MEGATRON_GUARDS})
    profile = registered['vora_step_profile'](FakeTrainer(tmp_path, lrs=[0.1]))
    assert isinstance(profile, MegatronCallback) and profile.on_event_added_later() == 'base no-op'
    assert set(MEGATRON_GUARDS) == {'fingerprint', 'memory', 'lora_update'}
    trainer = FakeTrainer(tmp_path, lrs=[0.1])
    guard = registered['vora_lora_update'](trainer)  # what the trainer does for --callbacks vora_lora_update
    assert isinstance(guard, MegatronLoraUpdateGuard) and isinstance(guard, MegatronCallback)
    assert guard.on_event_added_later() == 'base no-op'
    trainer.run([guard], steps=3)
    assert json.loads((tmp_path / 'lora_update.json').read_text())['updated'] == 6


def test_plugin_outside_megatron_registers_and_imports_nothing_of_it():
    code = ('import sys, swift, swift_vora\n'
            'from swift_vora import swift_registry\n'
            'assert swift_registry.register_megatron_callbacks() is False\n'
            'print(sorted(m for m in sys.modules if m.startswith(("swift.megatron", "megatron", "mcore_bridge", '
            '"transformer_engine"))))\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == '[]'


# ---- full SFT (megatron_ep_full): every weight checked, the frozen ones too ------------------------------------------
class FullChunk(torch.nn.Module):
    """A model chunk with megatron-core / mcore-bridge names: a frozen vision tower, a router, grouped experts
    (`weight0`, `weight1`), attention, the LM head."""

    def __init__(self, freeze_router=False):
        super().__init__()
        torch.manual_seed(0)
        self.visual = torch.nn.Module()
        self.visual.proj = torch.nn.Linear(8, 8)
        self.visual.proj.requires_grad_(False)  # --freeze_vit
        layer = torch.nn.Module()
        layer.self_attention = torch.nn.Module()
        layer.self_attention.linear_qkv = torch.nn.Linear(8, 8)
        layer.mlp = torch.nn.Module()
        layer.mlp.router = torch.nn.Module()
        layer.mlp.router.weight = torch.nn.Parameter(torch.randn(2, 8) * 0.1, requires_grad=not freeze_router)
        layer.mlp.experts = torch.nn.Module()
        layer.mlp.experts.linear_fc1 = GroupedLora((8, 8))
        self.language_model = torch.nn.Module()
        self.language_model.decoder = torch.nn.Module()
        self.language_model.decoder.layers = torch.nn.ModuleList([layer])
        self.language_model.output_layer = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x, experts):
        layer = self.language_model.decoder.layers[0]
        h = layer.self_attention.linear_qkv(x + self.visual.proj(x))
        gate = torch.softmax(h @ layer.mlp.router.weight.t(), dim=-1)
        out = h
        for i in experts:
            out = out + gate[:, i:i + 1] * (h @ getattr(layer.mlp.experts.linear_fc1, f'weight{i}').t())
        return self.language_model.output_layer(out)


class FullTrainer(FakeTrainer):
    def __init__(self, tmp_path, experts=(0, 1), freeze_router=False, move_frozen=False):
        super().__init__(tmp_path, lrs=[0.1], experts=experts)
        self.args.tuner_type = 'full'
        self.unwrapped_models = [FullChunk(freeze_router)]
        params = [p for p in self.unwrapped_models[0].parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(params, lr=0.1)
        self.move_frozen = move_frozen

    def run(self, callbacks, steps):
        if self.move_frozen:  # a bug that moves a frozen tensor (the vision tower) during training
            original = self.optimizer.step

            def step():
                original()
                with torch.no_grad():
                    self.unwrapped_models[0].visual.proj.weight.add_(0.5)

            self.optimizer.step = step
        super().run(callbacks, steps)


def test_full_sft_checks_every_weight_by_part(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FullTrainer(tmp_path)
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['mode'] == 'full' and report['failures'] == [] and report['frozen_changed'] == []
    assert report['parts']['vision_tower'] == {'trainable': 0, 'updated': 0, 'frozen': 2, 'frozen_changed': 0}
    assert report['parts']['router'] == {'trainable': 1, 'updated': 1, 'frozen': 0, 'frozen_changed': 0}
    assert report['parts']['experts']['updated'] == 2 and report['parts']['attention']['updated'] == 2
    assert report['parts']['output_layer']['updated'] == 1
    assert report['tensors'] == report['updated'] == 6 and report['expert_tensors'] == 2


def test_full_sft_with_a_frozen_router_counts_it_frozen(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FullTrainer(tmp_path, freeze_router=True)  # megatron.freeze_router: --freeze_parameters_regex
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['parts']['router'] == {'trainable': 0, 'updated': 0, 'frozen': 1, 'frozen_changed': 0}
    assert report['failures'] == []


def test_full_sft_stops_when_a_frozen_tensor_moves(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FullTrainer(tmp_path, move_frozen=True)
    with pytest.raises(GuardError, match=r'1 frozen tensor\(s\) changed: visual.proj.weight'):
        trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)


def test_full_sft_stops_when_no_tensor_of_a_part_moved_and_lists_a_single_unchanged_one(tmp_path, monkeypatch):
    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '2')
    trainer = FullTrainer(tmp_path, experts=())  # no token reaches any expert: the experts part never moves
    with pytest.raises(GuardError, match='no trainable experts tensor changed \\(of 2\\)'):
        trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    trainer = FullTrainer(tmp_path, experts=(0, ))  # expert 1 not reached: counted, not failed
    trainer.run([MegatronLoraUpdateGuard(trainer)], steps=3)
    report = json.loads((tmp_path / 'lora_update.json').read_text())
    assert report['failures'] == [] and report['experts_not_reached'] == 1 and report['unchanged'] == []
