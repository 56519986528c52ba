"""The README's measured figures, generated from the result files in benchmarks/results/ (and the planner's tables).

    python benchmarks/readme_figures.py            # print the generated README blocks
    python benchmarks/readme_figures.py --check    # exit 1 when README.md's blocks differ from what the files give
    python benchmarks/readme_figures.py --write    # rewrite README.md's blocks from the files

README.md holds each block between `<!-- figures:NAME ... -->` and `<!-- /figures:NAME -->`; everything between
the two is this script's output (edit the script, not the block). tests/test_readme_figures.py runs --check, so a
README that no longer matches its files fails.

Every figure names where it comes from -- its result file in benchmarks/results/ -- and how many optimizer steps it
measured (the protocol: 12 steps a variant, the first 2 not measured -- 10 measured;
the dense runs measure 12). A figure of fewer measured steps, or from a file assembled by hand, is marked "before
the protocol" (PROTOCOL_STEPS). MFU says its divisor: the H200's measured 790 TFLOP/s bf16 matmul rate (what the
benchmarks divide by), with the figure at the 989 TFLOP/s spec next to it.
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import sys
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, 'results')
README = os.path.join(REPO, 'README.md')
MEASURED_TFLOPS = 790  # benchmarks/throughput.py PEAK_BF16_FLOPS: an 8192^3 bf16 matmul on the lent H200
SPEC_TFLOPS = 989  # NVIDIA's dense bf16 figure for the H200
PROTOCOL_STEPS = 10  # measured optimizer steps a figure needs to be quoted as measured
BLOCK = re.compile(r'(<!-- figures:(?P<name>[a-z_]+) [^\n]*-->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)', re.S)


# every Unsloth lever at once on the 8-layer cut, one H100 (its twin did not run): where the fused router engaged
LEVERS_8 = 'moe-h100-levers-2026-12-07.json'
LEVERS_8_VARIANT = 'vora_unsloth_mb4_ckauto_rank_scale_gather_router_gategrad_gva'
# the same variant again after the query/key lever's fix, its record read back from the run's kept logs (the result
# file as written did not carry it): `moe_throughput.py --summarize-logs` of call 2's archive
LEVERS_8_GVA = 'derived-moe-h100-levers-b-logs.json'


def _load(name: str) -> Dict[str, Any]:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f'readme_figures_{name}', os.path.join(HERE, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source(filename: str) -> str:
    """How a figure names its result file (in benchmarks/results/)."""
    return f'`{filename}`'


def measured_steps(variant: Dict[str, Any], doc: Optional[Dict[str, Any]] = None) -> int:
    """Optimizer steps a variant's rate is the median of: its steps less the warm-up ones (Megatron's files count
    the variant's steps as the benchmark asked for them: `steps_per_variant`)."""
    doc = doc or {}
    steps = doc.get('steps_per_variant') or variant.get('steps')
    return int(steps) - int(variant.get('warmup_steps', doc.get('warmup_steps', 0)))


def steps_note(n: int) -> str:
    return (f'{n} measured steps' if n >= PROTOCOL_STEPS else
            f'{n} measured steps, before the protocol\'s {PROTOCOL_STEPS}: indicative')


def mfu(value: float) -> str:
    """MFU with its divisor, and the figure at the spec."""
    return (f'MFU {value:.3f} of {MEASURED_TFLOPS} TFLOP/s measured ({value * MEASURED_TFLOPS / SPEC_TFLOPS:.3f} of '
            f'the {SPEC_TFLOPS} spec)')


def x(ratio: float, digits: int = 1) -> str:
    return f'{ratio:.{digits}f}x'


# ---- the figures --------------------------------------------------------------------------------------------------
def learnability() -> Dict[str, Any]:
    d = _load('learnability-2026-11-29.json')
    return {'r1': d['r1_at_0_5'], 'shuffled': d['shuffled_r1_at_0_5'], 'chance': d['chance_r1_at_0_5'],
            'test_videos': d['task']['test_videos'], 'file': 'learnability-2026-11-29.json'}


def dense() -> Dict[str, Any]:
    """The 2B-shape runs 16b (every layer checkpointed, micro-batch 1) and 16 (micro-batch 4, no checkpointing), and
    the fastest plain swift ever measured here (any throughput run of the protocol)."""
    import glob
    out = {}
    for key, name in (('checkpointed', 'throughput-r16b-2026-12-02.json'), ('free', 'throughput-r16-2026-12-02.json')):
        d = _load(name)
        ours, plain = d['variants'][d['swift_vora_variant']], d['variants'][d['baseline_variant']]
        out[key] = {'run': source(name), 'ours': ours, 'plain': plain,
                    'tokens_per_sample': d['swift_vora_tokens_per_s'] / d['swift_vora_samples_per_s'],
                    'speedup': ours['samples_per_s'] / plain['samples_per_s'],
                    'memory': ours['peak_reserved_gib'] / plain['peak_reserved_gib'],
                    'steps': min(measured_steps(ours), measured_steps(plain))}
    fastest = None
    for path in sorted(glob.glob(os.path.join(RESULTS, 'throughput-*.json'))):
        d = _load(os.path.basename(path))
        for name, v in (d.get('variants') or {}).items():
            if (name.startswith('baseline') and v.get('samples_per_s') and not d.get('smoke')
                    and measured_steps(v) >= PROTOCOL_STEPS and (fastest is None or v['samples_per_s'] > fastest[0])):
                fastest = (v['samples_per_s'], os.path.basename(path))
    out['fastest_plain'] = {'samples_per_s': fastest[0], 'run': source(fastest[1]),
                            'speedup': out['free']['ours']['samples_per_s'] / fastest[0]}
    return out


