"""swift_vora/speed/host_overhead.py: the logged FLOPs without re-counting parameters, and the DeepStack merge without
host syncs -- both must leave every number exactly as transformers / ms-swift compute it."""
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Trainer

from swift_vora import patches
from swift_vora.speed import host_overhead


class CountingModel(torch.nn.Module):
    main_input_name = 'input_ids'

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 3)
        self.calls = 0

    def num_parameters(self, exclude_embeddings=False):
        self.calls += 1
        return sum(p.numel() for n, p in self.named_parameters() if not (exclude_embeddings and 'embed' in n))


def test_floating_point_ops_same_value_counted_once():
    model = CountingModel()
    trainer = types.SimpleNamespace(model=model)
    trainer.floating_point_ops = types.MethodType(Trainer.floating_point_ops, trainer)
    inputs = {'input_ids': torch.zeros(1, 7, dtype=torch.long)}
    expected = trainer.floating_point_ops(inputs)  # transformers' own: 6 * tokens * parameters
    assert expected == 6 * 7 * 15 and model.calls == 1
    host_overhead.count_parameters_once(trainer)
    host_overhead.count_parameters_once(trainer)  # idempotent
    assert [trainer.floating_point_ops(inputs) for _ in range(3)] == [expected] * 3
    assert trainer.floating_point_ops({'input_ids': torch.zeros(2, 5, dtype=torch.long)}) == 6 * 10 * 15
    assert model.calls == 2  # once more, not once per call
    assert trainer.floating_point_ops({'pixel_values': torch.zeros(3)}) == 0  # no main input: transformers' path


class OpsSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


class Qwen3VLTextModel(torch.nn.Module):
    """The transformers 5.17 Qwen3-VL text model's merge, verbatim (boolean-mask read and write); named as the class
    whose merge swift_vora/patches.py inventories (only those are replaced)."""

    def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
        visual_pos_masks = visual_pos_masks.to(hidden_states.device)
        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        hidden_states = hidden_states.clone()
        local_this = hidden_states[visual_pos_masks, :] + visual_embeds
        hidden_states[visual_pos_masks, :] = local_this
        return hidden_states


class Wrapper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.language_model = Qwen3VLTextModel()


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
def test_deepstack_merge_is_identical_without_mask_indexing(dtype):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 50, 8, generator=gen).to(dtype).requires_grad_()
    mask = torch.zeros(1, 50, dtype=torch.bool)
    mask[0, 5:25] = True
    mask[0, 30:33] = True
    embeds = torch.randn(int(mask.sum()), 8, generator=gen)  # float32 from the vision tower, cast inside
    model = Wrapper()
    with OpsSeen() as seen:
        reference = model.language_model._deepstack_process(hidden, mask, embeds)
    # boolean-mask indexing: on CUDA its nonzero reads the row count on the host (a sync)
    assert {'aten.index', 'aten.index_put_'} <= seen.ops
    ref_grad, = torch.autograd.grad(reference.float().square().sum(), hidden)

    assert host_overhead.sync_free_deepstack(model) == 1
    assert host_overhead.sync_free_deepstack(model) == 0  # already replaced
    with OpsSeen() as seen:
        merged = model.language_model._deepstack_process(hidden, mask, embeds)
    assert not {'aten.index', 'aten.index_put_', 'aten.nonzero'} & seen.ops and 'aten.masked_scatter' in seen.ops
    assert torch.equal(merged, reference)
    grad, = torch.autograd.grad(merged.float().square().sum(), hidden)
    assert torch.equal(grad, ref_grad)


