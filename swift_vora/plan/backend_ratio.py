"""The two one-GPU MoE LoRA backends measured side by side: Megatron-SWIFT (megatron_ep_lora, EP 1) against
swift-vora's Unsloth split LoRA (unsloth_split_lora), per model family, GPU and depth.

Each backend's speed estimate comes from its own runs (plan/speed.py); `auto` picks by estimated hours
(plan/search.py). This table is the direct comparison of the two in one call, on the same model and clips, which the
plan quotes (under `--explain`) only for a model of the depth it was measured at: a ratio measured on a model cut to
8 layers is not the ratio at 40 (the vision tower, the LM head and the embeddings weigh differently).

The table is `backend_ratios.json` next to this module: one entry per (model family, GPU), written only from a
result file of benchmarks/megatron_moe.py (its `backend_ratio`: the fastest Megatron variant against the Unsloth
variant, tokens/s on median steps, on the same model and clips):

    python -m swift_vora.plan.backend_ratio benchmarks/results/megatron-h200-moe-<date>.json   # record it
    python -m swift_vora.plan.backend_ratio --show

Refused: a result with no `backend_ratio`; one where either compared variant failed or has fewer than
MIN_MEASURED_STEPS measured steps (the benchmark protocol: a median of fewer is one slow step away from another
ratio); and one with any failure that is not a variant outside the comparison failing to report. A variant the
ratio does not compare that did not finish (a variant killed by its timeout after the compared variants had run)
says nothing about the two speeds: the entry keeps its failure (`not_compared`) and the ratio stands. A failed check
(loss, merged load, LoRA placement, guards) names no variant and refuses the whole file.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'backend_ratios.json')
MEGATRON, UNSLOTH = 'megatron_ep_lora', 'unsloth_split_lora'
MIN_MEASURED_STEPS = 10


def gpu_key(gpu_name: str) -> str:
    """'NVIDIA H200' / 'H200' / '1 x NVIDIA H200 (lent GPU machine)' -> 'H200' (the table's GPU key)."""
    words = [w for w in gpu_name.replace('(', ' ').replace(')', ' ').split() if w.upper() not in ('NVIDIA', 'X')]
    for word in words:
        if any(ch.isdigit() for ch in word) and any(ch.isalpha() for ch in word):
            return word.upper()
    return ' '.join(words).upper()


def load(path: Optional[str] = None) -> List[Dict[str, Any]]:
    path = path or TABLE
    if not os.path.isfile(path):
        return []
    with open(path, encoding='utf-8') as f:
        return list(json.load(f).get('entries') or [])


def lookup(model_type: str, gpu_name: str, path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    gpu = gpu_key(gpu_name) if gpu_name else ''
    for entry in load(path):
        if entry['model_family'] == model_type and entry['gpu'] == gpu:
            return entry
    return None


def compared_variants_refusal(result: Dict[str, Any], compared: List[str]) -> Optional[str]:
    """Why the two compared variants do not support a ratio (failed, unmeasured, too few steps), or None."""
    variants = result.get('variants') or {}
    for name in compared:
        v = variants.get(name)
        if not isinstance(v, dict):
            return f'{name} is not among its variants'
        if v.get('failed') or v.get('error'):
            return f'{name} failed: {str(v.get("failed") or v.get("error"))[:200]}'
        steps = len(v.get('step_s') or [])
        if not v.get('tokens_per_s') or steps < MIN_MEASURED_STEPS:
            return (f'{name} has {steps} measured step(s), the protocol needs {MIN_MEASURED_STEPS} '
                    '(a median of fewer is one slow step away from another ratio)')
    return None


def split_failures(result: Dict[str, Any], compared: List[str]) -> Tuple[List[str], List[str]]:
    """(failures that refuse the file, failures of variants outside the comparison). A failure belongs to a variant
    when it starts with that variant's name and a space (megatron_moe.assemble: '<variant> (the item-1 run) did not
    report: ...'); anything else -- a failed check, a silent guard, merge_for_vllm -- refuses the file."""
    others = [n for n in (result.get('variants') or {}) if n not in compared]
    refusing, outside = [], []
    for failure in result.get('failures') or []:
        (outside if any(str(failure).startswith(n + ' ') for n in others) else refusing).append(str(failure))
    return refusing, outside


def entry_from_result(result: Dict[str, Any], source: str) -> Dict[str, Any]:
    """The table entry a megatron_moe result file supports; ValueError when it supports none."""
    ratio = result.get('backend_ratio')
    if not ratio:
        raise ValueError(f'{source}: no backend_ratio (both a Megatron and the Unsloth variant must have run)')
    compared = [ratio['megatron_variant'], ratio['unsloth_variant']]
    refusing, outside = split_failures(result, compared)
    if refusing:
        raise ValueError(f'{source}: the Megatron run failed its checks ({"; ".join(refusing)[:300]})')
    why = compared_variants_refusal(result, compared)
    if why:
        raise ValueError(f'{source}: {why}')
    machine = result.get('machine') or {}
    gpu = machine.get('gpu_name') or machine.get('gpu') or (machine.get('gpus') or [''])[0] \
        if isinstance(machine, dict) else str(machine)
    if not gpu:
        raise ValueError(f'{source}: the result names no GPU (machine)')
    m, u = ratio['megatron_tokens_per_s'], ratio['unsloth_tokens_per_s']
    faster = MEGATRON if m > u else UNSLOTH
    cut = re.search(r'cut to (\d+) layers', str(result.get('model') or ''))
    entry = {'model_family': result.get('model_family', 'qwen3_5_moe'), 'gpu': gpu_key(str(gpu)), 'faster': faster,
             'layers': int(cut.group(1)) if cut else (result.get('layers') or None),
             'ratio': round(max(m, u) / min(m, u), 3),
             'tokens_per_s': {MEGATRON: m, UNSLOTH: u},
             'peak_reserved_gib': {MEGATRON: ratio.get('megatron_peak_reserved_gib'),
                                   UNSLOTH: ratio.get('unsloth_peak_reserved_gib')},
             'settings': {MEGATRON: ratio.get('megatron_variant'), UNSLOTH: ratio.get('unsloth_variant')},
             'measured_steps': {MEGATRON: len(result['variants'][compared[0]]['step_s']),
                                UNSLOTH: len(result['variants'][compared[1]]['step_s'])},
             'megatron_levers': ratio.get('megatron_levers'), 'model': result.get('model'),
             'date': result.get('date'), 'source': source}
    if outside:
        # without the log path the failure names: a folder of the machine it ran on
        entry['not_compared'] = [f.split('; see ')[0][:300] for f in outside]
    return entry


def record(result_path: str, path: Optional[str] = None) -> Dict[str, Any]:
    path = path or TABLE
    with open(result_path, encoding='utf-8') as f:
        result = json.load(f)
    source = os.path.relpath(result_path, os.path.dirname(os.path.dirname(os.path.dirname(path))))
    entry = entry_from_result(result, source)
    entries = [e for e in load(path) if (e['model_family'], e['gpu']) != (entry['model_family'], entry['gpu'])]
    with open(path, 'w', encoding='utf-8') as f:
        json.dump({'entries': entries + [entry]}, f, indent=2)
        f.write('\n')
    return entry


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m swift_vora.plan.backend_ratio', description=__doc__.split('\n')[0])
    parser.add_argument('result', nargs='?', help='a benchmarks/megatron_moe.py result file to record')
    parser.add_argument('--show', action='store_true')
    parser.add_argument('--table', default=None, help='default: backend_ratios.json next to this module')
    args = parser.parse_args(argv)
    if args.result:
        try:
            entry = record(args.result, args.table)
        except ValueError as e:
            print(f'backend_ratio: not recorded: {e}', file=sys.stderr)
            return 1
        print(json.dumps(entry, indent=2))
    if args.show or not args.result:
        entries = load(args.table)
        print(json.dumps(entries, indent=2) if entries else 'backend_ratios.json: no measurement yet (not_measured)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
