"""Checks of a `megatron sft` LoRA run on a MoE model, and its results JSON (scripts/gpu/megatron_smoke.sh, EP=1;
scripts/gpu/megatron_ep.sh, EP=2); with `--full`, of a full-SFT run (megatron_ep_full; benchmarks/megatron_moe.py's
full variants).

What a user relies on, checked from the files the run left (nothing is taken from the run's own claims):
- the loss: at least --min-steps logged steps, all finite, the last below the first (logging.jsonl next to the
  checkpoint, written by Megatron-SWIFT's print callback);
- LoRA on the experts and on attention, none on the router: the merged weights (checkpoint-N-merged) against the
  base model -- expert and attention weights changed, router weights (`mlp.gate.weight`) bit-identical -- and the
  LoRA tensor names of the saved adapter when the checkpoint holds one;
  Where the two checkpoints hold the experts in different layouts (a base saved per expert, the hub layout; a merged
  export with one fused tensor per projection, transformers' own -- call h of #31) they are compared expert by expert;
- checkpoint-N-merged loads in transformers and gives finite logits;
- the measured peak (`memory(GiB)`: torch.cuda.max_memory_reserved) next to the planner's prediction.
- when the run wrote `lora_update.json` (swift-vora's `vora_lora_update` guard, next to logging.jsonl): every
  trainable LoRA tensor changed during training; one that did not is a failure, a check the run did not reach
  (fewer steps than SWIFT_VORA_LORA_CHECK_STEPS) is recorded as not checked.
Full SFT (`--full`, no --merged: checkpoint-N is the converted Hugging Face model Megatron-SWIFT wrote): the loss as
above; checkpoint-N against the base model by part -- experts, attention (and Gated DeltaNet) and the shared expert
changed, the router changed exactly when it was trained (`--router trained|frozen`: the recipe's
megatron.freeze_router), the vision tower bit-identical; checkpoint-N loads in transformers and gives finite logits;
the guard's `lora_update.json` in its full mode (`failures` empty: no frozen tensor moved, every part moved).
Exit 0 when every check passes, 1 otherwise (the JSON is written either way, with `failures`).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

ROUTER_KEYS = ('.mlp.gate.weight', '.router.')  # HF Qwen3-MoE / Qwen3-VL-MoE router; Megatron's TopKRouter
EXPERT_KEY = '.experts.'
ATTENTION_KEY = '.self_attn.'


def read_log(run_dir: str) -> List[Dict[str, object]]:
    """Megatron-SWIFT's logging.jsonl next to the checkpoint: one record per logged step, read once."""
    path = os.path.join(run_dir, 'logging.jsonl')
    records = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f'{path}:{line_no}: not JSON ({e})') from e
    return records


def log_field(records: List[Dict[str, object]], field: str) -> List[float]:
    """The numeric values of `field` over the logged steps (records without it are skipped)."""
    return [float(r[field]) for r in records if isinstance(r.get(field), (int, float))]


def read_lora_update(run_dir: str) -> Optional[Dict[str, object]]:
    """The `vora_lora_update` guard's report (None when the run has none: guards off, or an older run)."""
    path = os.path.join(run_dir, 'lora_update.json')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            report = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f'{path}: not JSON ({e})') from e
    checked = 'updated' in report and 'tensors' in report
    return {'checked': checked, 'note': report.get('note'),
            **{k: report.get(k) for k in ('tensors', 'updated', 'expert_tensors', 'expert_updated', 'steps_counted')},
            'not_updated': list(report.get('not_updated') or []),
            # the guard's own split: an expert's LoRA that no token was routed to in the counted steps cannot change
            # (no gradient reaches it); it is counted, not failed -- the guard stops the run only on `not_updated`
            'experts_not_reached': int(report.get('experts_not_reached') or 0)}