def moe() -> Dict[str, Any]:
    """The full-depth 35B-A3B calls (benchmarks/moe_calls.py reads the same files the same way)."""
    calls = _module('moe_calls')
    loaded = calls.load('moe-h200-full*.json', RESULTS)
    summary = calls.summarize(loaded)
    by_file = {c['file']: c for c in loaded}
    m = _load('moe-h200-full-m-2026-12-04.json')
    ours, plain = m['variants'][m['swift_vora_variant']], m['variants'][m['baseline_variant']]
    headline = {'file': 'moe-h200-full-m-2026-12-04.json', 'ours': ours, 'plain': plain,
                'tokens_per_sample': m['tokens_per_sample'],
                'speedup': ours['tokens_per_s'] / plain['tokens_per_s'],
                'speedup_mean': ours['tokens_per_s_mean'] / plain['tokens_per_s_mean'],
                'steps': min(measured_steps(ours), measured_steps(plain))}
    per_call = [{'file': s['file'], 'speedup': s['speedup_median'], 'variant': s['ours'],
                 'steps': min(measured_steps(by_file[s['file']]['variants'][s['ours']]),
                              measured_steps(by_file[s['file']]['variants']['swift_peft']))}
                for s in summary['speedup_per_call']]
    n = _load('moe-h200-full-n-2026-12-04.json')
    auto = n['variants'][n['swift_vora_variant']]
    every_layer = summary['variants']['vora_unsloth_mb4']
    rank = summary['rank_scale_vs_default'][0]
    j = by_file[rank['file']]['variants']
    host = summary['host_levers_vs_twin'][0]
    fold = summary['fold_vs_twin'][0]
    r = _load('moe-h200-full-r-2026-12-05.json')['variants']
    gather = r['vora_unsloth_mb4_ck32_rank_scale_gather_router_gategrad']
    twin_r = r['vora_unsloth_mb4_ck32_rank_scale']
    c = _load('derived-moe-h200-full-c-logs.json')['variants']
    levers = _load(LEVERS_8)['variants'][LEVERS_8_VARIANT]
    gva = _load(LEVERS_8_GVA)['variants'][LEVERS_8_VARIANT]
    gva_classes = gva['runner']['gdn_qk_heads']['classes'].values()
    return {
        'headline': headline, 'per_call': per_call,
        'levers_8': {'file': LEVERS_8, 'tokens_per_s': levers['tokens_per_s'],
                     'fused_calls': levers['runner']['moe_router']['fused_calls'],
                     'unfused': levers['runner']['moe_router']['unfused'], 'steps': measured_steps(levers)},
        'gva_8': {'file': LEVERS_8_GVA, 'tokens_per_s': gva['tokens_per_s'], 'steps': measured_steps(gva),
                  'grouped_calls': gva['runner']['gdn_qk_heads']['grouped_calls'],
                  'grouped': all(c['state'] == 'grouped' for c in gva_classes),
                  'difference': max(c.get('relative_difference', float('inf')) for c in gva_classes),
                  'fused_calls': gva['runner']['moe_router']['fused_calls']},
        'auto': {'file': 'moe-h200-full-n-2026-12-04.json', 'variant': auto, 'plan_error': n['plan_error'],
                 'steps': measured_steps(auto)},
        'every_layer': {'min': every_layer['min'], 'max': every_layer['max'], 'spread': every_layer['spread'],
                        'calls': [x['file'] for x in every_layer['calls']],
                        'gib': max(by_file[x['file']]['variants']['vora_unsloth_mb4']['peak_reserved_gib']
                                   for x in every_layer['calls']),
                        'steps': min(measured_steps(by_file[x['file']]['variants']['vora_unsloth_mb4'])
                                     for x in every_layer['calls'])},
        'rank': {'file': rank['file'], 'ratio': rank['median_step_ratio'],
                 'saved_gib': j[rank['twin']]['peak_reserved_gib'] - j[rank['variant']]['peak_reserved_gib']},
        'host': {'file': host['file'], 'ratio': host['median_step_ratio']},
        'fold': {'file': fold['file'], 'ratio': fold['median_step_ratio']},
        'gather': {'file': 'moe-h200-full-r-2026-12-05.json', 'ratio': gather['tokens_per_s'] / twin_r['tokens_per_s'],
                   'tokens_per_s': gather['tokens_per_s'], 'mfu': gather['mfu'],
                   'steps': min(measured_steps(gather), measured_steps(twin_r))},
        'mb8': {'tokens_per_s': c['vora_unsloth_mb8']['tokens_per_s'], 'steps': measured_steps(c['vora_unsloth_mb8'])},
        'triton': {'tokens_per_s': c['vora_unsloth_mb4_triton']['tokens_per_s'],
                   'steps': measured_steps(c['vora_unsloth_mb4_triton'])},
    }


