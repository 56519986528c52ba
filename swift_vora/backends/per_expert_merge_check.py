"""Check a merged MoE checkpoint against an adapter on per-expert modules: sampled experts equal base + B@A.

Megatron-SWIFT trains the experts' LoRA in its grouped linears and exports the adapter in the hub's per-expert names
(`...mlp.experts.{e}.gate_proj.lora_A.weight`, `up_proj`, `down_proj`: mcore-bridge writes linear_fc1's one lora_A for
both gate and up, and splits its lora_B in two); it writes the merged weights itself (`checkpoint-N-merged`), in
transformers' fused layout (`...mlp.experts.gate_up_proj` [E, 2I, H], `...experts.down_proj` [E, H, I]), while a base
saved by transformers holds the hub's per-expert tensors. A wrong export (experts permuted, gate and up halves
swapped, the scale forgotten) still loads and generates text, so, as `expert_merge_check` does for PEFT's fused
expert LoRA, sampled experts of sampled layers are compared with base + scale * B @ A summed in float32 from the
saved adapter -- PEFT's delta for a LoRA on a Linear (`lora_alpha / r`, or `/ sqrt(r)` with rsLoRA).

Only the sampled tensors are read (safetensors slices: one expert of a fused tensor, never a whole model), so the
check runs beside a 35B checkpoint on any host. Each checkpoint is read in whichever layout it holds; a fused tensor
is split by the model's own sizes (config.json), and a fused tensor of another shape is refused, not guessed (where
the sizes cannot tell two layouts apart -- 2I equal to H -- the values do: the check fails).
Megatron rounds the delta to bf16 before adding it (its weights are bf16), so the tolerance is one bf16 unit of the
largest of the sum, the merged value and the delta.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .expert_merge_check import _sample

ADAPTER_EXPERT = re.compile(r'(?:^|\.)layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.'
                            r'(?P<proj>gate_proj|up_proj|down_proj)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$')


class ExpertLayoutError(ValueError):
    """A checkpoint holds an expert tensor in a shape the model's sizes do not explain."""


# transformers' fused expert layout (its conversion mapping for the Qwen MoE family stacks the hub's per-expert
# tensors over the experts and concatenates gate and up on dim 1): the one place this package reads it
FUSED = {'gate_proj': 'gate_up_proj', 'up_proj': 'gate_up_proj', 'down_proj': 'down_proj'}


def fused_shape(fused: str, experts: int, inter: int, hidden: int) -> List[int]:
    """The shape of a fused expert tensor: `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]."""
    return [experts, 2 * inter, hidden] if fused == 'gate_up_proj' else [experts, hidden, inter]


def expert_of_fused(row, proj: str, inter: int):
    """Expert e's `proj` weight ([out, in], as the hub stores it) from row e of its fused tensor."""
    return row if proj == 'down_proj' else (row[:inter] if proj == 'gate_proj' else row[inter:])


def _adapter_files(adapter_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(adapter_dir, '*.safetensors')))


def has_per_expert_adapters(adapter_dir: str) -> bool:
    """Does the saved adapter hold LoRA on per-expert modules (Megatron's export)?"""
    from safetensors import safe_open
    for path in _adapter_files(adapter_dir):
        with safe_open(path, 'pt') as f:
            if any(ADAPTER_EXPERT.search(k) for k in f.keys()):
                return True
    return False


class Checkpoint:
    """A checkpoint's tensors by name, read one (or one slice) at a time."""

    def __init__(self, model_dir: str):
        from safetensors import safe_open
        self.dir = model_dir
        index = os.path.join(model_dir, 'model.safetensors.index.json')
        if os.path.isfile(index):
            with open(index, encoding='utf-8') as f:
                self.files = {k: os.path.join(model_dir, v) for k, v in json.load(f)['weight_map'].items()}
        else:
            self.files = {}
            for path in sorted(glob.glob(os.path.join(model_dir, '*.safetensors'))):
                with safe_open(path, 'pt') as f:
                    self.files.update({k: path for k in f.keys()})
        if not self.files:
            raise FileNotFoundError(f'{model_dir}: no safetensors weights')
        with open(os.path.join(model_dir, 'config.json'), encoding='utf-8') as f:
            config = json.load(f)
        self.text = config.get('text_config') or config

    def find(self, suffix: str) -> Optional[str]:
        """The language model's tensor named `...{suffix}` (not the vision tower's, not a multi-token-prediction
        layer's); None when there is none."""
        hits = [k for k in self.files if (k == suffix or k.endswith('.' + suffix)) and not k.startswith('mtp.')
                and '.mtp.' not in k and 'visual' not in k]
        if len(hits) > 1:
            raise ExpertLayoutError(f'{self.dir}: {len(hits)} tensors end with {suffix}: {hits[:3]}')
        return hits[0] if hits else None

    def read(self, key: str, index: Optional[int] = None):
        from safetensors import safe_open
        with safe_open(self.files[key], 'pt') as f:
            if index is None:
                return f.get_tensor(key)
            return f.get_slice(key)[index]

    def shape(self, key: str) -> List[int]:
        from safetensors import safe_open
        with safe_open(self.files[key], 'pt') as f:
            return list(f.get_slice(key).get_shape())

    def expert(self, layer: int, expert: int, proj: str):
        """Expert `expert`'s `proj` weight of `layer` ([out, in], as the hub stores it), from whichever layout this
        checkpoint holds."""
        key = self.find(f'layers.{layer}.mlp.experts.{expert}.{proj}.weight')
        if key is not None:
            return self.read(key)
        experts, hidden = self.text['num_experts'], self.text['hidden_size']
        inter = self.text.get('moe_intermediate_size') or self.text['intermediate_size']
        fused = FUSED[proj]
        expected = fused_shape(fused, experts, inter, hidden)
        key = self.find(f'layers.{layer}.mlp.experts.{fused}')
        if key is None:
            raise ExpertLayoutError(f'{self.dir}: layer {layer} has neither experts.{expert}.{proj}.weight nor a fused '
                                    f'experts.{fused}')
        if self.shape(key) != expected:
            raise ExpertLayoutError(f'{self.dir}: {key} is {self.shape(key)}; the model\'s sizes (config.json) make '
                                    f'the fused layout {expected}: a layout this check cannot read')
        return expert_of_fused(self.read(key, expert), proj, inter)


