"""Check a merged MoE checkpoint against its adapter: sampled experts equal base + B@A.

A merged export of LoRA on fused expert tensors (Unsloth's `save_pretrained_merged`, or PEFT's merge) is written by
code other than the code that trained it; a wrong layout (experts transposed, gate/up halves swapped, the scale
forgotten) still produces a checkpoint that loads and generates text. So the merged weights are compared, for a
sample of layers and experts, with what PEFT itself says the adapter adds: PEFT's own `ParamWrapper.get_delta_weight`
on the base model with the saved adapter (the layout that PEFT loads and vLLM's LoRA serving follows), summed in
float32; the merged bf16 value must be that sum rounded to bf16, within one unit in the last place. The merged
directory is loaded with transformers, which is the other half of the check ("transformers loads it"). The two
models are loaded one after the other, each where it fits, so a 35B checkpoint is checked on one H200.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

REPORT_FILE = 'swift_vora_merge_check.json'


def has_expert_adapters(adapter_dir: str) -> bool:
    """Did the adapter target fused expert tensors (PEFT `target_parameters`)?"""
    path = os.path.join(adapter_dir, 'adapter_config.json')
    try:
        with open(path, encoding='utf-8') as f:
            return bool(json.load(f).get('target_parameters'))
    except (OSError, ValueError):
        return False


# How Unsloth packs a fused expert LoRA's lora_B (written into adapter_config.json by unsloth_zoo, unsloth#6930).
# PEFT reads every adapter as `rank_major`; an adapter packed `grouped_by_expert` (older Unsloth, or
# UNSLOTH_MOE_LORA_B_LAYOUT=grouped_by_expert) has the same shapes, so PEFT would merge it into scrambled experts
# and the comparison below, which asks PEFT for the delta, would agree with the scramble.
PEFT_LORA_B_LAYOUT = 'rank_major'


def foreign_expert_layout(adapter_dir: str) -> Optional[str]:
    """None if PEFT reads this adapter's fused expert LoRA as it was trained; else why not (file and field)."""
    path = os.path.join(adapter_dir, 'adapter_config.json')
    try:
        with open(path, encoding='utf-8') as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    found = []
    if config.get('lora_B_layout') not in (None, PEFT_LORA_B_LAYOUT):
        found.append(f'lora_B_layout={config["lora_B_layout"]!r}')
    detail = config.get('unsloth_fused_expert_lora') or {}
    for name, entry in sorted((detail.get('parameters') or {}).items()):
        layout = entry.get('lora_B_layout') if isinstance(entry, dict) else None
        if layout not in (None, PEFT_LORA_B_LAYOUT):
            found.append(f'unsloth_fused_expert_lora.parameters.{name}.lora_B_layout={layout!r}')
    if not found:
        return None
    return (f'{path}: {", ".join(found)}: this adapter packs its expert lora_B differently from PEFT '
            f'({PEFT_LORA_B_LAYOUT!r}); a PEFT merge or vLLM would scramble the experts. Merge it with Unsloth in a '
            'process that sets UNSLOTH_MOE_LORA_B_LAYOUT to the same layout (its save_pretrained_merged), or retrain '
            'with the current unsloth_zoo (rank_major).')


def _merged_name(peft_module_name: str) -> str:
    """`base_model.model.model.layers.0.mlp.experts.base_layer` -> `model.layers.0.mlp.experts`."""
    parts = peft_module_name.split('.')
    if parts[:2] == ['base_model', 'model']:
        parts = parts[2:]
    return '.'.join(p for p in parts if p != 'base_layer')