def lora_update_failure(lora_update: Optional[Dict[str, object]]) -> Optional[str]:
    """Why the guard's report fails the run: a tensor in `not_updated`, or unchanged tensors that neither list
    explains (an older guard without the split); experts no token reached do not fail it."""
    if not lora_update or not lora_update['checked']:
        return None
    stale = lora_update['not_updated']
    unexplained = lora_update['tensors'] - lora_update['updated'] - lora_update['experts_not_reached'] - len(stale)
    if not stale and unexplained <= 0:
        return None
    reached = (f' ({lora_update["experts_not_reached"]} more: experts no token reached)'
               if lora_update['experts_not_reached'] else '')
    more = f' and {len(stale) - 5} more' if len(stale) > 5 else ''
    return (f'{len(stale) + max(unexplained, 0)} of {lora_update["tensors"]} LoRA tensors did not update '
            f'(lora_update.json){reached}: {", ".join(stale[:5])}{more}')


def _tensors(model_dir: str) -> Dict[str, 'object']:
    from safetensors import safe_open
    tensors = {}
    for path in sorted(glob.glob(os.path.join(model_dir, '*.safetensors'))):
        with safe_open(path, 'pt') as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    if not tensors:
        raise FileNotFoundError(f'{model_dir}: no *.safetensors')
    return tensors


PER_EXPERT = re.compile(r'^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$')


def per_expert(tensors: Dict[str, 'object'], like: Dict[str, 'object']) -> Tuple[Dict[str, 'object'], List[str]]:
    """`tensors` with each fused expert tensor of a checkpoint (`...experts.gate_up_proj` [E, 2I, H],
    `...experts.down_proj` [E, H, I]: transformers' own layout, which Megatron's merged export writes) seen as the
    per-expert tensors `like` holds (`...experts.{e}.gate_proj.weight` etc.: the hub layout the base was saved in),
    as views, split as swift_vora's expert check splits them (`per_expert_merge_check.expert_of_fused`). Returns the
    tensors and the fused ones whose shape does not fit the experts of `like` (a layout the comparison cannot read:
    a failure, not a silent mismatch)."""
    from swift_vora.backends.per_expert_merge_check import FUSED, expert_of_fused, fused_shape
    shapes: Dict[Tuple[str, str], Tuple[int, Tuple[int, ...]]] = {}
    for key, tensor in like.items():
        m = PER_EXPERT.match(key)
        if m:
            n, _ = shapes.get((m['prefix'], m['proj']), (0, ()))
            shapes[(m['prefix'], m['proj'])] = (max(n, int(m['expert']) + 1), tuple(tensor.shape))
    out, unreadable = {}, []
    for key, tensor in tensors.items():
        prefix, _, name = key.rpartition('.')
        projs = [p for p, f in FUSED.items() if f == name and (prefix, p) in shapes]
        if not projs or (name == 'gate_up_proj' and len(projs) < 2):
            out[key] = tensor
            continue
        if name == 'gate_up_proj':  # the per-expert sizes: gate [I, H], down [H, I]
            experts, (inter, hidden) = shapes[(prefix, 'gate_proj')]
        else:
            experts, (hidden, inter) = shapes[(prefix, 'down_proj')]
        expected = fused_shape(name, experts, inter, hidden)
        if list(tensor.shape) != expected:
            unreadable.append(f'{key} {list(tensor.shape)}, the fused layout {expected}')
            continue
        for e in range(experts):
            for proj in projs:
                out[f'{prefix}.{e}.{proj}.weight'] = expert_of_fused(tensor[e], proj, inter)
    return out, unreadable


def compare_weights(base_dir: str, merged_dir: str) -> Dict[str, object]:
    """Which groups of weights LoRA changed: experts, attention, router (must stay identical). The merged experts
    are read in the base's layout where the two differ (`per_expert`)."""
    import torch
    base_raw, merged_raw = _tensors(base_dir), _tensors(merged_dir)
    base, unreadable_base = per_expert(base_raw, merged_raw)
    merged, unreadable = per_expert(merged_raw, base_raw)
    unreadable += unreadable_base
    missing = sorted(set(base) - set(merged))
    changed = {'experts': 0, 'attention': 0, 'router': 0}
    totals = {'experts': 0, 'attention': 0, 'router': 0}
    for key, tensor in base.items():
        if key not in merged:
            continue
        group = ('router' if any(r in key for r in ROUTER_KEYS) else 'experts' if EXPERT_KEY in key
                 else 'attention' if ATTENTION_KEY in key and 'visual' not in key else None)
        if group is None:
            continue
        totals[group] += 1
        if not torch.equal(tensor.to(torch.float32), merged[key].to(torch.float32)):
            changed[group] += 1
    return {'changed': changed, 'totals': totals, 'missing_in_merged': missing[:20], 'missing_count': len(missing),
            'unreadable_layout': unreadable}