def test_deepstack_keeps_the_original_when_it_must():
    calls = []

    class Qwen3VLMoeTextModel(torch.nn.Module):
        def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
            calls.append(visual_pos_masks)
            return hidden_states

    model = torch.nn.Sequential(Qwen3VLMoeTextModel())
    host_overhead.sync_free_deepstack(model)
    hidden = torch.zeros(1, 4, 2)
    model[0]._deepstack_process(hidden, None, torch.zeros(2))  # no visual tokens
    model[0]._deepstack_process(hidden, torch.ones(1, 4, dtype=torch.bool),
                                torch.zeros(4, 2, requires_grad=True))  # an unfrozen vision tower
    assert len(calls) == 2


def test_deepstack_of_a_class_the_inventory_does_not_list_is_left_alone():
    class OtherTextModel(Qwen3VLTextModel):
        pass

    model = torch.nn.Sequential(OtherTextModel())
    assert host_overhead.sync_free_deepstack(model) == 0
    assert patches.patched_by(model[0]._deepstack_process) is None


def test_callback_switch(monkeypatch):
    model = Wrapper()
    trainer = types.SimpleNamespace(model=model, floating_point_ops=lambda inputs: 1)
    callback = host_overhead.HostOverhead(types.SimpleNamespace(), trainer)
    monkeypatch.setenv(host_overhead.ENV, '0')
    callback.on_train_begin(None, None, None, model=model)
    assert patches.patched_by(trainer.floating_point_ops) is None
    assert patches.patched_by(model.language_model._deepstack_process) is None
    monkeypatch.delenv(host_overhead.ENV)
    callback.on_train_begin(None, None, None, model=model)
    assert patches.patched_by(trainer.floating_point_ops) == 'flops_parameter_count'
    assert patches.patched_by(model.language_model._deepstack_process).startswith('deepstack_')


class Leaf(torch.nn.Module):
    walks = 0

    def train(self, mode=True):
        Leaf.walks += 1
        return super().train(mode)


class Frozen(torch.nn.Module):
    """Like ms-swift's frozen vision tower: stays in eval whatever train() is asked."""

    def train(self, mode=True):
        Leaf.walks += 1
        return super().train(False)


def test_train_mode_skips_the_walk_only_when_nothing_changed():
    model = torch.nn.Sequential(Leaf(), torch.nn.Sequential(Leaf(), Frozen()))
    assert host_overhead.skip_repeated_train_mode(model) is True
    assert host_overhead.skip_repeated_train_mode(model) is False  # installed once

    def flags():
        return [m.training for m in model.modules()]

    Leaf.walks = 0
    assert model.train() is model and Leaf.walks == 3  # the first call walks
    expected = flags()
    assert expected == [True, True, True, True, False]
    for _ in range(3):
        model.train()
    assert Leaf.walks == 3 and flags() == expected  # nothing changed: no walk
    model.eval()  # nn.Module.eval -> train(False): a full walk, and the next train() walks again
    assert not any(flags()) and Leaf.walks == 6
    model.train()
    assert flags() == expected and Leaf.walks == 9
    model[1][0].eval()  # one module switched by hand (its own train(False): one call)
    model.train()
    assert flags() == expected and Leaf.walks == 13


def test_train_mode_neither_keeps_a_replaced_module_alive_nor_leaves_its_replacement_out():
    """A lever that swaps modules after the patch is installed (fp8_frozen: the H200 run kept the 2.6 GiB of bf16
    weights it had replaced alive, its peak 1.2 GiB above bf16's instead of 1.3 below): the old module is freed,
    the new one gets the flag train() sets."""
    import gc
    import weakref
    model = torch.nn.Sequential(Leaf(), torch.nn.Sequential(Leaf(), Frozen()))
    host_overhead.skip_repeated_train_mode(model)
    model.train()
    old = weakref.ref(model[1][0])
    replacement = Leaf().eval()
    model[1][0] = replacement
    gc.collect()
    assert old() is None  # nothing of the patch holds the replaced module (or its weights)
    Leaf.walks = 0
    model.train()
    assert replacement.training and Leaf.walks == 3  # the full call (both Leafs, Frozen) finds the new module
    model.train()
    assert Leaf.walks == 3  # and the walk is skipped again after it