def _scale(adapter_dir: str) -> float:
    """PEFT's LoRA scaling for this adapter; refuses the per-module patterns it would have to match."""
    path = os.path.join(adapter_dir, 'adapter_config.json')
    with open(path, encoding='utf-8') as f:
        config = json.load(f)
    if config.get('rank_pattern') or config.get('alpha_pattern') or config.get('use_dora'):
        raise ValueError(f'{path}: rank_pattern / alpha_pattern / use_dora: per-module scaling this check does not '
                         'read')
    r, alpha = config['r'], config['lora_alpha']
    return alpha / math.sqrt(r) if config.get('use_rslora') else alpha / r


def check_per_expert_merge(adapter_dir: str, base: str, merged_dir: str, layers: int = 2,
                           experts: int = 3) -> Dict[str, Any]:
    """Compare sampled experts of `merged_dir` with base + scale * B @ A of the saved per-expert adapter; returns a
    report with `ok` and `trained` (as `expert_merge_check.check_expert_merge`)."""
    import torch
    from safetensors import safe_open

    lora: Dict[Tuple[int, int, str, str], Tuple[str, str]] = {}
    for path in _adapter_files(adapter_dir):
        with safe_open(path, 'pt') as f:
            for key in f.keys():
                m = ADAPTER_EXPERT.search(key)
                if m:
                    lora[(int(m['layer']), int(m['expert']), m['proj'], m['ab'])] = (path, key)
    if not lora:
        raise ValueError(f'{adapter_dir}: no LoRA on per-expert modules (layers.N.mlp.experts.E.*.lora_A/B)')
    scale = _scale(adapter_dir)
    layer_ids = sorted({k[0] for k in lora})
    chosen_layers = [layer_ids[i] for i in _sample(len(layer_ids), layers)]
    base_ckpt, merged_ckpt = Checkpoint(base), Checkpoint(merged_dir)

    def adapter_tensor(layer, expert, proj, ab):
        path, key = lora[(layer, expert, proj, ab)]
        with safe_open(path, 'pt') as f:
            return f.get_tensor(key).float()

    checks = []
    for layer in chosen_layers:
        expert_ids = sorted({k[1] for k in lora if k[0] == layer})
        for e in [expert_ids[i] for i in _sample(len(expert_ids), experts)]:
            for proj in ('gate_proj', 'up_proj', 'down_proj'):
                if (layer, e, proj, 'A') not in lora or (layer, e, proj, 'B') not in lora:
                    continue
                target = f'layers.{layer}.mlp.experts.{e}.{proj}.weight'
                delta = (adapter_tensor(layer, e, proj, 'B') @ adapter_tensor(layer, e, proj, 'A')) * scale
                base_w = base_ckpt.expert(layer, e, proj).float()
                merged_w = merged_ckpt.expert(layer, e, proj).float()
                if merged_w.shape != base_w.shape or delta.shape != base_w.shape:
                    checks.append({'tensor': target, 'ok': False,
                                   'reason': f'shapes: merged {list(merged_w.shape)}, base {list(base_w.shape)}, '
                                             f'B@A {list(delta.shape)}'})
                    continue
                expected = base_w + delta
                diff = (merged_w - expected).abs()
                # one bf16 unit of the largest of sum, merged value and delta: Megatron rounds the delta to its
                # weights' bf16 before the addition rounds again
                ulp = torch.maximum(torch.maximum(expected.abs(), merged_w.abs()), delta.abs()) * 2.0 ** -7
                checks.append({'tensor': target, 'ok': bool((diff <= ulp + 1e-7).all()),
                               'max_abs_diff': float(diff.max()), 'delta_max_abs': float(delta.abs().max()),
                               # where the delta is larger than the rounding, a wrong layout cannot hide
                               'elements_telling': int((delta.abs() > 2 * ulp).sum()),
                               'merged_moved_from_base': float((merged_w - base_w).abs().max())})
    return {'adapter': adapter_dir, 'base': base, 'merged': merged_dir, 'layers': chosen_layers,
            'checked': len(checks), 'ok': bool(checks) and all(c['ok'] for c in checks),
            'trained': any(c.get('delta_max_abs', 0) > 0 for c in checks),
            'elements_telling': sum(c.get('elements_telling', 0) for c in checks), 'checks': checks,
            'loaded_with': 'safetensors slices (per-expert adapter)', 'scale': scale,
            'source': 'merged weights vs base + scale * B @ A of the per-expert adapter, float32, bf16 tolerance'}