# Full SFT: the part of the Hugging Face model a tensor belongs to (Qwen3.5-MoE / Qwen3-VL-MoE names), first match wins
FULL_PARTS = (('vision', ('visual', )), ('router', ('.mlp.gate.weight', )), ('shared_expert', ('.shared_expert', )),
              ('experts', (EXPERT_KEY, )), ('attention', (ATTENTION_KEY, '.linear_attn.')),
              ('embedding', ('embed_tokens', )), ('lm_head', ('lm_head', )))


def full_part(key: str) -> str:
    return next((part for part, keys in FULL_PARTS if any(k in key for k in keys)), 'other')


def compare_full(base_dir: str, checkpoint: str) -> Dict[str, object]:
    """Which parts full SFT changed: checkpoint-N (the converted HF model) against the base, tensor by tensor, the
    experts read in the base's layout where the two differ (`per_expert`)."""
    import torch
    base_raw, saved_raw = _tensors(base_dir), _tensors(checkpoint)
    base, unreadable_base = per_expert(base_raw, saved_raw)
    saved, unreadable = per_expert(saved_raw, base_raw)
    missing = sorted(set(base) - set(saved))
    changed: Dict[str, int] = {}
    totals: Dict[str, int] = {}
    for key, tensor in base.items():
        if key not in saved:
            continue
        part = full_part(key)
        totals[part] = totals.get(part, 0) + 1
        changed.setdefault(part, 0)
        if tensor.shape != saved[key].shape or not torch.equal(tensor.to(torch.float32), saved[key].to(torch.float32)):
            changed[part] += 1
    return {'changed': changed, 'totals': totals, 'missing_in_checkpoint': missing[:20], 'missing_count': len(missing),
            'unreadable_layout': unreadable + unreadable_base}


def full_failures(weights: Dict[str, object], router: str, guard: Optional[Dict[str, object]]) -> List[str]:
    """What fails a full-SFT run, from compare_full's counts and the guard's full-mode report."""
    changed, totals = weights['changed'], weights['totals']
    failures = [f'no {part} weight changed by full SFT ({totals.get(part, 0)} tensors)'
                for part in ('experts', 'attention', 'shared_expert') if totals.get(part) and not changed.get(part)]
    if router == 'trained' and totals.get('router') and not changed.get('router'):
        failures.append(f'the router is trained (megatron.freeze_router false) but none of its '
                        f'{totals["router"]} tensors changed')
    if router == 'frozen' and changed.get('router'):
        failures.append(f'{changed["router"]} router tensors changed: megatron.freeze_router froze them')
    if changed.get('vision'):
        failures.append(f'{changed["vision"]} vision-tower tensors changed: the vision tower is frozen')
    if weights['unreadable_layout']:
        failures.append(f'expert tensors in a layout the comparison cannot read: {weights["unreadable_layout"][:3]}')
    if weights['missing_count']:
        failures.append(f'{weights["missing_count"]} base tensors missing from the checkpoint: '
                        f'{weights["missing_in_checkpoint"][:3]}')
    if guard is not None and guard.get('mode') == 'full':
        failures += [f'lora_update.json (full SFT): {f}' for f in guard.get('failures') or []]
    return failures


def read_guard_report(run_dir: str) -> Optional[Dict[str, object]]:
    """The guard's lora_update.json as written (None when the run has none)."""
    path = os.path.join(run_dir, 'lora_update.json')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f'{path}: not JSON ({e})') from e


def adapter_lora_names(checkpoint: str) -> Dict[str, int]:
    """LoRA tensor counts in the saved adapter (if the checkpoint holds HF-format safetensors)."""
    counts = {'experts': 0, 'router': 0, 'attention': 0, 'all': 0}
    for path in glob.glob(os.path.join(checkpoint, '*.safetensors')):
        from safetensors import safe_open
        with safe_open(path, 'pt') as f:
            for key in f.keys():
                if 'lora' not in key:
                    continue
                counts['all'] += 1
                if 'router' in key or '.mlp.gate.' in key:
                    counts['router'] += 1
                elif 'expert' in key:
                    counts['experts'] += 1
                elif 'attn' in key or 'attention' in key:
                    counts['attention'] += 1
    return counts


