"""Shared plumbing of the training guards: the error they stop with, rank helpers, report files, and the
one "tap" that lets guards see every training batch.

The tap (installed once per trainer, by the first guard that needs it, at `on_init_end`) wraps three things
on the trainer instance -- no ms-swift class is modified:
- `train_dataset.dataset` (the rows inside ms-swift's `LazyLLMDataset`) by `IndexedRows`: row `i` of the
  (possibly padded) order gets its source index as `_vora_index`;
- `train_dataset.encode_func` by `TaggedEncode`: pops `_vora_index` and puts `_vora_sample = [index,
  sample_id]` into the encoded sample. Because it tags the row that was *actually* encoded, a sample that
  ms-swift silently swapped for another (an encode error under `strict=False`) shows up as never seen;
- `trainer.data_collator` by `MetaCollator`: pops the tags and adds `_vora_batch` (indices, sample ids,
  supervised tokens per sample, total tokens, video frames) to the batch, counted on the CPU tensors before
  they move to the device -- no host sync is added for this;
- `trainer.training_step` (instance attribute): pops `_vora_batch`, calls the listeners (`on_batch`), marks
  the memory phases, and on a CUDA out-of-memory error reports the phase and batch before re-raising.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

from swift.utils import get_logger

from .. import patches

logger = get_logger()

META_KEY = '_vora_batch'
SAMPLE_KEY = '_vora_sample'
INDEX_KEY = '_vora_index'
TAP_ATTR = '_swift_vora_tap'
FRAME_FACTOR = 2  # Qwen2/3-VL temporal patch: one grid step in t is two frames


class GuardError(RuntimeError):
    """A guard found a silent failure and stops the run; the message says what, where and what to do."""

    def __init__(self, guard: str, message: str):
        super().__init__(f'[swift-vora guard {guard}] {message}')
        self.guard = guard


# ---- ranks ------------------------------------------------------------------------------------------------
def dist_ready() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist_ready() else int(os.environ.get('RANK', '0') or 0)


def world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist_ready() else 1


def all_gather_objects(obj: Any) -> List[Any]:
    """Every rank's `obj` (a list of one element without torch.distributed)."""
    if not dist_ready() or world_size() == 1:
        return [obj]
    import torch.distributed as dist
    out: List[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_max(tensor):
    """Element-wise max over ranks, in place, on the tensor's device (a no-op without distributed)."""
    if dist_ready() and world_size() > 1:
        import torch
        import torch.distributed as dist
        work = tensor
        if 'nccl' in str(dist.get_backend()) and tensor.device.type != 'cuda':  # e.g. ZeRO-3 offloaded partitions
            work = tensor.to(torch.device('cuda', torch.cuda.current_device()))
        dist.all_reduce(work, op=dist.ReduceOp.MAX)
        if work is not tensor:
            tensor.copy_(work.to(tensor.device))
    return tensor


# ---- report files -----------------------------------------------------------------------------------------
def output_dir(trainer) -> str:
    path = getattr(trainer.args, 'output_dir', None) or '.'
    return path


def write_json(path: str, data: Any) -> None:
    """`data` as JSON at `path`, written as every swift-vora output is (swift_vora.outputs: a temporary file renamed
    over it; no half-written report after a crash)."""
    from ..outputs import write_text_atomic
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + '\n', what='guard report')


def append_jsonl(path: str, row: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'a') as f:
        f.write(json.dumps(row, default=str) + '\n')


def unwrap_model(trainer):
    model = trainer.model
    accelerator = getattr(trainer, 'accelerator', None)
    if accelerator is not None:
        try:
            model = accelerator.unwrap_model(model)
        except Exception:  # noqa: BLE001 -- unwrapping is best effort; the plain model works as well
            pass
    return model


# ---- the dataset / encode / collator wrappers (module level: picklable for dataloader workers) --------------
def _sample_id(row: Dict[str, Any], index: Optional[int]):
    kwargs = row.get('chat_template_kwargs') or {}
    if isinstance(kwargs, dict) and kwargs.get('sample_id') is not None:
        return kwargs['sample_id']
    for key in ('id', 'sample_id', 'qid'):
        if row.get(key) is not None:
            return row[key]
    return index