def moe_8_layers() -> Dict[str, Any]:
    """The 35B-A3B shape cut to 8 layers: the side-by-side of megatron-h200-moe-g (the protocol's 10 steps each) and
    the first file, assembled by hand from 4 measured steps (before the protocol), which the README no longer quotes;
    Megatron on an H100 (Transformer Engine's CUTLASS grouped GEMM against its twin), the data-parallel runner under
    torchrun with one process against the runner without it, and Megatron full SFT on the cut to 3 layers."""
    g = _load('megatron-h200-moe-g-2026-12-04.json')
    ours, plain, mg = (g['variants'][k] for k in ('vora_unsloth_best', 'swift_peft', 'mg_mb2'))
    mg_base = _load('derived-megatron-h200-moe-g-mg_base-logs.json')['variants']['mg_base']
    ratios = [(name, _load(name)['backend_ratio']['megatron_over_unsloth'])
              for name in ('megatron-h200-moe-b-2026-12-02.json', 'megatron-h200-moe-c-2026-12-03.json',
                           'megatron-h200-moe-g-2026-12-04.json')]
    h = _load('megatron-h200-moe-h-2026-12-05.json')
    flagship = h['variants']['mg_mb2']
    prof = _load('megatron-h100-moe-prof-2026-12-06.json')
    cutlass, cutlass_twin = prof['variants']['mg_mb2_cutlass'], prof['variants']['mg_mb2']
    tr = _load('moe-torchrun1-c-2026-12-06.json')
    tr_one, tr_twin = tr['variants']['vora_unsloth_mb4_torchrun1'], tr['variants']['vora_unsloth_mb4']
    full = _load('megatron-h100-full-2026-12-06.json')
    mgf = full['variants'][full['flagship_variant']]
    fusion_file = 'megatron-h100-moe-fusion-b-2026-12-06.json'
    fb = _load(fusion_file)
    fused, unfused = fb['variants']['mg_mb2_cutlass'], fb['variants']['mg_mb2_cutlass_nofusion']
    gmm_file = 'megatron-h100-moe-gmm-2026-12-06.json'
    gm = _load(gmm_file)
    shipped, before, unsloth = (gm['variants'][k] for k in ('mg_mb4_te_ce_gmm_pao', 'mg_mb2_cutlass',
                                                            'vora_unsloth_best'))
    glora = _load('megatron-h100-moe-glora-2026-12-06.json')['variants']['mg_mb4_te_ce_gmm_pao_glora']
    co_file = 'megatron-h100-moe-co-2026-12-07.json'
    co = _load(co_file)
    coalesced, per_tensor, co_unsloth = (co['variants'][k] for k in ('mg_mb4_te_ce_gmm_pao_glora_co',
                                                                   'mg_mb4_te_ce_gmm_pao_glora', 'vora_unsloth_best'))
    full_b_file = 'megatron-h100-full-b-2026-12-07.json'
    full_b = _load(full_b_file)
    full_b_v = full_b['variants'][full_b['flagship_variant']]
    return {'ours': ours, 'plain': plain, 'speedup': ours['tokens_per_s'] / plain['tokens_per_s'],
            'steps': min(measured_steps(ours, g), measured_steps(plain, g)),
            'megatron': mg, 'megatron_steps': measured_steps(mg, g),
            'megatron_vs_mb1': mg['tokens_per_s'] / mg_base['tokens_per_s'],
            'megatron_vs_plain': mg['tokens_per_s'] / plain['tokens_per_s'],
            'ratios': ratios, 'flagship': flagship, 'flagship_steps': measured_steps(flagship, h),
            'flagship_losses': (flagship['losses'][0], flagship['losses'][-1], len(flagship['losses'])),
            'cutlass': _against_twin('megatron-h100-moe-prof-2026-12-06.json', prof, cutlass, cutlass_twin),
            'fusion': _against_twin(fusion_file, fb, fused, unfused),
            'shipped': {**_against_twin(gmm_file, gm, shipped, before),
                        'over_unsloth': shipped['tokens_per_s'] / unsloth['tokens_per_s'], 'unsloth': unsloth},
            'coalesced': {**_against_twin(co_file, co, coalesced, per_tensor), 'unsloth': co_unsloth,
                          'over_unsloth': coalesced['tokens_per_s'] / co_unsloth['tokens_per_s'],
                          'steps': min(measured_steps(v, co) for v in (coalesced, per_tensor, co_unsloth)),
                          'expert_check': ((co['variants'][co['flagship_variant']].get('report') or {})
                                           .get('expert_check') or {}),
                          'merged_loads': co['merged_loads'], 'twin_earlier': glora},
            'torchrun': {'file': 'moe-torchrun1-c-2026-12-06.json', 'one': tr_one, 'twin': tr_twin,
                         'ratio': tr_one['tokens_per_s'] / tr_twin['tokens_per_s'],
                         'steps': min(measured_steps(tr_one), measured_steps(tr_twin))},
            'full': {'file': 'megatron-h100-full-2026-12-06.json', 'v': mgf, 'steps': measured_steps(mgf, full),
                     'layers': full['model'].split('cut to ')[1].split(' ')[0], 'changed': full['weights_changed'],
                     'losses': (mgf['losses'][0], mgf['losses'][-1], len(mgf['losses'])),
                     'two_layers': {'file': full_b_file, 'v': full_b_v, 'steps': measured_steps(full_b_v, full_b),
                                    'merged_loads': full_b['merged_loads']}}}