def merged_loads(merged_dir: str) -> Optional[str]:
    """None if checkpoint-N-merged (or a full-SFT checkpoint-N) loads in transformers and gives finite logits; else
    why not."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    try:
        config = AutoConfig.from_pretrained(merged_dir)
        model = AutoModelForImageTextToText.from_pretrained(merged_dir, dtype=torch.bfloat16)
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        model.to(device).eval()
        ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device=device)
        with torch.no_grad():
            # no cache: a depth cut with Gated DeltaNet layers only (3 of the 35B-A3B's layers) has no attention
            # layer, and transformers' cache then fails in get_seq_length -- a logits check needs none
            logits = model(input_ids=ids, use_cache=False).logits
        if not torch.isfinite(logits).all():
            return 'logits are not finite'
        del model, config
        return None
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        return f'{type(e).__name__}: {e}'


def steady_seconds_per_step(records: List[Dict[str, object]], warmup: int = 2) -> Optional[float]:
    """Seconds per optimizer step after `warmup` steps. Megatron-SWIFT logs `train_speed(s/it)` as the running
    mean since the first step (elapsed / iterations), so step k ends at k x mean_k; the first steps carry the
    kernel set-up and must not count."""
    ends = {}
    for record in records:
        speed, iteration = record.get('train_speed(s/it)'), str(record.get('iteration', ''))
        if isinstance(speed, (int, float)) and '/' in iteration:
            k = int(iteration.split('/')[0])
            ends[k] = k * float(speed)
    if len(ends) < 2:
        return None
    last = max(ends)
    first = max((k for k in ends if k <= warmup and k < last), default=min(ends))
    return (ends[last] - ends[first]) / (last - first) if last > first else None


def tokens_per_second(encode_log: str, global_batch: int, seconds_per_step: Optional[float]) -> Optional[float]:
    if not seconds_per_step or not os.path.isfile(encode_log):
        return None
    tokens = []
    with open(encode_log) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                if record.get('mode', 'train') == 'train' and record.get('total_tokens'):
                    tokens.append(record['total_tokens'])
    if not tokens:
        return None
    return round(sum(tokens) / len(tokens) * global_batch / seconds_per_step, 1)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--base', required=True, help='the model trained on (HF directory)')
    p.add_argument('--checkpoint', required=True, help='OUTPUT/vN-.../checkpoint-N')
    p.add_argument('--merged', default=None, help='OUTPUT/vN-.../checkpoint-N-merged (LoRA)')
    p.add_argument('--full', action='store_true', help='a full-SFT run: checkpoint-N is the HF model, no --merged')
    p.add_argument('--router', choices=('trained', 'frozen'), default='trained',
                   help='--full: whether the run trained the router (the recipe\'s megatron.freeze_router false)')
    p.add_argument('--plan', required=True, help='`swift-vora train ... --dry-run --json` output')
    p.add_argument('--encode-log', default='', help='SWIFT_VORA_ENCODE_LOG of the run (tokens per sample)')
    p.add_argument('--gpus', type=int, required=True)
    p.add_argument('--ep', type=int, required=True)
    p.add_argument('--tp', type=int, required=True)
    p.add_argument('--global-batch', type=int, required=True)
    p.add_argument('--min-steps', type=int, default=5)
    p.add_argument('--skip-load', action='store_true', help='do not load the merged model (CPU tests)')
    p.add_argument('--out', required=True)
    a = p.parse_args(argv)
    if not a.full and not a.merged:
        p.error('--merged is required for a LoRA run (or --full for a full-SFT one)')

    failures = []
    run_dir = os.path.dirname(os.path.abspath(a.checkpoint))
    records = read_log(run_dir)
    losses = [float(r['loss']) for r in records if 'loss' in r]
    if len(losses) < a.min_steps:
        failures.append(f'{len(losses)} logged steps, need {a.min_steps}')
    if not all(math.isfinite(x) for x in losses):
        failures.append(f'non-finite loss: {losses}')
    elif losses and not losses[-1] < losses[0]:
        failures.append(f'loss did not fall: first {losses[0]:.4f}, last {losses[-1]:.4f}')

    if a.full:
        weights = compare_full(a.base, a.checkpoint)
        guard = read_guard_report(run_dir)
        failures += full_failures(weights, a.router, guard)
        lora_update = ({k: guard.get(k) for k in ('mode', 'tensors', 'updated', 'expert_tensors', 'expert_updated',
                                                   'parts', 'experts_not_reached', 'frozen_tensors', 'frozen_changed',
                                                   'failures', 'steps_counted', 'note')} if guard else None)
        adapter = None
        loaded = a.checkpoint
    else:
        weights = compare_weights(a.base, a.merged)
        if weights['changed']['experts'] == 0:
            failures.append(f'no expert weight changed by LoRA ({weights["totals"]["experts"]} expert tensors)')
        if weights['changed']['attention'] == 0:
            failures.append('no attention weight changed by LoRA')
        if weights['changed']['router'] != 0:
            failures.append(f'{weights["changed"]["router"]} router tensors changed: the router must stay frozen')
        if weights['unreadable_layout']:
            failures.append('merged expert tensors in a layout the comparison cannot read: '
                            f'{weights["unreadable_layout"][:3]}')
        if weights['missing_count']:
            failures.append(f'{weights["missing_count"]} base tensors missing from the merged weights: '
                            f'{weights["missing_in_merged"][:3]}')
        adapter = adapter_lora_names(a.checkpoint)
        if adapter['router']:
            failures.append(f'{adapter["router"]} LoRA tensors on the router in {a.checkpoint}')
        lora_update = read_lora_update(run_dir)
        stale = lora_update_failure(lora_update)
        if stale:
            failures.append(stale)
        loaded = a.merged
    load_error = None if a.skip_load else merged_loads(loaded)
    if load_error:
        failures.append(f'{"checkpoint-N" if a.full else "checkpoint-N-merged"} does not load: {load_error}')

    with open(a.plan) as f:
        plan = json.load(f)['plan']
    memory = log_field(records, 'memory(GiB)')
    step_s = steady_seconds_per_step(records)
    steady = (plan.get('phases') or {}).get('steady') or {}
    peak = max(memory) if memory else None
    result = {
        'backend': plan['backend'], 'gpus': a.gpus, 'ep': a.ep, 'tp': a.tp, 'steps': len(losses), 'losses': losses,
        # LoRA tensors on experts: counted in the adapter when saved in HF format, else the expert weights LoRA
        # changed in the merged model (full SFT: none)
        'expert_lora_tensors': None if a.full else adapter['experts'] or weights['changed']['experts'],
        'expert_lora_source': None if a.full else 'adapter' if adapter['experts'] else 'merged-vs-base',
        'router_trainable': (bool(weights['changed'].get('router')) if a.full else
                             bool(weights['changed']['router'] or adapter['router'])),
        'merged_loads': None if a.skip_load else load_error is None,
        # memory(GiB) is torch.cuda.max_memory_reserved: compared with the plan's reserved figure (its headline
        # gpu_peak_gib adds the CUDA context torch does not count)
        'peak_reserved_gib': peak, 'planned_peak_gib': plan['gpu_peak_gib'],
        'planned_reserved_gib': steady.get('gpu_reserved_gib'),
        'plan_error': round(peak / steady['gpu_reserved_gib'] - 1, 3) if peak and steady.get('gpu_reserved_gib')
        else None,
        'seconds_per_step': round(step_s, 4) if step_s else None,
        'tokens_per_s': tokens_per_second(a.encode_log, a.global_batch, step_s),
        'lora_update': lora_update,
        'weights_changed': weights['changed'], 'weights_total': weights['totals'], 'adapter_lora': adapter,
        'failures': failures,
    }
    if a.full:
        result.update({'tuner': 'full', 'router': a.router, 'checkpoint_loads': result['merged_loads']})
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, 'w') as f:
        json.dump(result, f, indent=2)
        f.write('\n')
    print(json.dumps({k: v for k, v in result.items() if k != 'losses'}, indent=1))
    for failure in failures:
        print('FAIL:', failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
