#!/usr/bin/env python
"""Measure training memory per phase next to the planner's prediction, to fit swift_vora/plan/constants.py.

For each configuration: build a random-weight model from its config.json **on the device** (nothing is
downloaded, no tokenizer), wrap it like swift does (PEFT LoRA or full / selective unfreezing, bf16, gradient
checkpointing with the inputs requiring grad, the frozen vision tower checkpointed), feed a synthetic sample
with the real token layout of a Qwen3-VL / Qwen3.5 video (per frame pair: timestamp text, <vision_start>,
tokens, <vision_end>; pixel tensors of the matching grid), run a few AdamW steps, and record
torch.cuda.max_memory_allocated / max_memory_reserved for each phase:
  load        model built (+ adapters) on the device
  first_step  first forward + backward + optimizer.step (Adam states are created here)
  steady      the following steps
The prediction is `swift_vora.plan.memory.estimate(..., TrainSetup(backend='ddp', ...))`: one GPU, no
DeepSpeed, which is what this loop is. Results go to JSON (default benchmarks/results/).

    # on the GPU machine (the default matrix, or your own list)
    python benchmarks/calibrate_memory.py --device cuda --out benchmarks/results/calibrate_h200.json
    python benchmarks/calibrate_memory.py --configs my_matrix.json --device cuda
    # here, on CPU: tiny configs, 2 steps, RSS instead of CUDA counters (checks the script, not the numbers)
    python benchmarks/calibrate_memory.py --dry-run --out /tmp/calib.json

A configuration (JSON list of objects):
  {"name": "...", "config": "tests/fixtures/configs/qwen3_vl_2b.json", "overrides": {"text_config": {...}},
   "tuner": "lora" | "full" | "selective", "lora_rank": 8,
   "lora_targets": "all-linear" | "all-linear-except-experts" | "attention",
   "video": {"clip_seconds": 32, "fps": 2, "max_frames": 64, "frame_tokens": 196}   (or "seq_len": 4096),
   "answer_tokens": 32, "micro_batch": 1, "gradient_checkpointing": true,
   "vision_mode": "checkpointed_requires_grad" | "no_grad", "logits": "supervised" | "all", "steps": 3}
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import gc
import json
import math
import os
import platform
import re
import resource
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from swift_vora.plan import constants as C  # noqa: E402
from swift_vora.plan.memory import TrainSetup, estimate  # noqa: E402
from swift_vora.plan.model_spec import model_spec  # noqa: E402
from swift_vora.plan.video_budget import text_only_tokens, video_tokens  # noqa: E402

FIX = os.path.join(ROOT, 'tests', 'fixtures', 'configs')
VIDEO_6K = {'clip_seconds': 32, 'fps': 2, 'max_frames': 64, 'frame_tokens': 196}
VIDEO_24K = {'clip_seconds': 32, 'fps': 2, 'max_frames': 64, 'frame_tokens': 768}
# Qwen3_5MoeConfig() defaults (the seed fixture) leave the vision merger at out_hidden_size 3584 while the text
# hidden size is 2048: counting works, a video forward does not. The real 35B-A3B merger emits 2048.
Q35_MOE_FIX = {'vision_config': {'out_hidden_size': 2048}}

# The default matrix for one H200 (what the lead runs first). Each entry fits one 139.8 GiB GPU as predicted.
# How the harness runs the frozen ViT when an entry names no mode: the way the recorded H200 runs
# (benchmarks/results/calibration-h200-*.json) did, so they stay reproducible after the planner's own default
# became 'no_grad' (docs/memory-model.md). Prediction and run always use the same mode.
HARNESS_VISION_MODE = 'checkpointed_requires_grad'

DEFAULT_MATRIX = [
    {'name': 'qwen3_vl_2b-lora8-video6k', 'config': f'{FIX}/qwen3_vl_2b.json', 'tuner': 'lora', 'video': VIDEO_6K},
    {'name': 'qwen3_vl_2b-lora8-video24k', 'config': f'{FIX}/qwen3_vl_2b.json', 'tuner': 'lora', 'video': VIDEO_24K},
    {'name': 'qwen3_vl_2b-lora8-video6k-nogc', 'config': f'{FIX}/qwen3_vl_2b.json', 'tuner': 'lora',
     'video': VIDEO_6K, 'gradient_checkpointing': False},
    {'name': 'qwen3_vl_2b-lora8-video6k-vit-nograd', 'config': f'{FIX}/qwen3_vl_2b.json', 'tuner': 'lora',
     'video': VIDEO_6K, 'vision_mode': 'no_grad'},
    {'name': 'qwen3_vl_2b-full-video6k', 'config': f'{FIX}/qwen3_vl_2b.json', 'tuner': 'full', 'video': VIDEO_6K},
    {'name': 'qwen3_vl_2b-lora8-video6k-alllogits', 'config': f'{FIX}/qwen3_vl_2b.json', 'tuner': 'lora',
     'video': VIDEO_6K, 'logits': 'all'},
    {'name': 'qwen3_moe_30b_a3b-lora8-text8k', 'config': f'{FIX}/qwen3_moe_30b_a3b.json', 'tuner': 'lora',
     'seq_len': 8192},
    {'name': 'qwen3_vl_moe_30b_a3b-lora8-video6k', 'config': f'{FIX}/qwen3_vl_moe_30b_a3b.json', 'tuner': 'lora',
     'video': VIDEO_6K},
    {'name': 'qwen3_5_moe_35b_a3b-lora8-video6k', 'config': f'{FIX}/qwen3_5_moe_35b_a3b.json', 'tuner': 'lora',
     'video': VIDEO_6K, 'overrides': Q35_MOE_FIX},
    {'name': 'qwen3_5_moe_35b_a3b-lora8-attention-video6k', 'config': f'{FIX}/qwen3_5_moe_35b_a3b.json',
     'tuner': 'lora', 'lora_targets': 'attention', 'video': VIDEO_6K, 'overrides': Q35_MOE_FIX},
    {'name': 'qwen3_5_moe_35b_a3b-selective-video6k', 'config': f'{FIX}/qwen3_5_moe_35b_a3b.json',
     'tuner': 'selective', 'video': VIDEO_6K, 'overrides': Q35_MOE_FIX},
]

# --dry-run: tiny shapes on CPU, exercising video inputs, MoE experts with LoRA, hybrid linear attention.
DRY_RUN_MATRIX = [
    {'name': 'tiny_qwen3_vl_moe-lora', 'config': f'{FIX}/tiny_qwen3_vl_moe.json', 'tuner': 'lora', 'lora_rank': 4,
     'video': {'clip_seconds': 4, 'fps': 2, 'max_frames': 8, 'frame_tokens': 4}, 'steps': 2},
    {'name': 'tiny_qwen3_5_moe-selective', 'config': f'{FIX}/tiny_qwen3_5_moe.json', 'tuner': 'selective',
     'video': {'clip_seconds': 4, 'fps': 2, 'max_frames': 8, 'frame_tokens': 4}, 'steps': 2},
    {'name': 'tiny_qwen3_moe-full-text', 'config': f'{FIX}/tiny_qwen3_moe.json', 'tuner': 'full', 'seq_len': 64,
     'steps': 2},
]

SELECTIVE_RE = re.compile(r'\.(self_attn|linear_attn|shared_expert|shared_expert_gate)\.')


def deep_update(d, u):
    for k, v in u.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            deep_update(d[k], v)
        else:
            d[k] = v
    return d


def load_cfg_dict(entry):
    path = entry['config']
    if os.path.isdir(path):
        path = os.path.join(path, 'config.json')
    with open(path) as f:
        d = json.load(f)
    return deep_update(copy.deepcopy(d), entry.get('overrides', {}))


def sample_tokens(entry, spec):
    answer = int(entry.get('answer_tokens', C.DEFAULT_ANSWER_TOKENS))
    if entry.get('seq_len') or spec.vision is None:
        n = int(entry.get('seq_len') or 1024)
        return text_only_tokens(n, answer)
    v = dict(VIDEO_6K, **entry.get('video', {}))
    return video_tokens(v['clip_seconds'], v['fps'], v['max_frames'], v['frame_tokens'],
                        text_tokens=C.DEFAULT_PROMPT_TOKENS + answer, supervised_tokens=answer,
                        patch_size=spec.vision.patch_size, merge_size=spec.vision.spatial_merge_size,
                        temporal_patch_size=spec.vision.temporal_patch_size)


def predicted(entry, spec, tok):
    setup = TrainSetup(backend='ddp', tuner=entry.get('tuner', 'lora'), gpus_per_node=1,
                       lora_rank=int(entry.get('lora_rank', C.DEFAULT_LORA_RANK)),
                       lora_targets=entry.get('lora_targets', 'all-linear'),
                       micro_batch=int(entry.get('micro_batch', 1)),
                       gradient_checkpointing=bool(entry.get('gradient_checkpointing', True)),
                       vision_mode=entry.get('vision_mode', HARNESS_VISION_MODE),
                       logits_positions=entry.get('logits', 'supervised'), dataloader_workers=0)
    e = estimate(spec, tok, setup)
    return {'phases': e.phases_gib(), 'breakdown_gib': e.gpu_gib(), 'trainable_params': e.trainable_params,
            'assumptions': e.assumptions}


def _grid(tokens_per_pair, merge):
    """(h, w) patch grid whose merged area is tokens_per_pair (near-square)."""
    hm = max(d for d in range(1, int(math.isqrt(tokens_per_pair)) + 1) if tokens_per_pair % d == 0)
    return hm * merge, (tokens_per_pair // hm) * merge


def build_inputs(torch, cfg, spec, tok, micro_batch, device, dtype, logits_mode):
    """Synthetic token ids / pixels with the real layout; returns (model kwargs, labels, n_keep)."""
    vocab = spec.vocab_size
    gen = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(10, max(11, min(vocab, 150000) - 10), (n, ), generator=gen)

    answer = tok.supervised_tokens
    kw = {}
    if spec.vision is not None and tok.groups:
        v = spec.vision
        vs, ve = cfg.vision_start_token_id, cfg.vision_end_token_id
        vid = cfg.video_token_id
        pieces = [text(C.DEFAULT_PROMPT_TOKENS // 2)]
        ts = max(0, C.TIMESTAMP_TOKENS_PER_GROUP - 2)
        per = tok.tokens_per_group
        if spec.family == 'qwen2_5_vl':  # one block, no timestamps
            pieces += [torch.tensor([vs]), torch.full((tok.groups * per, ), vid), torch.tensor([ve])]
        else:
            for _ in range(tok.groups):
                pieces += [text(ts), torch.tensor([vs]), torch.full((per, ), vid), torch.tensor([ve])]
        pieces += [text(C.DEFAULT_PROMPT_TOKENS - C.DEFAULT_PROMPT_TOKENS // 2), text(answer)]
        ids = torch.cat(pieces)
        h, w = _grid(per, v.spatial_merge_size)
        grid = torch.tensor([[tok.groups, h, w]] * micro_batch)
        n_patch = tok.groups * h * w
        feat = 3 * v.temporal_patch_size * v.patch_size ** 2
        kw['pixel_values_videos'] = torch.randn(n_patch * micro_batch, feat, generator=gen).to(device, dtype)
        kw['video_grid_thw'] = grid.to(device)
    else:
        ids = text(tok.total_tokens)
    ids = ids.unsqueeze(0).repeat(micro_batch, 1)
    labels = torch.full_like(ids, -100)
    labels[:, -answer:] = ids[:, -answer:]
    kw['input_ids'] = ids.to(device)
    kw['attention_mask'] = torch.ones_like(ids).to(device)
    if spec.vision is not None and tok.groups:
        # what the processor returns next to input_ids (0 text, 1 image, 2 video): M-RoPE needs it
        kw['mm_token_type_ids'] = (ids == cfg.video_token_id).long().mul(2).to(device)
    n_keep = answer + 1 if logits_mode == 'supervised' else ids.shape[1]
    return kw, labels.to(device), n_keep


def remap_special_tokens(cfg, vocab):
    """Tiny configs have a small vocab but Qwen's fixed special ids: move them to the top of the vocab."""
    moved = {}
    for i, k in enumerate(('image_token_id', 'video_token_id', 'vision_start_token_id', 'vision_end_token_id')):
        val = getattr(cfg, k, None)
        if val is not None and val >= vocab:
            setattr(cfg, k, vocab - 1 - i)
            moved[k] = vocab - 1 - i
    return moved


