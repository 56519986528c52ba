"""Merged bf16 weights that vLLM can load, from any adapter this project trains.

    scripts/merge_for_vllm.sh ADAPTER_DIR OUT_DIR [--base MODEL_DIR]
    python -m swift_vora.backends.merge ADAPTER_DIR OUT_DIR [--base MODEL_DIR]

Where the adapter came from decides how it is merged (`detect_source`):
- swift LoRA (`swift sft` checkpoint: adapter_config.json + args.json) -> `swift export --adapters ADAPTER
  --merge_lora true --torch_dtype bfloat16` (ms-swift's own merge, the plugin re-imported from args.json).
- Megatron (`megatron sft` checkpoint-N / checkpoint-N-merged) -> Megatron-SWIFT already wrote the merged HF
  weights to checkpoint-N-merged during training: copied and verified (MoE LoRA from Megatron is not merged with
  swift export); where checkpoint-N holds the adapter with LoRA on the experts, sampled experts are checked against
  base + B@A (per_expert_merge_check.py).
- Unsloth (swift_vora_adapter.json with source "unsloth") -> the runner's checkpoint-N-merged if it exists,
  else Unsloth's `save_pretrained_merged(..., save_method="merged_16bit")` (needs unsloth, i.e. a GPU).
Where an existing merged folder is copied (Megatron, Unsloth), its `*.safetensors` files are hard-linked when OUT_DIR
is on the same filesystem -- no second copy of the weights (65 GiB for the 35B-A3B); nothing here or in vLLM writes
into a weight file, and a checkpoint's files are replaced by new files, never rewritten in place. `--copy` copies
them anyway; across filesystems they are copied. The report counts both (`weights_linked`, `weights_copied`).
- PEFT (swift_vora_adapter.json with source "peft", or a plain PEFT adapter) -> transformers + PEFT
  merge_and_unload in float32, saved in bf16.

The result is written to a temporary directory next to OUT_DIR and renamed to OUT_DIR only after it passed the
checks (`verify_merged`); an existing OUT_DIR is never touched (exit 2). Checks: bf16 safetensors; with an index,
every weight_map file exists, every tensor of every file is indexed to that file and no shard is unreferenced;
without an index, exactly one model.safetensors; no LoRA keys; `architectures` in VLLM_ARCHITECTURES; tokenizer
and (for vision-language models) processor files present (copied from the base model when the merge tool did
not write them).
"""
from __future__ import annotations

import argparse
import errno
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from .. import trained_budget
from .expert_merge_check import REPORT_FILE as EXPERT_REPORT
from .expert_merge_check import check_expert_merge, foreign_expert_layout, has_expert_adapters
from .per_expert_merge_check import ExpertLayoutError, check_per_expert_merge, has_per_expert_adapters
from .unsloth import MARKER_FILE

# Architectures vLLM serves, restricted to the families this project trains. Source: vLLM's model registry,
# vllm/model_executor/models/registry.py (_TEXT_GENERATION_MODELS and _MULTIMODAL_MODELS), read at commit
# 0002bff0b6cb for Qwen2/2.5/3-VL, Qwen3-VL-MoE, Qwen3, Qwen3-MoE, Qwen3-Next; the Qwen3.5 entries
# ("Qwen3_5ForConditionalGeneration": ("qwen3_5", ...), "Qwen3_5MoeForConditionalGeneration") were added to the
# same registry later (vLLM 0.28 lists both). Extend with the source when a new family is trained here.
VLLM_ARCHITECTURES = frozenset({
    'Qwen2VLForConditionalGeneration',
    'Qwen2_5_VLForConditionalGeneration',
    'Qwen3VLForConditionalGeneration',
    'Qwen3VLMoeForConditionalGeneration',
    'Qwen3_5ForConditionalGeneration',
    'Qwen3_5MoeForConditionalGeneration',
    'Qwen2ForCausalLM',
    'Qwen3ForCausalLM',
    'Qwen3MoeForCausalLM',
    'Qwen3NextForCausalLM',
})
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'vocab.json', 'merges.txt', 'special_tokens_map.json',
                   'added_tokens.json', 'chat_template.jinja', 'chat_template.json')