class IndexedRows:
    """The rows of a dataset in a given order (repeats allowed); row `i` carries its source index."""

    def __init__(self, base, order: Optional[List[int]] = None):
        self.base = base
        self.order = list(range(len(base))) if order is None else list(order)

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, idx):
        if isinstance(idx, str):  # column access (ms-swift reads `lengths` for group_by_length)
            column = self.base[idx]
            return [column[j] for j in self.order]
        source = self.order[idx]
        row = dict(self.base[source])
        row[INDEX_KEY] = source
        return row

    def __getattr__(self, name):  # features, column_names, ...: those of the base dataset
        if name in ('base', 'order'):
            raise AttributeError(name)
        return getattr(self.base, name)

    def source_row(self, source: int) -> Dict[str, Any]:
        return self.base[source]


class PackedMembers:
    """The encoded samples a `PackingDataset` packs into rows (ms-swift's `--packing`): sample `i` carries its index,
    so the collator can say which samples each packed row held."""

    def __init__(self, base):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx):
        if isinstance(idx, str):  # column access (`lengths`)
            return self.base[idx]
        row = dict(self.base[idx])
        row[SAMPLE_KEY] = [idx, _sample_id(row, idx)]
        return row

    def __getattr__(self, name):
        if name == 'base':
            raise AttributeError(name)
        return getattr(self.base, name)

    def source_row(self, source: int) -> Dict[str, Any]:
        return self.base[source]


def is_packing_dataset(dataset) -> bool:
    """ms-swift's `PackingDataset`: rows of several encoded samples (`packed_idx`), drawn by the sampler as one."""
    return isinstance(getattr(dataset, 'packed_idx', None), list) and hasattr(dataset, 'dataset')


class TaggedEncode:
    """Wraps `template.encode`: the encoded sample remembers which source row it came from."""

    def __init__(self, encode: Callable):
        self.encode = encode

    def __call__(self, row, *args, **kwargs):
        if isinstance(row, dict) and INDEX_KEY in row:
            row = dict(row)
            index = row.pop(INDEX_KEY)
            encoded = self.encode(row, *args, **kwargs)
            if isinstance(encoded, dict):
                encoded[SAMPLE_KEY] = [index, _sample_id(row, index)]
            return encoded
        return self.encode(row, *args, **kwargs)


class MetaCollator:
    """Wraps the data collator: pops the sample tags and attaches `_vora_batch` (computed on CPU)."""

    def __init__(self, collator: Callable):
        self.collator = collator

    def __call__(self, samples, *args, **kwargs):
        tags = []
        if isinstance(samples, list):
            for sample in samples:
                # a packed row (`--packing`) is a list of samples
                for member in (sample if isinstance(sample, list) else [sample]):
                    if isinstance(member, dict):
                        tags.append(member.pop(SAMPLE_KEY, None))
        batch = self.collator(samples, *args, **kwargs)
        if tags and any(t is not None for t in tags) and isinstance(batch, dict):
            batch[META_KEY] = batch_meta(batch, tags)
        return batch


def batch_meta(batch: Dict[str, Any], tags: Optional[List] = None) -> Dict[str, Any]:
    """Indices, ids, supervised tokens, tokens and frames of a collated batch (CPU tensors: no device sync)."""
    import torch
    meta: Dict[str, Any] = {'indices': [], 'sample_ids': []}
    for tag in tags or []:
        meta['indices'].append(tag[0] if tag else None)
        meta['sample_ids'].append(tag[1] if tag else None)
    labels = batch.get('labels')
    if isinstance(labels, torch.Tensor):
        supervised = (labels != -100)
        meta['supervised_per_row'] = supervised.reshape(supervised.shape[0], -1).sum(dim=1).tolist() \
            if supervised.dim() > 1 else [int(supervised.sum())]
        meta['supervised'] = int(sum(meta['supervised_per_row']))
    input_ids = batch.get('input_ids')
    if isinstance(input_ids, torch.Tensor):
        meta['input_shape'] = list(input_ids.shape)
        mask = batch.get('attention_mask')
        meta['tokens'] = int(mask.sum()) if isinstance(mask, torch.Tensor) and mask.dtype != torch.float else \
            int(input_ids.numel())
    grid = batch.get('video_grid_thw')
    if isinstance(grid, torch.Tensor) and grid.numel():
        meta['video_frames'] = int(grid[:, 0].sum()) * FRAME_FACTOR
        meta['video_patches'] = int(grid.prod(dim=-1).sum())
    grid = batch.get('image_grid_thw')
    if isinstance(grid, torch.Tensor) and grid.numel():
        meta['images'] = int(grid.shape[0])
    return meta