def swift_trainer(acc_strategy='token'):
    """The parts of an ms-swift trainer that its `_compute_acc` and metric logging read, with ms-swift's own method."""
    import collections

    from swift.metrics.utils import MeanMetric
    from swift.trainers.mixin import SwiftMixin

    def mean():
        return MeanMetric(nan_value=None, device='cpu')

    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(acc_strategy=acc_strategy, device='cpu'), task_type='causal_lm', problem_type=None,
        template=types.SimpleNamespace(sequence_parallel_size=1, is_encoder_decoder=False), model=torch.nn.Linear(1, 1),
        custom_metrics={'train': collections.defaultdict(mean), 'eval': collections.defaultdict(mean)})
    trainer._compute_acc = types.MethodType(SwiftMixin._compute_acc, trainer)
    return trainer


def logged(trainer, mode):
    from swift.trainers.mixin import SwiftMixin
    return SwiftMixin.compute_custom_metrics(trainer.custom_metrics[mode])


def test_token_accuracy_counted_on_device_logs_what_swift_logs(monkeypatch):
    """The logged token accuracy is ms-swift's, to the last bit, over micro-batches with few, many and no supervised
    tokens, in train and eval mode, across two logging windows; and the deferred path never calls ms-swift's
    `compute_acc` (the one that copies to the host)."""
    import swift.trainers.mixin as mixin
    generator = torch.Generator().manual_seed(0)
    batches = []
    for supervised in (3, 40, 0, 17, 64):
        logits = torch.randn(1, 65, 5, generator=generator)
        labels = torch.randint(0, 5, (1, 65), generator=generator)
        labels[0, :65 - supervised] = -100
        batches.append((types.SimpleNamespace(logits=logits), labels))
    reference, deferred = swift_trainer(), swift_trainer()
    assert host_overhead.deferred_token_accuracy(deferred)
    assert not host_overhead.deferred_token_accuracy(deferred)  # installed once
    host_copies = []
    original_compute_acc = mixin.compute_acc
    monkeypatch.setattr(mixin, 'compute_acc', lambda *a, **k: host_copies.append(1) or original_compute_acc(*a, **k))
    for window in (batches[:3], batches[3:]):
        for mode in ('train', 'eval'):
            for trainer in (reference, deferred):
                trainer.model.train(mode == 'train')
                for outputs, labels in window:
                    trainer._compute_acc(outputs, labels)
        for mode in ('train', 'eval'):
            expected = logged(reference, mode)
            assert 0 < expected['token_acc'] < 1
            assert logged(deferred, mode) == expected
    assert len(host_copies) == 2 * 5  # the reference's calls only


def test_token_accuracy_other_strategies_keep_swift_code():
    trainer = swift_trainer(acc_strategy='seq')
    host_overhead.deferred_token_accuracy(trainer)
    labels = torch.tensor([[-100, 1, 2, 3]])
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 0]]), 5).float()  # every next token right
    trainer._compute_acc(types.SimpleNamespace(logits=logits), labels)
    assert type(trainer.custom_metrics['train']['seq_acc']).__name__ == 'MeanMetric'
    assert logged(trainer, 'train') == {'seq_acc': 1.0}


def test_token_accuracy_shape_mismatch_goes_to_swift_unshifted(monkeypatch):
    """Logits that do not line up with the labels (not ms-swift's layout) are handed to ms-swift's own code with the
    labels as they came."""
    trainer = swift_trainer()
    seen = []
    trainer._compute_acc = lambda outputs, labels, cu_seqlens=None: seen.append(labels.shape)
    host_overhead.deferred_token_accuracy(trainer)
    trainer._compute_acc(types.SimpleNamespace(logits=torch.zeros(1, 5, 3)), torch.zeros(1, 7, dtype=torch.long))
    assert seen == [torch.Size([1, 7])]