PROCESSOR_FILES = ('preprocessor_config.json', 'video_preprocessor_config.json', 'processor_config.json')
EXTRA_FILES = ('generation_config.json', )
MEGATRON_ONLY = ('latest_checkpointed_iteration.txt', )


class MergeError(Exception):
    """The merge cannot be done or its result failed a check; the message says which and why."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def _read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _is_megatron_args(args: Dict[str, Any]) -> bool:
    return any(k in args for k in ('expert_model_parallel_size', 'tensor_model_parallel_size', 'mcore_model',
                                   'micro_batch_size', 'global_batch_size'))


def detect_source(adapter_dir: str) -> Tuple[str, Dict[str, Any]]:
    """('swift' | 'megatron' | 'unsloth' | 'peft', details) for a checkpoint directory."""
    if not os.path.isdir(adapter_dir):
        raise MergeError(f'{adapter_dir}: no such directory', 2)
    marker = _read_json(os.path.join(adapter_dir, MARKER_FILE))
    if marker.get('source') in ('unsloth', 'peft'):
        return marker['source'], marker
    args = _read_json(os.path.join(adapter_dir, 'args.json'))
    megatron_files = os.path.exists(os.path.join(adapter_dir, 'latest_checkpointed_iteration.txt')) or glob.glob(
        os.path.join(adapter_dir, 'iter_*'))
    if _is_megatron_args(args) or megatron_files:
        return 'megatron', args
    if os.path.isfile(os.path.join(adapter_dir, 'adapter_config.json')):
        if args.get('model') or args.get('tuner_type'):
            return 'swift', args
        return 'peft', _read_json(os.path.join(adapter_dir, 'adapter_config.json'))
    raise MergeError(f'{adapter_dir}: not an adapter checkpoint this tool knows (no adapter_config.json, no '
                     f'{MARKER_FILE}, no Megatron args.json)', 2)


def base_model_of(adapter_dir: str, source: str, info: Dict[str, Any]) -> Optional[str]:
    for key in ('base_model', 'model', 'model_dir'):
        if info.get(key) and os.path.isdir(info[key]):
            return info[key]
    cfg = _read_json(os.path.join(adapter_dir, 'adapter_config.json'))
    path = cfg.get('base_model_name_or_path')
    return path if path and os.path.isdir(path) else None


# ---------------------------------------------------------------------------------------------------------------
def _swift_export(adapter_dir: str, staged: str) -> None:
    from ..offline import OFFLINE_ENV
    from .common import console_script
    argv = [console_script('swift'), 'export', '--adapters', adapter_dir, '--merge_lora', 'true', '--output_dir',
            staged, '--torch_dtype', 'bfloat16', '--safe_serialization', 'true', '--use_hf', 'true']
    print('$ ' + ' '.join(argv), flush=True)
    proc = subprocess.run(argv, env={**os.environ, **OFFLINE_ENV})
    if proc.returncode != 0:
        raise MergeError(f'swift export failed with exit code {proc.returncode}')


def _megatron_merged_dir(adapter_dir: str) -> str:
    adapter_dir = adapter_dir.rstrip(os.sep)
    merged = adapter_dir if adapter_dir.endswith('-merged') else adapter_dir + '-merged'
    if not os.path.isfile(os.path.join(merged, 'config.json')):
        raise MergeError(f'{merged}: Megatron-SWIFT writes the merged HF weights there when training with '
                         '--merge_lora true --save_safetensors true (our megatron recipes do); it is missing. '
                         'Export it with `megatron export --mcore_adapter CKPT --to_hf true --merge_lora true`.')
    return merged


# os.link's failures that mean "not here" (another filesystem, one that has no hard links, the link limit): copy
NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def _copy_model_dir(src: str, staged: str, link_weights: bool = True) -> Dict[str, int]:
    """`src` into `staged` without Megatron's and the runner's bookkeeping; its weight files hard-linked where the
    filesystem allows (`link_weights`), everything else copied. Counts of weight files linked and copied."""
    counts = {'weights_linked': 0, 'weights_copied': 0}

    def ignore(directory, names):
        return [n for n in names if n in MEGATRON_ONLY or n.startswith('iter_') or n == MARKER_FILE]

    def copy(source: str, target: str) -> str:
        if not source.endswith('.safetensors'):
            return shutil.copy2(source, target)
        if link_weights:
            try:
                os.link(source, target)
                counts['weights_linked'] += 1
                return target
            except OSError as e:
                if e.errno not in NO_LINK:
                    raise
        counts['weights_copied'] += 1
        return shutil.copy2(source, target)

    shutil.copytree(src, staged, ignore=ignore, copy_function=copy)
    return counts


def _peft_merge(adapter_dir: str, base: str, staged: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    config = AutoConfig.from_pretrained(base)
    auto = AutoModelForImageTextToText if hasattr(config, 'vision_config') else AutoModelForCausalLM
    model = auto.from_pretrained(base, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.to(torch.bfloat16).save_pretrained(staged, safe_serialization=True)


def _unsloth_merge(adapter_dir: str, staged: str, link_weights: bool = True) -> Dict[str, int]:
    merged = adapter_dir.rstrip(os.sep) + '-merged'
    if os.path.isfile(os.path.join(merged, 'config.json')):
        return _copy_model_dir(merged, staged, link_weights)
    try:
        import unsloth  # noqa: F401
        from unsloth import FastModel
    except ImportError:
        raise MergeError(f'{adapter_dir} is an Unsloth adapter and {merged} does not exist: merging needs unsloth '
                         '(a CUDA GPU). Run this on the GPU machine, or train with unsloth.save_merged=true.') from None
    model, tokenizer = FastModel.from_pretrained(model_name=adapter_dir, load_in_4bit=False, load_in_8bit=False)
    model.save_pretrained_merged(staged, tokenizer, save_method='merged_16bit')
    return {}


def _copy_processor_files(base: Optional[str], staged: str) -> List[str]:
    copied = []
    if not base:
        return copied
    for name in TOKENIZER_FILES + PROCESSOR_FILES + EXTRA_FILES:
        src, dst = os.path.join(base, name), os.path.join(staged, name)
        if os.path.isfile(src) and not os.path.exists(dst):
            shutil.copy2(src, dst)
            copied.append(name)
    return copied


# ---------------------------------------------------------------------------------------------------------------
def verify_merged(model_dir: str) -> Dict[str, Any]:
    """Check a merged model directory; raise MergeError naming every problem found."""
    from safetensors import SafetensorError, safe_open
    problems: List[str] = []
    config = _read_json(os.path.join(model_dir, 'config.json'))
    if not config:
        raise MergeError(f'{model_dir}: no config.json')
    archs = config.get('architectures') or []
    if not archs:
        problems.append('config.json has no architectures')
    bad_archs = [a for a in archs if a not in VLLM_ARCHITECTURES]
    if bad_archs:
        problems.append(f'architectures {bad_archs} are not in the list vLLM serves ({sorted(VLLM_ARCHITECTURES)})')

    shards = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, '*.safetensors')))
    index_path = os.path.join(model_dir, 'model.safetensors.index.json')
    weight_map: Dict[str, str] = {}
    if os.path.isfile(index_path):
        weight_map = (_read_json(index_path).get('weight_map') or {})
        if not weight_map:
            problems.append('model.safetensors.index.json has no weight_map')
        referenced = sorted(set(weight_map.values()))
        missing = [f for f in referenced if f not in shards]
        if missing:
            problems.append(f'weight_map names files that do not exist: {missing}')
        unreferenced = [f for f in shards if f not in referenced]
        if unreferenced:
            problems.append(f'safetensors files not in the index: {unreferenced}')
    elif shards != ['model.safetensors']:
        problems.append(f'no model.safetensors.index.json and the weights are not one model.safetensors: {shards}')

    tensors, nbytes, non_bf16, lora = 0, 0, [], []
    seen: Dict[str, str] = {}
    for shard in shards:
        path = os.path.join(model_dir, shard)
        try:
            opened = safe_open(path, framework='pt')
        except (SafetensorError, OSError) as e:  # a truncated or damaged shard: named, with the others checked
            problems.append(f'{shard}: not readable as safetensors ({e})')
            continue
        with opened as f:
            for key in f.keys():
                tensors += 1
                seen[key] = shard
                dtype = f.get_slice(key).get_dtype()
                if dtype in ('F16', 'F32', 'F64', 'F8_E4M3', 'F8_E5M2') and len(non_bf16) < 5:
                    non_bf16.append(f'{key} ({dtype})')
                if 'lora_' in key or '.base_layer.' in key:
                    lora.append(key)
                if weight_map and weight_map.get(key) != shard:
                    problems.append(f'{key} in {shard} is indexed to {weight_map.get(key)!r}')
        nbytes += os.path.getsize(path)
    if weight_map:
        absent = [k for k, f in weight_map.items() if seen.get(k) != f]
        if absent:
            problems.append(f'{len(absent)} indexed tensors are not in their file (e.g. {absent[:3]})')
    if non_bf16:
        problems.append(f'floating tensors that are not bf16: {non_bf16}')
    if lora:
        problems.append(f'LoRA keys left in the merged weights: {lora[:5]}')
    if os.path.exists(os.path.join(model_dir, 'adapter_config.json')):
        problems.append('adapter_config.json present: vLLM would treat this as an adapter')

    files = set(os.listdir(model_dir))
    if not ({'tokenizer.json'} <= files or {'vocab.json', 'merges.txt'} <= files):
        problems.append('no tokenizer (tokenizer.json or vocab.json + merges.txt)')
    if 'tokenizer_config.json' not in files:
        problems.append('no tokenizer_config.json')
    if 'vision_config' in config and not (set(PROCESSOR_FILES) & files):
        problems.append(f'a vision-language model without processor files ({", ".join(PROCESSOR_FILES)})')
    if problems:
        raise MergeError(f'{model_dir}: merged model failed its checks:\n  - ' + '\n  - '.join(problems))
    return {'architectures': archs, 'files': shards, 'indexed': bool(weight_map), 'tensors': tensors,
            'bytes': nbytes}


def _check_experts(adapter_dir: str, base: str, staged: str, per_expert: bool = False) -> Dict[str, Any]:
    """Sampled experts of the merged weights == base + B@A (expert_merge_check.py; per_expert_merge_check.py for an
    adapter on per-expert modules, Megatron's); the report is kept beside them."""
    try:
        check = check_per_expert_merge(adapter_dir, base, staged) if per_expert else \
            check_expert_merge(adapter_dir, base, staged)
    except ExpertLayoutError as e:
        raise MergeError(f'expert check: {e}') from None
    with open(os.path.join(staged, EXPERT_REPORT), 'w', encoding='utf-8') as f:
        json.dump(check, f, indent=2)
    if not (check['ok'] and check['trained']):
        bad = [c for c in check['checks'] if not c['ok']][:3]
        raise MergeError(f'merged expert weights differ from base + LoRA delta ({check["checked"]} checked, '
                         f'trained={check["trained"]}): {bad}')
    if not check['elements_telling']:  # every sampled delta within the tolerance: a scrambled merge would pass too
        raise MergeError(f'the expert check cannot tell a right merge from a wrong one: no sampled element of the '
                         f'{check["checked"]} checked moves by more than the tolerance (a LoRA delta this small '
                         'is below bf16 resolution); merged, not verified')
    return {k: check[k] for k in ('checked', 'ok', 'layers', 'elements_telling', 'loaded_with')}


def _expert_adapters(adapter_dir: str, source: str) -> Tuple[Optional[str], bool]:
    """(the folder whose adapter trains the experts, whether on per-expert modules -- Megatron's), or (None, False)."""
    if source in ('unsloth', 'peft') and has_expert_adapters(adapter_dir):
        return adapter_dir, False
    if source == 'megatron':
        lora_dir = adapter_dir[:-len('-merged')] if adapter_dir.endswith('-merged') else adapter_dir
        if os.path.isdir(lora_dir) and has_per_expert_adapters(lora_dir):
            return lora_dir, True
    return None, False


def merge(adapter_dir: str, out_dir: str, base: Optional[str] = None, link_weights: bool = True) -> Dict[str, Any]:
    adapter_dir = os.path.abspath(adapter_dir)
    out_dir = os.path.abspath(out_dir)
    if os.path.lexists(out_dir):
        raise MergeError(f'{out_dir} exists: refusing to overwrite it (choose a new OUT_DIR or remove it yourself)',
                         2)
    from ..errors import OutputPathError
    from ..outputs import check_output_dir
    try:  # a read-only or file-blocked parent fails here, in one line, before any work
        check_output_dir(out_dir, [adapter_dir, base], what='OUT_DIR')
    except OutputPathError as e:
        raise MergeError(str(e), 2) from None
    source, info = detect_source(adapter_dir)
    base = base or base_model_of(adapter_dir, source, info)
    expert_dir, per_expert = _expert_adapters(adapter_dir, source)
    if expert_dir and not base:  # before any work: the experts' merge is checked against the base model's weights
        raise MergeError(f'{adapter_dir}: the adapter trains the experts, whose merge is checked against the base '
                         'model, and its base is not a local folder here; pass --base MODEL_DIR', 2)
    # Before any work: an expert packing PEFT misreads would merge (and pass the expert check) scrambled
    layout_problem = foreign_expert_layout(adapter_dir) if source in ('unsloth', 'peft') else None
    if layout_problem:
        raise MergeError(layout_problem)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f'.{os.path.basename(out_dir)}.partial-', dir=parent)
    staged = os.path.join(tmp, 'model')
    weights: Dict[str, int] = {}
    try:
        if source == 'swift':
            _swift_export(adapter_dir, staged)
        elif source == 'megatron':
            weights = _copy_model_dir(_megatron_merged_dir(adapter_dir), staged, link_weights)
        elif source == 'unsloth':
            weights = _unsloth_merge(adapter_dir, staged, link_weights)
        else:
            if not base:
                raise MergeError(f'{adapter_dir}: base model unknown; pass --base MODEL_DIR', 2)
            _peft_merge(adapter_dir, base, staged)
        copied = _copy_processor_files(base, staged)
        # the video budget the adapter was trained on goes with the merged model (swift infer / vLLM users read it)
        budget = trained_budget.copy_into(trained_budget.find(adapter_dir), staged)
        report = verify_merged(staged)
        report['trained_budget'] = os.path.join(out_dir, trained_budget.FILE) if budget else None
        if expert_dir:
            report['expert_check'] = _check_experts(expert_dir, base, staged, per_expert=per_expert)
        if os.path.lexists(out_dir):
            raise MergeError(f'{out_dir} appeared while merging: refusing to overwrite it', 2)
        os.rename(staged, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.update({'source': source, 'adapter': adapter_dir, 'base': base, 'out_dir': out_dir,
                   'copied_from_base': copied, **weights})
    return report


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='merge_for_vllm', description=__doc__.split('\n\n')[0])
    parser.add_argument('adapter_dir')
    parser.add_argument('out_dir')
    parser.add_argument('--base', default=None, help='base model directory (default: from the checkpoint)')
    parser.add_argument('--copy', action='store_true', help='copy the weight files of an existing merged folder '
                        '(Megatron, Unsloth) instead of hard-linking them on the same filesystem')
    parser.add_argument('--verify-only', action='store_true', help='check an existing merged directory (ADAPTER_DIR '
                        'is ignored; OUT_DIR is checked)')
    args = parser.parse_args(argv)
    try:
        report = verify_merged(args.out_dir) if args.verify_only else merge(args.adapter_dir, args.out_dir, args.base,
                                                                              link_weights=not args.copy)
    except MergeError as e:
        print(f'merge_for_vllm: {e}', file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a file that cannot be read or written while merging (disk full, permissions)
        print(f'merge_for_vllm: {e.filename or args.out_dir}: {e.strerror or e}', file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
