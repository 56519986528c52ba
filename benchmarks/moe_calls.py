"""The MoE benchmark's calls side by side: every result file of `benchmarks/moe_throughput.py` for one model depth,
each variant's median tokens/s per call, its spread across calls, and the speed-up over plain swift per call.

    python benchmarks/moe_calls.py                       # full depth: benchmarks/results/moe-h200-full*.json
    python benchmarks/moe_calls.py --glob 'moe-h200-2026-*.json' --json

Reads the files exactly as the benchmark wrote them (a `*-partial.json` is a call cut short: the variants it finished);
every figure printed here is derived from them by this script, none by hand.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, List, Optional

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')
# The Unsloth runner's forward runs under autocast since 2026-12-03 (unsloth_runner.forward_autocast); before, its
# LoRA computed in fp32. A run is named by what it ran: a swift-vora variant of an earlier file, or one whose runner
# reports `autocast: null`, is the fp32-LoRA setting (the `_fp32_lora` variants keep it on purpose).
AUTOCAST_SINCE = '2026-12-03'
FP32_LORA = '_fp32_lora'
# Call e (2026-12-03) ran under autocast but before the runner encoded on several threads and before the batched
# vision attention was installed over Unsloth's rewrite: its runner does not report `encode_threads`. Such a run is
# `_serial` (the fp32-LoRA runs before it were serial too; their name already sets them apart).
SERIAL = '_serial'
# A lever measured against the default in the same call (moe_throughput's *_rank_scale variants,
# SWIFT_VORA_MOE_LORA_SCALE=rank): the variant without the suffix is its twin.
RANK_SCALE = '_rank_scale'
# The host levers (moe_throughput's *_nosync variants: the vision preamble on the prefetch thread, one step in
# flight) against the same variant without them, in the same call.
HOST_LEVERS = '_nosync'
# The routed-row gather through the inverse permutation (moe_throughput's *_gather variants) against its twin.
GATHER = '_gather'
# unsloth_zoo's fused router (moe_throughput's *_router variants) against the same variant without it.
ROUTER = '_router'
# The down-projection LoRA folded into the base GEMM (moe_throughput's *_fold variants) against the variant without it.
FOLD = '_fold'
# The gate gradient's dot product fused (moe_throughput's *_gategrad variants) against the variant without it.
GATE_GRAD = '_gategrad'
# Gated DeltaNet's query and key at their own head count (moe_throughput's *_gva variants) against the variant without.
GVA = '_gva'
# The runner under torchrun with one process (moe_throughput's *_torchrun1 variants: process group, DDP over the LoRA
# tensors) against the same variant without torchrun: what the data-parallel path costs on one GPU.
TORCHRUN = '_torchrun1'
# A run with one step in flight whose runner timed held steps by when the host read them (before the runner wrote
# `step_clock`, 2026-12-04, after call l): its median step is the step period, its mean is not (one step short over
# the window -- docs/runs/h200-moe-full/README.md, "Call l").
HOST_CLOCK_MEAN = 'not comparable: one step in flight, timed by the host before the GPU step clock (call l)'
# benchmarks/megatron_moe.py's Megatron levers against their twin of the same call: gradient-accumulation fusion off
# (*_nofusion), Megatron-SWIFT's DataLoader without the read across epochs (*_noprefetch), the precision-aware
# optimizer (*_pao), the expert LoRA factors as one grouped GEMM (*_glora), those with the frozen experts under
# them too (*_gmm), and the optimizer over coalesced runs of the gradient buffers (*_co). Megatron's result files carry
# the model as
# text; its depth is not in them.
NOFUSION, NOPREFETCH, PAO, GLORA, GMM, COALESCED = '_nofusion', '_noprefetch', '_pao', '_glora', '_gmm', '_co'
MEGATRON_PREFIX, UNSLOTH_BEST = 'mg_', 'vora_unsloth_best'
# Megatron variants that run the same settings under two names: mg_shipped is the recipe as shipped since the call
# that measured mg_mb4_te_ce_gmm_pao (benchmarks/megatron_moe.py), so either is the other's twin
SAME_SETTINGS = {a: b for pair in [('mg_mb4_te_ce_gmm_pao', 'mg_shipped')] for a, b in (pair, pair[::-1])}
# Each lever against its twin of the same call: (summary key, the lever's name suffix, its label in the text)
LEVER_TWINS = (('rank_scale_vs_default', RANK_SCALE, ''), ('host_levers_vs_twin', HOST_LEVERS, ' (host levers)'),
               ('gather_vs_twin', GATHER, ' (permutation gather)'), ('router_vs_twin', ROUTER, ' (fused router)'),
               ('fold_vs_twin', FOLD, ' (down LoRA folded)'),
               ('gate_grad_vs_twin', GATE_GRAD, ' (fused gate gradient)'),
               ('gva_vs_twin', GVA, ' (Gated DeltaNet grouped query/key heads)'),
               ('torchrun_vs_twin', TORCHRUN, ' (under torchrun, one process)'),
               ('nofusion_vs_twin', NOFUSION, ' (no gradient-accumulation fusion)'),
               ('noprefetch_vs_twin', NOPREFETCH, ' (Megatron-SWIFT\'s DataLoader, no read across epochs)'),
               ('pao_vs_twin', PAO, ' (precision-aware optimizer)'),
               ('glora_vs_twin', GLORA, ' (expert LoRA as one grouped GEMM)'),
               ('gmm_vs_twin', GMM, ' (every expert product one grouped GEMM)'),
               ('gmm_pao_vs_twin', GMM + PAO, ' (every expert product one grouped GEMM, precision-aware optimizer)'),
               ('coalesced_vs_twin', COALESCED, ' (the optimizer over coalesced gradient-buffer runs)'))


def setting(name: str, variant: Dict[str, Any], date: str) -> str:
    """The setting a variant ran, for comparing calls: `vora_unsloth_mb4` before autocast was the runner's default
    is `vora_unsloth_mb4_fp32_lora`; under autocast but before the encode pool and batched vision attention,
    `vora_unsloth_mb4_serial`."""
    if not name.startswith('vora_') or name.endswith(FP32_LORA):
        return name
    runner = variant.get('runner') or {}
    if 'autocast' in runner:  # the runner said what it ran
        fp32 = runner['autocast'] is None
    else:  # a file written before it did
        fp32 = (date or '') < AUTOCAST_SINCE
    if fp32:
        return name + FP32_LORA
    return name + SERIAL if runner and 'encode_threads' not in runner else name


def load(pattern: str, results: str = RESULTS) -> List[Dict[str, Any]]:
    """One entry per call: a call's `-partial.json` is left out when its final file (same command) is there too."""
    calls = []
    for path in sorted(glob.glob(os.path.join(results, pattern))):
        with open(path) as f:
            data = json.load(f)
        variants = {setting(n, v, data.get('date')): v for n, v in (data.get('variants') or {}).items()}
        command = data.get('command')  # a list of words in the first Megatron file
        calls.append({'file': os.path.basename(path), 'date': data.get('date'), 'partial': bool(data.get('partial')),
                      'layers': _layers(data), 'variants': variants,
                      'command': ' '.join(command) if isinstance(command, list) else command,
                      'gpu': _gpu(data)})
    finished = {c['command'] for c in calls if not c['partial'] and c['command']}
    return [c for c in calls if not (c['partial'] and c['command'] in finished)]