def loads_in_transformers(merged_loads: bool) -> str:
    """What a result file's load check of the exported checkpoint said, as the README says it."""
    return 'loads in transformers' if merged_loads else 'did not load in transformers'


def expert_check_verdict(check: Dict[str, Any]) -> str:
    """merge_for_vllm.sh's per-expert check of a result file, as the README says it."""
    return (f'{"passes" if check.get("ok") else "fails"} `merge_for_vllm.sh`\'s per-expert check '
            f'({check.get("checked")} tensors)')


def _against_twin(name: str, data: Dict[str, Any], ours: Dict[str, Any], twin: Dict[str, Any]) -> Dict[str, Any]:
    """A lever against its twin of the same call: tokens/s ratio and the fewer measured steps of the two."""
    return {'file': name, 'ours': ours, 'twin': twin, 'ratio': ours['tokens_per_s'] / twin['tokens_per_s'],
            'steps': min(measured_steps(ours, data), measured_steps(twin, data))}


def fp8() -> Dict[str, Any]:
    b = _load('throughput-fp8-b-2026-12-02.json')['variants']
    eight, bf16 = b['vora_gc_compile_fp8'], b['vora_gc_compile']
    c = _load('throughput-fp8-c-2026-12-03.json')['variants']['vora_gc_compile_ck26_fp8']
    pairs = list(zip(eight['losses'], bf16['losses']))
    return {'eight': eight, 'bf16': bf16, 'saved': bf16['peak_reserved_gib'] - eight['peak_reserved_gib'],
            'ratio': eight['samples_per_s'] / bf16['samples_per_s'], 'steps': measured_steps(eight),
            'loss_diff': max(abs(a - b) / abs(b) for a, b in pairs), 'losses': len(pairs),
            'ck26': c, 'ck26_ratio': c['samples_per_s'] / bf16['samples_per_s'], 'ck26_steps': measured_steps(c)}


def planner() -> Dict[str, Any]:
    """The planner's memory and speed estimates against every measured run (benchmarks/calibration_table.py,
    benchmarks/speed_table.py: the predictions recomputed by the current code)."""
    sys.path.insert(0, REPO)
    rows = _module('calibration_table').table()
    checked = [r for r in rows if r['check']]
    out = [r for r in checked if r['sample'] == 'out']
    full_depth = [e for r in checked if r['source'].startswith('benchmarks/results/moe-h200-full')
                  for e in r['error'].values()]
    speed = _module('speed_table')
    srows = [r for r in speed.table() if r['checked']]
    return {'memory': {'out': len(out), 'out_within': sum(r['within'] for r in out), 'checked': len(checked),
                       'within': sum(r['within'] for r in checked), 'reported': len(rows) - len(checked),
                       'full_depth': (min(full_depth), max(full_depth))},
            'speed': {'checked': len(srows), 'within': sum(1 for r in srows if r['within']),
                      'in_sample': sum(1 for r in srows if r['in_sample']), 'tolerance': speed.TOLERANCE}}


# ---- the README blocks ---------------------------------------------------------------------------------------------
def block_planner_accuracy(f: Dict[str, Any]) -> str:
    mem, spd = f['planner']['memory'], f['planner']['speed']
    return _wrap(f'How it decides: `docs/planner.md`; prediction against measured runs: `docs/memory-model.md` '
                 f'(memory: {mem["out_within"]} of {mem["out"]} out-of-sample runs within ±10 %, `python '
                 f'benchmarks/calibration_table.py`) and `python benchmarks/speed_table.py` (speed: {spd["within"]} of '
                 f'{spd["checked"]} checked runs within ±{100 * spd["tolerance"]:.0f} %, {spd["in_sample"]} of them '
                 'in-sample; the ones outside are listed there with why).') + '\n'