class Meter:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.startswith('cuda')

    def reset(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def read(self):
        t = self.torch
        if self.cuda:
            t.cuda.synchronize()
            free, total = t.cuda.mem_get_info()
            return {'max_allocated_gib': t.cuda.max_memory_allocated() / C.GiB,
                    'max_reserved_gib': t.cuda.max_memory_reserved() / C.GiB,
                    'allocated_gib': t.cuda.memory_allocated() / C.GiB,
                    'reserved_gib': t.cuda.memory_reserved() / C.GiB,
                    # driver-level use beyond torch's reserve: CUDA context, cuBLAS workspaces, NCCL
                    'device_used_minus_reserved_gib': (total - free - t.cuda.memory_reserved()) / C.GiB}
        # CPU: peak resident set size of the process (monotonic; checks the script, not the GPU numbers)
        return {'rss_peak_gib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / C.GiB}


def run_one(entry, device, default_steps):
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForImageTextToText
    d = load_cfg_dict(entry)
    spec = model_spec(d)
    tok = sample_tokens(entry, spec)
    res = {'name': entry['name'], 'config': entry['config'], 'overrides': entry.get('overrides', {}),
           'model_type': spec.model_type, 'total_params': spec.total_params, 'tokens': tok.to_dict(),
           'setup': {k: entry.get(k) for k in ('tuner', 'lora_rank', 'lora_targets', 'micro_batch',
                                               'gradient_checkpointing', 'vision_mode', 'logits')},
           'predicted': predicted(entry, spec, tok), 'measured': {}, 'error': None}
    # bf16 as in training; on CPU (the --dry-run check) fp32, because CPU bf16 kernels are slow
    dtype = torch.bfloat16 if device.startswith('cuda') else torch.float32
    res['dtype'] = str(dtype).replace('torch.', '')
    meter = Meter(torch, device)
    model = opt = None
    try:
        cfg = CONFIG_MAPPING[d['model_type']].from_dict(d)
        res['remapped_special_tokens'] = remap_special_tokens(cfg, spec.vocab_size)
        cls = AutoModelForImageTextToText if spec.auto_class == 'AutoModelForImageTextToText' else \
            AutoModelForCausalLM
        meter.reset()
        t0 = time.time()
        with torch.device(device):
            model = cls.from_config(cfg, dtype=dtype, attn_implementation='sdpa')
        tuner = entry.get('tuner', 'lora')
        gc_on = bool(entry.get('gradient_checkpointing', True))
        vision_mode = entry.get('vision_mode', HARNESS_VISION_MODE)
        if gc_on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})
            model.enable_input_require_grads()
        visual = getattr(getattr(model, 'model', model), 'visual', None)
        if visual is not None:
            for p in visual.parameters():
                p.requires_grad_(False)
            if vision_mode == 'checkpointed_requires_grad' and gc_on:
                # swift: vit_gradient_checkpointing follows gradient_checkpointing, ViT inputs require grad
                visual.patch_embed.register_forward_hook(lambda m, i, o: o.requires_grad_(True))
            elif vision_mode == 'no_grad':
                orig = visual.forward

                def no_grad_forward(*a, **k):
                    with torch.no_grad():
                        return orig(*a, **k)
                visual.forward = no_grad_forward
        if tuner == 'lora':
            from peft import LoraConfig, get_peft_model
            targets = entry.get('lora_targets', 'all-linear')
            names = sorted({g.name.split('.')[-1] for g in spec.lora_groups(targets) if g.component != 'experts'})
            regex = r'^(model\.language_model|model)\.layers\.\d+\.(.*\.)?(' + '|'.join(names) + ')$'
            tp = (['mlp.experts.gate_up_proj', 'mlp.experts.down_proj']
                  if targets == 'all-linear' and spec.is_moe else None)
            r = int(entry.get('lora_rank', C.DEFAULT_LORA_RANK))
            model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=regex,
                                                     target_parameters=tp, lora_dropout=0.0))
        else:
            for n, p in model.named_parameters():
                train = '.visual.' not in f'.{n}' and (tuner == 'full' or bool(SELECTIVE_RE.search(n)))
                p.requires_grad_(train)
        params = [p for p in model.parameters() if p.requires_grad]
        res['measured_trainable_params'] = sum(p.numel() for p in params)
        res['measured']['load'] = meter.read()
        res['load_seconds'] = round(time.time() - t0, 2)
        opt = torch.optim.AdamW(params, lr=1e-5)
        kw, labels, n_keep = build_inputs(torch, cfg, spec, tok, int(entry.get('micro_batch', 1)), device, dtype,
                                          entry.get('logits', 'supervised'))
        model.train()
        steps = int(entry.get('steps', default_steps))
        step_times = []
        for step in range(steps):
            if step in (0, 1):
                meter.reset()
            t1 = time.time()
            out = model(**kw, logits_to_keep=n_keep)
            logits = out.logits[:, :-1].float()
            tgt = labels[:, -n_keep + 1:]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                                     ignore_index=-100)
            loss.backward()
            del out, logits
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_times.append(round(time.time() - t1, 3))
            if step == 0:
                res['measured']['first_step'] = meter.read()
            res['loss'] = float(loss.detach().float().cpu())
        if steps > 1:
            res['measured']['steady'] = meter.read()
        res['step_seconds'] = step_times
    except Exception as e:  # noqa: BLE001 - record OOMs and the like, keep going with the matrix
        res['error'] = f'{type(e).__name__}: {e}'.splitlines()[0][:500]
        res['traceback'] = traceback.format_exc()[-2000:]
        res['measured']['at_error'] = meter.read()
    finally:
        del model, opt
        gc.collect()
        if device.startswith('cuda'):
            torch.cuda.empty_cache()
    # measured / predicted (GPU only): allocated vs the predicted allocations, reserved vs + fragmentation
    ratios = {}
    for ph, m in res['measured'].items():
        p = res['predicted']['phases'].get(ph)
        if p and 'max_allocated_gib' in m and p.get('gpu_allocated_gib'):
            ratios[ph] = {'allocated': round(m['max_allocated_gib'] / p['gpu_allocated_gib'], 3),
                          'reserved': round(m['max_reserved_gib'] / p['gpu_reserved_gib'], 3)}
    res['measured_over_predicted'] = ratios
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--configs', help='JSON file with a list of configurations (default: the built-in matrix)')
    ap.add_argument('--device', default=None, help='cuda (default when available) or cpu')
    ap.add_argument('--dry-run', action='store_true', help='tiny configs on CPU, 2 steps: checks the script runs')
    ap.add_argument('--steps', type=int, default=3, help='steps per configuration (>= 2 for a steady phase)')
    ap.add_argument('--only', default=None, help='regex on configuration names')
    ap.add_argument('--out', default=None, help='output JSON (default benchmarks/results/calibrate_memory-*.json)')
    args = ap.parse_args(argv)
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
    import torch
    import transformers
    if args.dry_run:
        matrix, device = DRY_RUN_MATRIX, args.device or 'cpu'
    else:
        device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
        if args.configs:
            with open(args.configs) as f:
                matrix = json.load(f)
        else:
            matrix = DEFAULT_MATRIX
    if args.only:
        matrix = [m for m in matrix if re.search(args.only, m['name'])]
    meta = {'date': _dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds'), 'device': device,
            'device_name': torch.cuda.get_device_name() if device.startswith('cuda') else platform.processor(),
            'torch': torch.__version__, 'transformers': transformers.__version__,
            'command': ' '.join([os.path.relpath(__file__, ROOT)] + (argv if argv is not None else sys.argv[1:])),
            'note': 'measured = torch.cuda.max_memory_* per phase (CPU: process RSS); predicted = '
                    'swift_vora.plan.memory.estimate(backend=ddp); every predicted number is a prediction'}
    try:
        import peft
        meta['peft'] = peft.__version__
    except ImportError:
        meta['peft'] = None
    if device.startswith('cuda'):
        meta['device_total_gib'] = torch.cuda.get_device_properties(0).total_memory / C.GiB
    results = []
    for entry in matrix:
        print(f'[calibrate] {entry["name"]} ...', flush=True)
        r = run_one(entry, device, args.steps)
        results.append(r)
        m = r['measured'].get('steady') or r['measured'].get('first_step') or {}
        p = r['predicted']['phases']['steady']
        print(f'[calibrate] {entry["name"]}: measured {json.dumps({k: round(v, 2) for k, v in m.items()})} | '
              f'predicted {p["gpu_gib"]:.2f} GiB' + (f' | ERROR {r["error"]}' if r['error'] else ''), flush=True)
    out = args.out or os.path.join(ROOT, 'benchmarks', 'results', 'calibrate_memory-'
                                   f'{device.split(":")[0]}-{time.strftime("%Y%m%d-%H%M%S")}.json')
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump({'meta': meta, 'results': results}, f, indent=2)
    print(f'[calibrate] wrote {out}')
    return 1 if any(r['error'] for r in results) and args.dry_run else 0


if __name__ == '__main__':
    sys.exit(main())