def _gpu(data: Dict[str, Any]) -> Any:
    """The card a call ran on; the first Megatron file (2026-12-01) wrote its machine as a line of text."""
    machine = data.get('machine')
    return machine.get('gpu') if isinstance(machine, dict) else machine


def _layers(data: Dict[str, Any]) -> Any:
    model = data.get('model')
    return model.get('layers') if isinstance(model, dict) else data.get('layers')


def megatron_over_unsloth(calls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The fastest Megatron variant of each call over the Unsloth path's best configuration: of the same call where
    it ran there, else of each other call on the same GPU (`same_call` False: not side by side)."""
    def unsloth(c):
        return (c['variants'].get(UNSLOTH_BEST) or {}).get('tokens_per_s')

    out = []
    for c in calls:
        rates = {n: v['tokens_per_s'] for n, v in c['variants'].items()
                 if n.startswith(MEGATRON_PREFIX) and v.get('tokens_per_s')}
        if not rates:
            continue
        best = max(rates, key=rates.get)
        against = _same_call_or_gpu(c, calls, unsloth)
        out += [{'file': c['file'], 'megatron': best, 'unsloth_file': o['file'], 'same_call': o is c,
                 'ratio': round(rates[best] / unsloth(o), 3)} for o in against]
    return out


def summarize(calls: List[Dict[str, Any]]) -> Dict[str, Any]:
    names = sorted({n for c in calls for n, v in c['variants'].items() if v.get('tokens_per_s')})
    per_variant = {}
    for name in names:
        runs = [{'file': c['file'], 'tokens_per_s': c['variants'][name]['tokens_per_s'],
                 'median_step_s': c['variants'][name].get('median_step_s'),
                 **_mean_step(c['variants'][name]),
                 'first_step_s': c['variants'][name].get('first_step_s')}
                for c in calls if (c['variants'].get(name) or {}).get('tokens_per_s')]
        rates = [r['tokens_per_s'] for r in runs]
        per_variant[name] = {'calls': runs, 'min': min(rates), 'max': max(rates),  # spread: None with one call
                             'spread': round(max(rates) / min(rates) - 1, 4) if len(rates) > 1 else None}
    speedups = []
    for c in calls:
        plain = (c['variants'].get('swift_peft') or {}).get('tokens_per_s')
        ours = {n: v['tokens_per_s'] for n, v in c['variants'].items()
                if n.startswith('vora_') and v.get('tokens_per_s')}
        if plain and ours:
            best = max(ours, key=ours.get)
            speedups.append({'file': c['file'], 'ours': best, 'speedup_median': round(ours[best] / plain, 3),
                             'by_variant': {n: round(r / plain, 3) for n, r in sorted(ours.items())}})
    # the autocast default against its fp32-LoRA twin of the same call: the same learning, step by step
    twins, levers = [], {key: [] for key, _, _ in LEVER_TWINS}
    for c in calls:
        for name, v in c['variants'].items():
            twin = c['variants'].get(name.removesuffix(SERIAL) + FP32_LORA) or {}  # call e's twin was serial too
            if name.startswith('vora_') and v.get('losses') and twin.get('losses'):
                found = _against(v, twin)
                twins.append({'file': c['file'], 'variant': name, 'losses': found['losses'],
                              'loss_max_rel_diff_vs_fp32_lora': found['loss_max_rel_diff'],
                              'median_step_ratio': found['median_step_ratio']})
            for key, suffix, _ in LEVER_TWINS:
                if not (name.endswith(suffix) and v.get('losses')):
                    continue
                twin_names = (name.removesuffix(suffix), SAME_SETTINGS.get(name.removesuffix(suffix)))
                for other in _same_call_or_gpu(c, calls, lambda o: _twin_in(o, twin_names)):
                    twin = _twin_in(other, twin_names)
                    levers[key].append({'file': c['file'], 'variant': name, 'twin': twin,
                                        'twin_file': other['file'], 'same_call': other is c,
                                        **_against(v, other['variants'][twin])})
    # across calls (not side by side, say so): the fastest swift-vora run of any call over each plain swift run
    ours_all = [(r['tokens_per_s'], n, r['file']) for n, v in per_variant.items() if n.startswith('vora_')
                for r in v['calls']]
    cross = []
    if ours_all and 'swift_peft' in per_variant:
        rate, name, where = max(ours_all)
        cross = [{'ours': name, 'ours_file': where, 'plain_file': r['file'],
                  'speedup_median': round(rate / r['tokens_per_s'], 3)} for r in per_variant['swift_peft']['calls']
                 if r['file'] != where]  # the same call is side by side: speedup_per_call has it
    return {'calls': [{k: c[k] for k in ('file', 'date', 'partial', 'layers')} for c in calls],
            'variants': per_variant, 'speedup_per_call': speedups, 'speedup_across_calls': cross,
            'autocast_vs_fp32_lora': twins, 'megatron_over_unsloth': megatron_over_unsloth(calls), **levers}


def _mean_step(variant: Dict[str, Any]) -> Dict[str, Any]:
    """The variant's mean step, or None and why where the file's mean is known wrong (HOST_CLOCK_MEAN)."""
    runner = variant.get('runner') or {}
    if runner.get('step_sync') == 'lagged' and 'step_clock' not in runner:
        return {'mean_step_s': None, 'mean_step_note': HOST_CLOCK_MEAN}
    return {'mean_step_s': variant.get('mean_step_s')}


def _twin_in(call: Dict[str, Any], names) -> Optional[str]:
    """The first of `names` that ran with logged losses in `call`."""
    return next((n for n in names if n and (call['variants'].get(n) or {}).get('losses')), None)


def _same_call_or_gpu(call: Dict[str, Any], calls: List[Dict[str, Any]], has) -> List[Dict[str, Any]]:
    """The calls to compare `call` with where `has(call)` is not enough: `call` itself where `has(call)`, else each
    other call on the same (known) GPU that has it -- not side by side: across machines one setting has spread 25 %."""
    if has(call):
        return [call]
    return [o for o in calls if o is not call and o.get('gpu') and o.get('gpu') == call.get('gpu') and has(o)]


def _against(v: Dict[str, Any], twin: Dict[str, Any]) -> Dict[str, Any]:
    """A variant against its twin of the same call: logged losses compared step by step, and the twin's median step
    over the variant's (above 1: the variant is faster)."""
    pairs = list(zip(v['losses'], twin['losses']))
    return {'losses': len(pairs), 'loss_max_rel_diff': round(max(abs(a - b) / abs(b) for a, b in pairs), 4),
            'median_step_ratio': round(twin['median_step_s'] / v['median_step_s'], 3)
            if v.get('median_step_s') and twin.get('median_step_s') else None}


def render(s: Dict[str, Any]) -> str:
    lines = ['| variant | ' + ' | '.join(c['file'] for c in s['calls']) + ' | spread |',
             '|---|' + '---|' * (len(s['calls']) + 1)]
    for name, v in s['variants'].items():
        by_file = {r['file']: r for r in v['calls']}
        cells = [f'{by_file[c["file"]]["tokens_per_s"]:,.0f}' if c['file'] in by_file else '--' for c in s['calls']]
        spread = f'{100 * v["spread"]:.1f} %' if v['spread'] is not None else 'one call'
        lines.append(f'| {name} | ' + ' | '.join(cells) + f' | {spread} |')
    lines.append('')
    lines.append('tokens/s on the median step of each call ("--": not run, or cut short, in that call).')
    for sp in s['speedup_per_call']:
        others = ', '.join(f'{n} {r}x' for n, r in sp['by_variant'].items() if n != sp['ours'])
        lines.append(f'{sp["file"]}: {sp["ours"]} / swift_peft = {sp["speedup_median"]}x (median steps)'
                     + (f'; in the same call {others}' if others else ''))
    for t in s.get('autocast_vs_fp32_lora') or []:
        lines.append(f'{t["file"]}: {t["variant"]} against its fp32-LoRA twin: {t["median_step_ratio"]}x (median '
                     f'steps), {t["losses"]} logged losses within {100 * t["loss_max_rel_diff_vs_fp32_lora"]:.2f} %')
    for key, _, label in LEVER_TWINS:
        for t in s.get(key) or []:
            where = '' if t.get('same_call', True) else f' of {t["twin_file"]} (same GPU, not side by side)'
            lines.append(f'{t["file"]}: {t["variant"]}{label} against {t["twin"]}{where}: {t["median_step_ratio"]}x '
                         f'(median steps), {t["losses"]} logged losses within {100 * t["loss_max_rel_diff"]:.2f} %')
    for r in s.get('megatron_over_unsloth') or []:
        where = 'the same call' if r['same_call'] else f'{r["unsloth_file"]} (same GPU, not side by side)'
        lines.append(f'{r["file"]}: {r["megatron"]} / {UNSLOTH_BEST} of {where} = {r["ratio"]}x (median steps)')
    for sp in s.get('speedup_across_calls') or []:
        lines.append(f'across calls (not side by side): {sp["ours"]} of {sp["ours_file"]} / swift_peft of '
                     f'{sp["plain_file"]} = {sp["speedup_median"]}x (median steps)')
    return '\n'.join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--glob', default='moe-h200-full*.json', help='result files under benchmarks/results/')
    ap.add_argument('--json', action='store_true')
    args = ap.parse_args(argv)
    calls = load(args.glob)
    if not calls:
        print(f'no result files match {args.glob} in {RESULTS}', file=sys.stderr)
        return 1
    s = summarize(calls)
    print(json.dumps(s, indent=1) if args.json else render(s))
    return 0


if __name__ == '__main__':
    sys.exit(main())
