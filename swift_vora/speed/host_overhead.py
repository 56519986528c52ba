"""Host work in the training loop that a host-bound step pays for in GPU idle time; four narrow fixes.

With the decoder layers compiled (swift_vora/speed/compile_layers.py) a step of the 2B Qwen3-VL LoRA benchmark
is limited by the host, not the GPU: every millisecond the Python side spends between kernel launches while the
launch queue is empty is a millisecond the GPU waits. A trace of one step (benchmarks/step_timeline.py,
docs/runs/benchmarks-log.md) showed such costs that change nothing in what is trained:

- `Trainer.floating_point_ops` (transformers), called after every micro-batch for the logged `total_flos`, counts
  the model's parameters each time: `num_parameters(exclude_embeddings=True)` walks every module and parameter
  (thousands of modules with LoRA; docs/runs/benchmarks-log.md times it). The count cannot change
  while training runs, so it is taken once per model; the returned FLOPs are the same number.
- The DeepStack merge of Qwen3-VL / Qwen3.5 (`_deepstack_process`, in transformers and as ms-swift replaces it)
  adds the vision features into the first decoder layers with boolean-mask indexing, `hidden[mask, :]` read and
  written: two device-to-host syncs per layer (the number of selected rows), six per sample, each draining the
  launch queue in the middle of the forward. The same sum is computed without reading the mask on the host:
  the features are scattered into a zero tensor in mask order (`masked_scatter`, which checks sizes on the device)
  and added. Rows outside the mask add exactly 0, rows inside get the same bf16 sum, so the result is identical
  (tests/test_host_overhead.py). Kept: ms-swift's sequence-parallel split, and vision features that require grad
  (an unfrozen ViT: their backward, masked_select, syncs anyway).
- `model.train()`, which transformers' `training_step` calls at the start of every micro-batch, walks all modules
  recursively while the GPU, drained by the previous
  micro-batch's loss check, waits. When every module already has the flag a full call would leave it with (the
  state after the last full `train()`), the call returns at once; any other state (after `eval()`, a module switched
  by hand) takes the full call. The check reads one attribute per module.
- ms-swift's token accuracy (`_compute_acc` -> `compute_acc`) copies predictions and labels to the host after
  every micro-batch (`.cpu()`: two syncs between the forward and the backward) to append one boolean per token to
  a mean that is read only when the step is logged. The same comparison is made on the device and kept there as two
  counts (tokens right, tokens supervised); the metric adds them up when it is computed for the log -- one read per
  logged step, the same mean (a sum of booleans over the same count). Other strategies (`acc_strategy seq`),
  sequence parallelism, encoder-decoders and non-LM tasks keep ms-swift's code.

Installed by the `vora_host_overhead` callback when training begins (on by default; `SWIFT_VORA_HOST_OVERHEAD=0`
leaves all four untouched).
"""
from __future__ import annotations

import logging
import weakref

from swift.callbacks import TrainerCallback

from .. import patches, switches

ENV = 'SWIFT_VORA_HOST_OVERHEAD'
logger = logging.getLogger('swift')


def enabled(environ=None) -> bool:
    return switches.read(ENV, environ)


def count_parameters_once(trainer) -> None:
    """Make `trainer.floating_point_ops` count the model's parameters once per model (same value as transformers)."""
    original = trainer.floating_point_ops
    if patches.patched_by(original) or not patches.applicable('flops_parameter_count'):
        return
    counts = {}

    def floating_point_ops(inputs):
        model = trainer.model
        main_input = getattr(model, 'main_input_name', 'input_ids')
        if main_input in inputs and hasattr(model, 'num_parameters'):
            if id(model) not in counts:
                counts[id(model)] = model.num_parameters(exclude_embeddings=True)
            return 6 * inputs[main_input].numel() * counts[id(model)]
        return original(inputs)

    trainer.floating_point_ops = patches.mark(floating_point_ops, 'flops_parameter_count', original)


def skip_repeated_train_mode(model) -> bool:
    """Make `model.train()` return at once while every module still has the flag the last full call left it with.

    The modules are remembered by weak reference, as the last full call found them: a lever that swaps modules
    after this is installed (fp8_frozen replaces the frozen linears) neither keeps the replaced ones -- and their
    weights -- alive, nor leaves its new ones out of train(): a module gone since takes the full call, which
    looks again. Returns False when already installed."""
    original = model.train
    if patches.patched_by(original) or not patches.applicable('train_mode'):
        return False
    state = {'modules': None, 'flags': None}  # after the last full train(True): each module and its `training`

    def train(mode: bool = True):
        if mode is True and state['modules'] is not None:
            live = [ref() for ref in state['modules']]
            if all(m is not None and m.training is f for m, f in zip(live, state['flags'])):
                return model
        result = original(mode)
        if mode is True:
            modules = list(model.modules())
            state['modules'], state['flags'] = [weakref.ref(m) for m in modules], [m.training for m in modules]
        else:
            state['modules'] = state['flags'] = None
        return result

    model.train = patches.mark(train, 'train_mode', original)
    return True