def _sample(n: int, k: int) -> List[int]:
    """k indices spread over range(n), first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def check_expert_merge(adapter_dir: str, base: str, merged_dir: str, layers: int = 2, experts: int = 3,
                       adapter_name: str = 'default') -> Dict[str, Any]:
    """Compare sampled experts of `merged_dir` with base + delta from PEFT; returns a report with `ok`.

    One model at a time, each where it fits (host RAM, else the GPU: `load_device`, as the adapter reload chooses):
    the base with the adapter first, from which only the sampled experts' base values and PEFT's deltas are kept (on
    the host, float32), then the merged model. The base loads in its own dtype and is widened to float32 for the sum:
    a bf16 value widens exactly, so the oracle is the same as a float32 load -- which at full depth (35 B parameters:
    140 GB in float32, then 65 GiB more for the merged copy) no host of the H200 machine's 125 GiB could hold."""
    import gc

    import torch
    import transformers
    from peft import PeftModel
    from peft.tuners.lora.layer import ParamWrapper

    from ..guards.verify_adapter import load_device

    config = transformers.AutoConfig.from_pretrained(merged_dir)
    cls = getattr(transformers, (config.architectures or [''])[0], None) or transformers.AutoModelForCausalLM

    def load(path: str):
        device = load_device(path)
        return cls.from_pretrained(path, dtype='auto', **({'device_map': device} if device else {})), device

    base_model, base_device = load(base)
    peft_model = PeftModel.from_pretrained(base_model, adapter_dir)
    wrappers = [(name, module) for name, module in peft_model.named_modules() if isinstance(module, ParamWrapper)]
    if not wrappers:
        raise ValueError(f'{adapter_dir}: no LoRA on expert parameters (ParamWrapper) in the reloaded adapter')
    layer_ids = sorted({_layer_of(name) for name, _ in wrappers} - {None})
    keep = set(_sample(len(layer_ids), layers))
    chosen_layers = {layer_ids[i] for i in keep}
    wanted = []  # (target, sampled experts, base values, deltas), all float32 on the host
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # PEFT's B@A on a GPU in full float32, as on the host
    try:
        with torch.no_grad():
            for name, module in wrappers:
                if _layer_of(name) not in chosen_layers:
                    continue
                base_param = module.get_param()
                # PEFT casts the delta to the parameter's dtype; widened for the call, it stays float32 (one layer's
                # experts at a time: 2 GB at full depth), so the oracle rounds once, at the end, as before
                narrow = base_param.data
                base_param.data = narrow.float()
                try:
                    delta = module.get_delta_weight(adapter_name).detach()
                finally:
                    base_param.data = narrow
                base_param = narrow
                picked = _sample(base_param.shape[0], experts)
                wanted.append((f'{_merged_name(name)}.{module.parameter_name}', picked, list(base_param.shape),
                               base_param[picked].float().cpu(), delta[picked].float().cpu()))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    del peft_model, base_model, wrappers, module, base_param, delta
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    merged, merged_device = load(merged_dir)
    checks = []
    for target, picked, base_shape, base_values, deltas in wanted:
        merged_param = merged.get_parameter(target).detach()
        if list(merged_param.shape) != base_shape:
            checks.append({'tensor': target, 'ok': False, 'reason': f'merged shape {list(merged_param.shape)} != base '
                                                                     f'{base_shape}'})
            continue
        merged_values = merged_param[picked].float().cpu()
        for i, e in enumerate(picked):
            expected = base_values[i] + deltas[i]
            diff = (merged_values[i] - expected).abs()
            # one bf16 unit in the last place (8 significant bits), whichever way the merge rounded
            ulp = torch.maximum(expected.abs(), merged_values[i].abs()) * 2.0 ** -7
            ok = bool((diff <= ulp + 1e-7).all())
            # elements where the delta is larger than the rounding: there a wrong layout, a missing scale or an
            # unmerged expert cannot hide inside the tolerance
            telling = int((deltas[i].abs() > 2 * ulp).sum())
            checks.append({'tensor': target, 'expert': e, 'ok': ok, 'max_abs_diff': float(diff.max()),
                           'delta_max_abs': float(deltas[i].abs().max()), 'elements_telling': telling,
                           'merged_moved_from_base': float((merged_values[i] - base_values[i]).abs().max())})
    del merged
    gc.collect()
    report = {'adapter': adapter_dir, 'base': base, 'merged': merged_dir, 'layers': sorted(chosen_layers),
              'checked': len(checks), 'ok': bool(checks) and all(c['ok'] for c in checks),
              'trained': any(c.get('delta_max_abs', 0) > 0 for c in checks),
              'elements_telling': sum(c.get('elements_telling', 0) for c in checks), 'checks': checks,
              'loaded_with': f'transformers {cls.__name__}',
              'loaded_on': {'base': base_device or 'cpu', 'merged': merged_device or 'cpu'},
              'source': "merged weights vs base + PEFT ParamWrapper.get_delta_weight, in bf16"}
    return report


def _layer_of(name: str) -> Optional[int]:
    parts = name.split('.')
    for i, p in enumerate(parts[:-1]):
        if p == 'layers' and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def main(argv: Optional[List[str]] = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog='python -m swift_vora.backends.expert_merge_check',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('adapter_dir')
    parser.add_argument('base')
    parser.add_argument('merged_dir')
    args = parser.parse_args(argv)
    report = check_expert_merge(args.adapter_dir, args.base, args.merged_dir)
    print(json.dumps({k: v for k, v in report.items() if k != 'checks'}, indent=2))
    return 0 if report['ok'] else 1


if __name__ == '__main__':
    raise SystemExit(main())