def block_measured(f: Dict[str, Any]) -> str:
    le, de, mo, cut, e8, pl = f['learnability'], f['dense'], f['moe'], f['moe_8_layers'], f['fp8'], f['planner']
    sm = _load('megatron-h200-2026-12-01.json')
    ck, fr, fp = de['checkpointed'], de['free'], de['fastest_plain']
    h = mo['headline']
    first, later = mo['per_call'][0], mo['per_call'][1:]
    cu, tr, fu, ga, sh = cut['cutlass'], cut['torchrun'], cut['full'], cut['fusion'], cut['shipped']
    co = cut['coalesced']
    lines = [
        f'Each figure names its result file (in `benchmarks/results/`; `python benchmarks/moe_calls.py` tabulates the '
        f'full-depth MoE runs) and how many optimizer steps it measured; MFU divides by the H200\'s measured '
        f'{MEASURED_TFLOPS} TFLOP/s bf16 rate and says what it is at the {SPEC_TFLOPS} TFLOP/s spec. Generated by '
        '`python benchmarks/readme_figures.py` from the files.',
        '',
        f'* Learnability (`benchmarks/learnability.py`, one run): a small model trained through the whole pipeline '
        f'reaches R1@0.5 = {le["r1"]:.2f} on {le["test_videos"]} held-out synthetic clips; with answers shuffled '
        f'across samples, {le["shuffled"]:.2f} (chance {le["chance"]:.2f}).',
        f'* Throughput (`benchmarks/throughput.py`, 2B-shape Qwen3-VL LoRA, '
        f'{ck["tokens_per_sample"] / 1000:.1f}k tokens per sample, plain `swift sft` '
        f'and swift-vora side by side in one invocation, one H200): against plain swift as a knowledgeable user tunes '
        f'it (Liger, no ViT checkpointing, persistent workers, expandable segments), **{x(ck["speedup"], 2)} its '
        f'samples/s at less memory** ({ck["ours"]["samples_per_s"]:.2f} against {ck["plain"]["samples_per_s"]:.2f} '
        f'at {ck["ours"]["peak_reserved_gib"]:.2f} against {ck["plain"]["peak_reserved_gib"]:.2f} GiB, '
        f'{mfu(ck["ours"]["mfu"])}; {ck["run"]}, {steps_note(ck["steps"])} each), and where memory is free '
        f'**{x(fr["speedup"], 2)} plain swift\'s fastest at {fr["memory"]:.2f}x its memory** (micro-batch 4 '
        f'without checkpointing: {fr["ours"]["samples_per_s"]:.2f} against {fr["plain"]["samples_per_s"]:.2f} '
        f'samples/s, {fr["ours"]["peak_reserved_gib"]:.0f} against {fr["plain"]["peak_reserved_gib"]:.0f} GiB, '
        f'{mfu(fr["ours"]["mfu"])}; {fr["run"]}, {steps_note(fr["steps"])} each; {x(fp["speedup"], 2)} the '
        f'fastest plain swift ever measured here, {fp["samples_per_s"]:.2f} in {fp["run"]}). The path: decoder '
        'layers and vision blocks compiled (`train.compile=layers`), LoRA inputs kept in bf16 under autocast, batched '
        'vision attention, the patch embedding as one GEMM, pixels handed over in bf16, one decoder thread per video '
        'reader, the training loop\'s host work trimmed and sequences padded to a multiple of 64 tokens '
        '(`swift_vora/speed/`; `docs/benchmarks.md`).',
        f'* MoE video LoRA at full depth (`benchmarks/moe_throughput.py --layers 40`, the whole Qwen3.5/3.6-MoE '
        f'35B-A3B shape: 35.1 B parameters, 256 experts, 64 frames / {h["tokens_per_sample"]:,.0f} tokens per sample, '
        'loaded from a real '
        f'safetensors checkpoint, one H200), plain `swift sft` PEFT (`--target_parameters`) and swift-vora side by '
        f'side in one invocation ({source(h["file"])}, {steps_note(h["steps"])} each): **swift-vora (`swift-vora '
        f'train recipes/h200x1.yaml`: Unsloth split LoRA, micro-batch 4, the last 8 of 40 layers not checkpointed, '
        f'and the opt-in `SWIFT_VORA_MOE_LORA_SCALE=rank`) {h["ours"]["tokens_per_s"]:,.0f} tokens/s on the median '
        f'step against plain swift\'s {h["plain"]["tokens_per_s"]:,.0f}: {x(h["speedup"])}** ({x(h["speedup_mean"])} '
        f'on the mean step), at {h["ours"]["peak_reserved_gib"]:.1f} against {h["plain"]["peak_reserved_gib"]:.1f} '
        f'GiB, {mfu(h["ours"]["mfu"])} on active parameters. In each side-by-side run of the protocol, swift-vora\'s '
        f'fastest configuration over plain swift: {", ".join(x(c["speedup"]) for c in later)} (10 measured steps '
        f'each); the first run, before autocast and the encode threads, {x(first["speedup"])} '
        f'({source(first["file"])}).',
        f'  With `train.checkpoint_layers: auto` planned at the clips\' own 220 tokens a frame pair (the recipe caps '
        f'256): {mo["auto"]["variant"]["tokens_per_s"]:,.0f} tokens/s, '
        f'{mo["auto"]["variant"]["peak_reserved_gib"]:.1f} GiB, plan {100 * mo["auto"]["plan_error"]:+.1f} % '
        f'({source(mo["auto"]["file"])}, {steps_note(mo["auto"]["steps"])}). Every layer checkpointed: '
        f'{mo["every_layer"]["min"]:,.0f}-{mo["every_layer"]["max"]:,.0f} tokens/s across '
        f'{len(mo["every_layer"]["calls"])} runs (spread {100 * mo["every_layer"]["spread"]:.1f} %), '
        f'{mo["every_layer"]["gib"]:.0f} GiB. Levers, each against its twin of the same run (median steps): the '
        f'expert LoRA scaling on the rank intermediate {x(mo["rank"]["ratio"], 2)} with {mo["rank"]["saved_gib"]:.1f} '
        f'GiB less ({source(mo["rank"]["file"])}; opt-in until a second twin run); the two host levers '
        f'{x(mo["host"]["ratio"], 3)} (not defaults); the routed-row gather\'s permutation backward with the gate '
        f'gradient as one compiled reduction {x(mo["gather"]["ratio"], 3)} ({mo["gather"]["tokens_per_s"]:,.0f} '
        f'tokens/s, {mfu(mo["gather"]["mfu"])}; {source(mo["gather"]["file"])}); the experts\' down-projection LoRA '
        f'folded into the base GEMM {x(mo["fold"]["ratio"], 3)} (it loses). unsloth_zoo\'s fused router '
        + ('engages' if mo['levers_8']['fused_calls'] and not mo['levers_8']['unfused'] else 'does not engage')
        + ' on the router class Unsloth\'s compiler generates '
        f'({mo["levers_8"]["fused_calls"]} fused calls in a run of the 8-layer cut on an H100 with every lever on, '
        f'{mo["levers_8"]["tokens_per_s"]:,.0f} tokens/s, {steps_note(mo["levers_8"]["steps"])}: '
        f'{source(mo["levers_8"]["file"])}), and Gated DeltaNet\'s query and key at their own head count '
        '(`SWIFT_VORA_GDN_QK_HEADS=grouped`) '
        + (f'apply where Unsloth\'s compiler replaced transformers\' class ({mo["gva_8"]["grouped_calls"]} '
           f'grouped-head calls, relative difference {mo["gva_8"]["difference"]:g} from the repeat at the first '
           f'call, {mo["gva_8"]["tokens_per_s"]:,.0f} tokens/s with every lever, {steps_note(mo["gva_8"]["steps"])}: '
           f'{source(mo["gva_8"]["file"])})'
           if mo['gva_8']['grouped'] and mo['gva_8']['grouped_calls'] else 'do not apply')
        + '; neither is timed against a twin yet, so both stay opt-in. '
        'Measured slower at full depth and '
        f'not used: micro-batch 8 ({mo["mb8"]["tokens_per_s"]:,.0f} tokens/s, {steps_note(mo["mb8"]["steps"])}) '
        f'and Unsloth\'s Triton expert GEMMs ({mo["triton"]["tokens_per_s"]:,.0f} at micro-batch 4, '
        f'{steps_note(mo["triton"]["steps"])}). The first step compiles Triton kernels (minutes on '
        'a fresh machine; `swift-vora kernel-cache export` / `import` carries them to the next one). The planner '
        f'within {100 * pl["memory"]["full_depth"][0]:+.1f} to {100 * pl["memory"]["full_depth"][1]:+.1f} % of every '
        'full-depth peak on the calibration rows (`docs/memory-model.md`). `swift sft --tuner_backend unsloth` '
        'fails on this model in ms-swift 4.6.',
        f'* The same shape cut to 8 layers, one H200 ({source("megatron-h200-moe-g-2026-12-04.json")}, '
        f'{steps_note(cut["steps"])} each): swift-vora\'s Unsloth path {cut["ours"]["tokens_per_s"]:,.0f} tokens/s '
        f'against plain `swift sft` PEFT\'s {cut["plain"]["tokens_per_s"]:,.0f}: {x(cut["speedup"])}. It comes from '
        'the Gated DeltaNet Triton kernel unsloth_zoo vendors (with the Hopper fix), which plain swift cannot use on '
        'that machine, and from micro-batching. (An earlier figure, 3.3x, came from a file assembled by hand from 4 '
        'measured steps before the protocol: not quoted.) On one H100, the Unsloth runner under `torchrun '
        f'--nproc_per_node 1` (the data-parallel path with one replica) against the same runner without torchrun: '
        f'{x(tr["ratio"], 3)} ({tr["one"]["tokens_per_s"]:,.0f} against {tr["twin"]["tokens_per_s"]:,.0f} tokens/s, '
        f'micro-batch 4; {source(tr["file"])}, {steps_note(tr["steps"])} each).',
        f'* FP8 frozen base weights (`train.fp8: frozen_base`, torchao): a memory lever, not a speed one, at the 2B '
        f'shape: {e8["saved"]:.2f} GiB below bf16 ({e8["eight"]["peak_reserved_gib"]:.2f} against '
        f'{e8["bf16"]["peak_reserved_gib"]:.2f} GiB reserved) at {x(e8["ratio"], 2)} its samples/s, the '
        f'{e8["losses"]} logged losses within {100 * e8["loss_diff"]:.1f} % of bf16\'s '
        f'({source("throughput-fp8-b-2026-12-02.json")}, {steps_note(e8["steps"])}); held-out learning not checked '
        'yet. Spending the freed memory on fewer '
        f'recomputed layers (26 of 28 checkpointed, {e8["ck26"]["peak_reserved_gib"]:.2f} GiB) gave '
        f'{e8["ck26"]["samples_per_s"]:.2f} samples/s: still {x(e8["ck26_ratio"], 2)} bf16 with every layer '
        f'checkpointed ({source("throughput-fp8-c-2026-12-03.json")} against the former: across runs, '
        f'{steps_note(e8["ck26_steps"])}).',
        '* Megatron-SWIFT LoRA (`swift-vora train recipes/h200x8.yaml train.backend=megatron_ep_lora '
        'train.checkpoint_layers=null` overridden to '
        f'one GPU, EP 1): on a small random Qwen3-VL-MoE the loss fell {sm["losses"][0]:.2f} -> '
        f'{sm["losses"][-1]:.2f} over {len(sm["losses"])} steps, '
        f'expert and attention LoRA, router untouched, the merged checkpoint verified. On the 8-layer cut '
        '(Gated DeltaNet under Megatron), one H200: '
        f'{min(r for _, r in cut["ratios"]):.3f}-{max(r for _, r in cut["ratios"]):.3f}x the tokens/s of '
        f'swift-vora\'s Unsloth path in {len(cut["ratios"])} runs; at micro-batch 2, its fastest lever, '
        f'{cut["megatron"]["tokens_per_s"]:,.0f} tokens/s ({steps_note(cut["megatron_steps"])}), '
        f'{x(cut["megatron_vs_mb1"], 2)} its micro-batch 1 and {x(cut["megatron_vs_plain"], 2)} plain `swift sft` '
        f'PEFT\'s. At the settings the recipe names for Megatron (micro-batch 2) it trained that shape to its end: '
        f'loss {cut["flagship_losses"][0]:.2f} -> {cut["flagship_losses"][1]:.2f} in {cut["flagship_losses"][2]} '
        f'steps, {cut["flagship"]["tokens_per_s"]:,.0f} tokens/s ({steps_note(cut["flagship_steps"])}), '
        f'{cut["flagship"]["peak_reserved_gib"]:.2f} GiB reserved, the merged checkpoint loads in transformers, '
        f'router untouched ({source("megatron-h200-moe-h-2026-12-05.json")}; `docs/backends.md`). On one H100, '
        'Transformer Engine\'s CUTLASS grouped GEMM (`NVTE_USE_CUTLASS_GROUPED_GEMM=1`) '
        f'{x(cu["ratio"], 2)} its twin ({cu["ours"]["tokens_per_s"]:,.0f} against {cu["twin"]["tokens_per_s"]:,.0f} '
        f'tokens/s, data wait {100 * cu["ours"]["data_wait_fraction"]:.0f} %; {source(cu["file"])}, '
        f'{steps_note(cu["steps"])} each), and with apex\'s gradient-accumulation fusion {x(ga["ratio"], 2)} its '
        f'twin without ({ga["ours"]["tokens_per_s"]:,.0f} against {ga["twin"]["tokens_per_s"]:,.0f} tokens/s; '
        f'{source(ga["file"])}, {steps_note(ga["steps"])} each). With TE\'s cross entropy, the frozen experts as '
        'one grouped GEMM per product and the precision-aware optimizer at micro-batch 4: '
        f'{sh["ours"]["tokens_per_s"]:,.0f} tokens/s, '
        f'{x(sh["ratio"], 2)} micro-batch 2 without them ({sh["twin"]["tokens_per_s"]:,.0f}) and '
        f'{sh["over_unsloth"]:.2f}x the Unsloth path ({sh["unsloth"]["tokens_per_s"]:,.0f}), all three measured side '
        'by side in one run '
        f'({source(sh["file"])}, {steps_note(sh["steps"])} each). **With everything `recipes/h200x8.yaml` ships for '
        'Megatron** -- those, the expert LoRA factors as one grouped GEMM each and the optimizer over coalesced '
        'gradient-buffer runs (`SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm`, `SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced`)'
        f' -- **{co["ours"]["tokens_per_s"]:,.0f} tokens/s, {co["over_unsloth"]:.2f}x the Unsloth path** of the same '
        f'run ({co["unsloth"]["tokens_per_s"]:,.0f}) and {x(co["ratio"], 2)} its twin with the optimizer per tensor '
        f'({co["twin"]["tokens_per_s"]:,.0f}; that setting ran {co["twin_earlier"]["tokens_per_s"]:,.0f} in an '
        f'earlier run), the slowest measured step {co["ours"]["slowest_over_median"]:.2f}x the median, data wait '
        f'{100 * co["ours"]["data_wait_fraction"]:.2f} %; the twin\'s merged export '
        f'{expert_check_verdict(co["expert_check"])} and {loads_in_transformers(co["merged_loads"])} '
        f'({source(co["file"])}, {steps_note(co["steps"])} each). EP ≥ 2 has not run.',
        f'* Megatron full SFT of a MoE (`megatron_ep_full`, `recipes/h200x8-full.yaml` overridden to one H100, EP 1) '
        f'on the 35B-A3B shape cut to {fu["layers"]} layers: loss {fu["losses"][0]:.2f} -> {fu["losses"][1]:.2f} in '
        f'{fu["losses"][2]} steps, {fu["v"]["tokens_per_s"]:,.0f} tokens/s ({steps_note(fu["steps"])}), '
        f'{fu["v"]["peak_reserved_gib"]:.2f} GiB reserved against {fu["v"]["planned_reserved_gib"]:.2f} planned '
        f'before the run ({100 * fu["v"]["plan_error"]:+.1f} %); experts, attention, router and shared expert '
        f'changed, the vision tower unchanged ({fu["changed"]["vision"]} of its tensors changed; '
        f'{source(fu["file"])}). Cut to 2 layers with the native cross entropy: '
        f'{fu["two_layers"]["v"]["tokens_per_s"]:,.0f} tokens/s ({steps_note(fu["two_layers"]["steps"])}), '
        f'{fu["two_layers"]["v"]["peak_reserved_gib"]:.2f} GiB reserved against '
        f'{fu["two_layers"]["v"]["planned_reserved_gib"]:.2f} planned before the run '
        f'({100 * fu["two_layers"]["v"]["plan_error"]:+.1f} %), the converted checkpoint '
        f'{loads_in_transformers(fu["two_layers"]["merged_loads"])} '
        f'({source(fu["two_layers"]["file"])}).',
        f'* Planner memory model: {pl["memory"]["out_within"]} of {pl["memory"]["out"]} out-of-sample measurements '
        f'(H200 and H100) within ±10 % of their peaks -- rows no constant or rule was fitted to; '
        f'{pl["memory"]["within"]} of {pl["memory"]["checked"]} checked rows in all, {pl["memory"]["reported"]} '
        'reported and not checked, each with why (`python benchmarks/calibration_table.py`, '
        '`docs/memory-model.md`).',
        '* End to end: `swift-vora train recipes/h200x1.yaml` on a dense 2B model → ZeRO-3 with every guard → '
        '`verify-adapter` → `merge_for_vllm.sh` → `eval` (`docs/runs/h200-e2e-dense/`); ZeRO-3 on 2 H200s with every '
        'guard (`docs/runs/h200x2-multi-gpu-zero3/`); dense LoRA under `--deepspeed zero3` with every guard on '
        '(`docs/runs/h200-zero3-dense-guards.log`).',
    ]
    return '\n'.join(_wrap(line) for line in lines) + '\n'


