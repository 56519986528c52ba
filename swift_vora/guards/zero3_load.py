"""Guard `zero3_load`: under DeepSpeed ZeRO-3 the loaded weights are the checkpoint's weights.

Under ZeRO-3 every parameter is partitioned at load time (`deepspeed.zero.Init`): `param.shape` is `(0,)`, the
logical shape is `param.ds_shape`, and a checkpoint key that does not map onto a model parameter simply leaves
that parameter at its random initialisation -- with no warning (the Qwen2.5-VL `visual.*` / `model.*` key
layouts of newer transformers are the known case). This guard, at `on_init_end` (before the DeepSpeed engine
and the optimizer are built), walks every tensor of the checkpoint's safetensors:

- maps the checkpoint key to a model parameter through one canonical form (`model.language_model.X` ==
  `language_model.X` == old-style `model.X`; `model.visual.X` == `visual.X`; PEFT's `base_model.model.` prefix
  and LoRA's `.base_layer` dropped; tied parameters found under every name);
- compares the logical shape (`ds_shape`);
- gathers that one parameter (`deepspeed.zero.GatheredParameters`, all ranks, one at a time: peak memory is
  the largest single tensor) and compares it element-wise with the checkpoint tensor cast to the parameter's
  dtype (the cast the loader made; NaN equals NaN). Under ZeRO-3 the tensors are split over ranks for
  reading/comparing; replicated copies (DDP, `always` mode) are each checked whole by their own rank.
- also lists model parameters (other than adapters) that no checkpoint key covers.

It logs "n of n checkpoint tensors match", writes `zero3_load.json`, and stops on any missing, unmapped,
mis-shaped or different tensor. It runs when ZeRO-3 is active; `SWIFT_VORA_ZERO3_LOAD=always` runs the same
comparison without ZeRO-3 (useful for any new checkpoint layout), `never` switches it off.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from swift.callbacks import TrainerCallback

from .common import (
    GuardError,
    all_gather_objects,
    logger,
    output_dir,
    rank,
    tensors_equal,
    unwrap_model,
    world_size,
    write_json,
)

NAME = 'zero3_load'
MODE_ENV = 'SWIFT_VORA_ZERO3_LOAD'
ADAPTER_MARKERS = ('lora_', '.modules_to_save.', 'lora_magnitude_vector', '.vera_', '.ia3_')


def canonical(name: str) -> Optional[str]:
    """One spelling for checkpoint keys and model parameter names; None for adapter-only parameters."""
    if name.startswith('base_model.model.'):
        name = name[len('base_model.model.'):]
    if any(marker in name for marker in ADAPTER_MARKERS):
        return None
    name = name.replace('.base_layer.', '.').replace('.original_module.', '.')
    for old, new in (('model.language_model.', 'language_model.'), ('language_model.model.', 'language_model.'),
                     ('model.visual.', 'visual.'), ('language_model.lm_head.', 'lm_head.')):
        if name.startswith(old):
            return new + name[len(old):]
    if name.startswith('model.'):  # text-only layout (and old VL layouts): model.layers.* is the language model
        return 'language_model.' + name[len('model.'):]
    return name


def checkpoint_files(model_dir: str) -> List[str]:
    index = os.path.join(model_dir, 'model.safetensors.index.json')
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get('weight_map', {})
        return sorted({os.path.join(model_dir, name) for name in weight_map.values()})
    return sorted(p for p in glob.glob(os.path.join(model_dir, '*.safetensors'))
                  if not os.path.basename(p).startswith('adapter_'))


def logical_shape(param) -> Tuple[int, ...]:
    shape = getattr(param, 'ds_shape', None)
    return tuple(shape) if shape is not None else tuple(param.shape)


def is_zero3(model) -> bool:
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled
        if is_deepspeed_zero3_enabled():
            return True
    except Exception:  # noqa: BLE001
        pass
    return any(hasattr(p, 'ds_shape') for p in model.parameters())


def _gathered(param):
    if hasattr(param, 'ds_shape'):
        import deepspeed
        return deepspeed.zero.GatheredParameters([param], modifier_rank=None)
    return contextlib.nullcontext()


def verify_loaded_weights(model, model_dir: str) -> Dict[str, Any]:
    """Compare every checkpoint tensor with the (possibly ZeRO-3 partitioned) model; collective under DS."""
    from safetensors import safe_open
    files = checkpoint_files(model_dir)
    params: Dict[str, Any] = {}
    names: Dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        key = canonical(name)
        if key is not None and key not in params:
            params[key], names[key] = param, name
    entries: List[Tuple[str, str]] = []  # (checkpoint key, file)
    for path in files:
        with safe_open(path, framework='pt') as f:
            entries.extend((k, path) for k in f.keys())
    entries.sort()
    r, world = rank(), world_size()
    # Partitioned (ZeRO-3): every rank sees the same gathered tensor, so the comparisons are split over ranks.
    # Replicated (DDP / single process): each rank loaded its own copy and checks all of it.
    split = any(hasattr(p, 'ds_shape') for p in params.values())
    local = {'matched': 0, 'different': [], 'shape_mismatch': [], 'unmapped_checkpoint_keys': [], 'skipped': []}
    covered = set()  # ids of parameters that some checkpoint key covers (tied parameters have several names)
    handles: Dict[str, Any] = {}
    try:
        for position, (key, path) in enumerate(entries):
            canon = canonical(key)
            param = params.get(canon) if canon is not None else None
            if param is None:
                if r == 0:
                    local['unmapped_checkpoint_keys'].append(key)
                continue
            covered.add(id(param))
            mine = position % world == r if split else True
            if path not in handles and mine:
                handles[path] = safe_open(path, framework='pt')
            shape = tuple(handles[path].get_slice(key).get_shape()) if mine else None
            if mine and shape != logical_shape(param):
                local['shape_mismatch'].append({'key': key, 'param': names[canon], 'rank': r, 'checkpoint': list(shape),
                                                'model': list(logical_shape(param))})
            with _gathered(param):  # collective: every rank enters, one parameter at a time
                if not mine or shape != logical_shape(param):
                    continue
                value = param.data
                if not value.is_floating_point():
                    local['skipped'].append({'key': key, 'reason': f'model dtype {value.dtype}'})
                    continue
                ref = handles[path].get_tensor(key).to(device=value.device, dtype=value.dtype)
                same, max_diff = tensors_equal(value.reshape(ref.shape), ref)
                if same:
                    local['matched'] += 1
                else:
                    local['different'].append({'key': key, 'param': names[canon], 'rank': r,
                                               'max_abs_diff': max_diff})
    finally:
        handles.clear()
    merged: Dict[str, Any] = {'matched': 0, 'different': [], 'shape_mismatch': [], 'unmapped_checkpoint_keys': [],
                              'skipped': []}
    parts = all_gather_objects(local)
    for part in parts:
        merged['matched'] += part['matched']
        for k in ('different', 'shape_mismatch', 'unmapped_checkpoint_keys', 'skipped'):
            merged[k].extend(part[k])
    if not split:  # every rank checked every tensor: report the weakest rank
        merged['matched'] = min(part['matched'] for part in parts)
        merged['skipped'] = parts[0]['skipped']
    # every rank walks all keys, so each rank's coverage is complete (ids are only compared within a process)
    seen_ids, not_covered = set(), []
    for k, param in params.items():
        if id(param) in seen_ids:
            continue
        seen_ids.add(id(param))
        if id(param) not in covered:
            not_covered.append(names[k])
    merged['params_not_in_checkpoint'] = sorted(not_covered)
    merged.update({'checkpoint_dir': model_dir, 'files': [os.path.basename(p) for p in files],
                   'checkpoint_tensors': len(entries), 'zero3': any(hasattr(p, 'ds_shape') for p in params.values()),
                   'world_size': world})
    merged['ok'] = bool(entries) and not (merged['different'] or merged['shape_mismatch']
                                          or merged['unmapped_checkpoint_keys'] or merged['params_not_in_checkpoint'])
    return merged


def summary_line(report: Dict[str, Any]) -> str:
    line = (f'{report["matched"]} of {report["checkpoint_tensors"]} checkpoint tensors match'
            f'{" (ZeRO-3, gathered one at a time)" if report.get("zero3") else ""}')
    problems = []
    for key, label in (('unmapped_checkpoint_keys', 'checkpoint keys with no model parameter'),
                       ('params_not_in_checkpoint', 'model parameters not in the checkpoint (left at init)'),
                       ('shape_mismatch', 'shape mismatches'), ('different', 'tensors with different values')):
        if report.get(key):
            items = report[key]
            shown = [i if isinstance(i, str) else i.get('key') for i in items[:5]]
            problems.append(f'{len(items)} {label}: {shown}{" ..." if len(items) > 5 else ""}')
    return line + ('; ' + '; '.join(problems) if problems else '')


def model_dir_of(model) -> Optional[str]:
    for candidate in (getattr(model, 'model_dir', None), getattr(getattr(model, 'model_info', None), 'model_dir', None),
                      getattr(getattr(model, 'config', None), '_name_or_path', None)):
        if isinstance(candidate, str) and os.path.isdir(candidate):
            return candidate
    return None


class Zero3LoadGuard(TrainerCallback):

    def on_init_end(self, args, state, control, **kwargs):
        from .. import switches
        mode = switches.read(MODE_ENV)
        if mode == 'never':
            return
        model = unwrap_model(self.trainer)
        if mode == 'auto' and not is_zero3(model):
            return
        model_dir = model_dir_of(model)
        if model_dir is None or not checkpoint_files(model_dir):
            logger.warning(f'swift-vora zero3_load: no safetensors checkpoint found for the model ({model_dir}); the '
                           'loaded weights are not verified.')
            return
        report = verify_loaded_weights(model, model_dir)
        if rank() == 0:
            write_json(os.path.join(output_dir(self.trainer), 'zero3_load.json'), report)
        line = summary_line(report)
        if not report['ok']:
            raise GuardError(NAME, f'{line}. The model does not hold the checkpoint\'s weights (key layout mismatch '
                                   f'or a failed load) -- see zero3_load.json.')
        logger.info(f'swift-vora zero3_load: {line}.')