# ---- the tap --------------------------------------------------------------------------------------------
class BatchTap:
    """Per-trainer hub: wraps data and `training_step`, and dispatches batches and phases to guards."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.listeners: List[Any] = []
        self.phase = 'init'
        self.micro_step = 0
        self.current_meta: Optional[Dict[str, Any]] = None
        self.indexed: Optional[IndexedRows] = None
        self.packed: Optional[Any] = None  # the PackingDataset (`--packing`): rows of several samples
        self.lazy_dataset = None
        self.tracking_note: Optional[str] = None
        self._install()

    # installation -----------------------------------------------------------------------------------------
    def _install(self) -> None:
        trainer = self.trainer
        dataset = getattr(trainer, 'train_dataset', None)
        if dataset is not None and hasattr(dataset, 'encode_func') and hasattr(dataset, 'dataset') and \
                patches.applicable('guard_tap_dataset'):
            if not isinstance(dataset.dataset, IndexedRows):
                dataset.dataset = IndexedRows(dataset.dataset)
            if not isinstance(dataset.encode_func, TaggedEncode):
                dataset.encode_func = TaggedEncode(dataset.encode_func)
            self.indexed = dataset.dataset
            self.lazy_dataset = dataset
            patches.applied('guard_tap_dataset')
        elif is_packing_dataset(dataset):
            if not isinstance(dataset.dataset, PackedMembers):
                dataset.dataset = PackedMembers(dataset.dataset)
            self.packed = dataset
        else:
            self.tracking_note = (f'train dataset is {type(dataset).__name__} (packing/streaming?): sample ids are '
                                  'not tracked per batch')
        if trainer.data_collator is not None and not isinstance(trainer.data_collator, MetaCollator):
            trainer.data_collator = MetaCollator(trainer.data_collator)
        original = trainer.training_step
        tap = self
        patches.applicable('guard_tap_training_step')  # refused where upstream is not the code it was checked on

        def training_step(model, inputs, *args, **kwargs):
            return tap.training_step(original, model, inputs, *args, **kwargs)

        trainer.training_step = patches.mark(training_step, 'guard_tap_training_step', original)

    def add(self, listener) -> None:
        if listener not in self.listeners:
            self.listeners.append(listener)

    # the wrapped training step -------------------------------------------------------------------------------
    def training_step(self, original, model, inputs, *args, **kwargs):
        meta = inputs.pop(META_KEY, None) if isinstance(inputs, dict) else None
        if meta is None and isinstance(inputs, dict):
            meta = batch_meta(inputs)  # untagged (packing/streaming): counted on device, one sync
        self.current_meta = meta
        self.micro_step += 1
        self.phase = 'batch_arrived'
        for listener in self.listeners:
            hook = getattr(listener, 'on_batch', None)
            if hook is not None:
                hook(meta, inputs)
        self.phase = 'forward'
        try:
            result = original(model, inputs, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 -- re-raised below, after the guards had their say
            for listener in self.listeners:
                hook = getattr(listener, 'on_step_error', None)
                if hook is not None:
                    hook(error, self.phase, meta)
            raise
        self.phase = 'after_backward'
        for listener in self.listeners:
            hook = getattr(listener, 'on_backward_end', None)
            if hook is not None:
                hook(meta)
        return result


def get_tap(trainer) -> BatchTap:
    tap = getattr(trainer, TAP_ATTR, None)
    if tap is None:
        tap = BatchTap(trainer)
        setattr(trainer, TAP_ATTR, tap)
    return tap


def now() -> float:
    return round(time.time(), 3)


def tensors_equal(a, b):
    """Element-wise equality in the stored dtype (NaN equals NaN); returns (equal, max abs difference)."""
    import torch
    if torch.equal(a, b):
        return True, 0.0
    if a.is_floating_point():
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if bool(same.all()):
            return True, 0.0
        diff = (a.double() - b.double()).abs()
        diff[same] = 0
        return False, float(diff.max())
    return False, float('nan')