def _sequence_parallel() -> bool:
    try:
        from swift.sequence_parallel import sequence_parallel
    except ImportError:
        return False
    return bool(sequence_parallel.world_size and sequence_parallel.world_size > 1)


# text model class -> the inventoried patch of its `_deepstack_process` (swift_vora/patches.py)
DEEPSTACK_PATCHES = {patch.target.split(':')[1].split('.')[0]: patch.name for patch in patches.PATCHES
                     if patch.target.endswith('._deepstack_process')}


def sync_free_deepstack(model) -> int:
    """Replace `_deepstack_process` on every module of `model` whose class the inventory lists (and whose installed
    upstream it knows); returns how many were replaced."""
    import torch
    replaced = 0
    for module in model.modules():
        original = getattr(module, '_deepstack_process', None)
        name = DEEPSTACK_PATCHES.get(type(module).__name__)
        if original is None or name is None or patches.patched_by(original) or not patches.applicable(name):
            continue

        def _deepstack_process(hidden_states, visual_pos_masks, visual_embeds, _original=original):
            if visual_pos_masks is None or visual_embeds.requires_grad or _sequence_parallel():
                return _original(hidden_states, visual_pos_masks, visual_embeds)
            mask = visual_pos_masks.to(hidden_states.device)
            if hidden_states.ndim == 3 and mask.ndim == 3:
                mask = mask[..., 0]
            embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
            added = torch.zeros_like(hidden_states).masked_scatter(mask.unsqueeze(-1), embeds)
            return hidden_states + added

        module._deepstack_process = patches.mark(_deepstack_process, name, original)
        replaced += 1
    return replaced


def deferred_token_accuracy(trainer) -> bool:
    """Make `trainer._compute_acc` count token accuracy on the device for the metric to read when it is logged.

    Returns False when already installed or when the trainer has no ms-swift metrics."""
    import torch
    original = getattr(trainer, '_compute_acc', None)
    metrics = getattr(trainer, 'custom_metrics', None)
    if (original is None or patches.patched_by(original) or not isinstance(metrics, dict)
            or not patches.applicable('token_accuracy')):
        return False
    from swift.metrics.utils import MeanMetric

    class DeviceCountMean(MeanMetric):
        """ms-swift's MeanMetric plus counts still on the device, added up when the mean is computed."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_state('pending', default_factory=list)

        def update_on_device(self, right, supervised):
            self.pending.append(torch.stack([right, supervised]))

        def compute(self):
            if self.pending:
                right, supervised = torch.stack(self.pending).sum(0).tolist()  # the one host read per log
                self.state += right
                self.count += int(supervised)
                self.pending = []
            return super().compute()

    def _compute_acc(outputs, labels, cu_seqlens=None):
        args, template = trainer.args, trainer.template
        logits = getattr(outputs, 'logits', None)
        if (getattr(trainer, 'task_type', None) != 'causal_lm' or args.acc_strategy != 'token'
                or getattr(template, 'sequence_parallel_size', 1) > 1 or template.is_encoder_decoder
                or not torch.is_tensor(logits) or not torch.is_tensor(labels) or torch.is_floating_point(labels)
                or logits.ndim != 3):
            return original(outputs, labels, cu_seqlens=cu_seqlens)
        preds = logits.argmax(dim=-1)[..., :-1]  # compute_acc's shift: the prediction for the next token
        targets = labels[..., 1:]
        if preds.shape != targets.shape:  # compute_acc records nothing then; let it say so its own way
            return original(outputs, labels, cu_seqlens=cu_seqlens)
        mode = 'train' if trainer.model.training else 'eval'
        metric = metrics[mode].get('token_acc')
        if not isinstance(metric, DeviceCountMean):
            metric = metrics[mode]['token_acc'] = DeviceCountMean(nan_value=None, device=args.device)
        supervised = targets != -100
        metric.update_on_device((preds.eq(targets) & supervised).sum(), supervised.sum())

    trainer._compute_acc = patches.mark(_compute_acc, 'token_accuracy', original)
    return True


class HostOverhead(TrainerCallback):
    """Installs the four fixes on the trainer and its model when training begins."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not enabled():
            return
        count_parameters_once(self.trainer)
        accuracy = deferred_token_accuracy(self.trainer)
        model = model if model is not None else self.trainer.model
        deepstack = sync_free_deepstack(model)
        wrapped = getattr(self.trainer, 'model_wrapped', None)  # what training_step gets when something wraps it
        for candidate in [model] + ([wrapped] if wrapped is not None and wrapped is not model else []):
            skip_repeated_train_mode(candidate)
        accuracy_note = 'counted on the device until logged' if accuracy else 'as ms-swift has it'
        logger.info('swift-vora host overhead: parameters counted once for the logged FLOPs; '
                    f'{deepstack} DeepStack merge(s) without host syncs; model.train() skips the module walk when '
                    f'nothing changed; token accuracy {accuracy_note} ({ENV}=0 to keep all four as they were)')