def _wrap(paragraph: str, width: int = 118) -> str:
    """A paragraph or bullet as the README writes them: lines of at most `width`, a bullet's continued with two
    spaces (Markdown joins them; a break inside a code span reads as a space)."""
    import textwrap
    if not paragraph:
        return paragraph
    indent = '  ' if paragraph.startswith(('* ', '  ')) else ''
    first = '' if paragraph.startswith('* ') else indent
    return textwrap.fill(paragraph[len(first):] if first else paragraph, width, initial_indent=first,
                         subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


BLOCKS: Dict[str, Callable[[Dict[str, Any]], str]] = {
    'planner_accuracy': block_planner_accuracy,
    'measured': block_measured,
}


def figures() -> Dict[str, Any]:
    return {'learnability': learnability(), 'dense': dense(), 'moe': moe(), 'moe_8_layers': moe_8_layers(),
            'fp8': fp8(), 'planner': planner()}


def generated() -> Dict[str, str]:
    f = figures()
    return {name: render(f) for name, render in BLOCKS.items()}


def rewrite(text: str, blocks: Dict[str, str]) -> str:
    """`text` (the README) with every figures block's body replaced by its generated one."""
    return BLOCK.sub(lambda m: m.group(1) + blocks[m.group('name')] + m.group(4), text)


def differences(text: str, blocks: Dict[str, str]) -> List[str]:
    """One entry per block that is missing from `text` or differs from what the files give (a unified diff)."""
    found = {m.group('name'): m.group('body') for m in BLOCK.finditer(text)}
    out = []
    for name, body in blocks.items():
        if name not in found:
            out.append(f'README.md has no block {name!r} (<!-- figures:{name} ... --> ... <!-- /figures:{name} -->)')
        elif found[name] != body:
            diff = difflib.unified_diff(found[name].splitlines(), body.splitlines(), 'README.md', 'the files',
                                        lineterm='', n=0)
            out.append(f'block {name!r} differs from the files:\n' + '\n'.join(diff))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true', help='exit 1 when README.md differs from the files')
    ap.add_argument('--write', action='store_true', help='rewrite README.md\'s blocks from the files')
    ap.add_argument('--readme', default=README)
    args = ap.parse_args(argv)
    blocks = generated()
    with open(args.readme, encoding='utf-8') as fh:
        text = fh.read()
    if args.write:
        new = rewrite(text, blocks)
        problems = differences(new, blocks)
        if problems:
            print('\n'.join(problems), file=sys.stderr)
            return 1
        with open(args.readme, 'w', encoding='utf-8') as fh:
            fh.write(new)
        print(f'wrote {len(blocks)} blocks of {os.path.relpath(args.readme, REPO)}')
        return 0
    if args.check:
        problems = differences(text, blocks)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for name, body in blocks.items():
        print(f'<!-- figures:{name} -->\n{body}<!-- /figures:{name} -->\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
