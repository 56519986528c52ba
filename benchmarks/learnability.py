"""Learnability: can a model trained through the whole swift-vora pipeline learn an answer that is in the frames?

    python benchmarks/learnability.py            # GPU: both runs (~4-6 min on one H200), asserts the thresholds
    python benchmarks/learnability.py --smoke    # CPU: tiny model, a few clips, 2 steps; no threshold asserted

The task (swift_vora.synthetic): a red square is on screen exactly inside the annotated intervals. Videos are
16 s long (4 fps, 128x96, mp4v) with 1-3 events of 2-4 s on a 1 s grid; the plugin windows them into 8 s
clips (SWIFT_VORA_WINDOW=8), so events are clipped at window edges and rebased to clip time, and the model
sees 16 frames at 2 fps (8 groups of 12 video tokens, each after its window-relative `<t seconds>` stamp).
The answer can only be learned if frames, timestamps, windowing, rebasing and labels line up.

Two runs, identical except for the labels, each `swift sft --custom_register_path swift_vora --dataset
ANNOTATIONS.jsonl --template video_ora` (full fine-tuning of a random Qwen3-VL: hidden 256, 4 layers,
vision depth 2) then `swift infer` (transformers backend) on held-out videos:
- `normal`: the true annotations.           Expected: R1@0.5 >= 0.8.
- `shuffled`: the same videos with the `windows` lists permuted across videos (a derangement), so labels
  carry no information about the frames.      Expected: near chance.
Both run at the same time on the GPU (the model is tiny; the DataLoader workers split the cores).

Scoring: each response is read with the project's parser (`swift_vora.answer_parser.parse_answer`, with the clip
length as duration; plain `json.loads` if that is not importable) and compared with the clip's ground truth
(the `labels` swift writes next to each response: the windowed, rebased answer). R1@0.5 = fraction of clips
whose FIRST predicted window has IoU >= 0.5 with some ground-truth window. Clips whose ground truth is empty
(`[]`) are NOT in R1@0.5 (there is nothing to recall); they are reported apart as `empty_accuracy` (the model
answered `[]`), and `r1_at_0_5_all` counts them as hits when the answer is `[]`. An unparseable response
counts as a miss. Chance: `chance_r1_at_0_5` is the expected R1@0.5 of answering a random training answer
regardless of the video; `majority_r1_at_0_5` that of always answering the most frequent training answer.
Pass: r1_at_0_5 >= 0.8 and shuffled_r1_at_0_5 <= max(chance, majority) + 0.15.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import (  # noqa: E402
    REPO,
    base_env,
    build_model,
    cmdline,
    cuda_available,
    hardware,
    loss_max_rel_diff,
    read_jsonl,
    run_logged,
    swift_cmd,
    tail,
    wait_or_kill,
    write_results,
)

sys.path.insert(0, REPO)

R1_THRESHOLD = 0.8
SHUFFLED_MARGIN = 0.15


# ---- data ------------------------------------------------------------------------------------------------------

def random_events(duration: int, rng: random.Random, counts=(1, 2, 2, 3), lengths=(2, 3, 4), gap: int = 1
                  ) -> List[Tuple[float, float]]:
    """1-3 non-overlapping events on a 1 s grid, at least `gap` seconds apart (so they stay separate)."""
    for _ in range(100):
        want = rng.choice(counts)
        events: List[Tuple[int, int]] = []
        for _ in range(20 * want):
            if len(events) == want:
                break
            length = rng.choice(lengths)
            start = rng.randint(0, duration - length)
            cand = (start, start + length)
            if all(cand[1] + gap <= s or cand[0] >= e + gap for s, e in events):
                events.append(cand)
        if events:
            return sorted((float(s), float(e)) for s, e in events)
    return [(0.0, 2.0)]


def make_split(out_dir: str, prefix: str, n: int, duration: int, fps: float, size, seed: int,
               workers: int) -> List[Dict[str, Any]]:
    from throughput import _write_clip
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    jobs, rows = [], []
    for i in range(n):
        events = random_events(duration, rng)
        path = os.path.join(out_dir, f'{prefix}_{i:04d}.mp4')
        jobs.append((path, float(duration), events, fps, tuple(size), seed * 100003 + i))
        rows.append({'id': f'{prefix}_{i:04d}', 'video': path, 'duration': float(duration),
                     'query': 'the moments when the red square is on screen',
                     'windows': [[s, e] for s, e in events]})
    if workers > 1:
        from multiprocessing import get_context
        with get_context('fork').Pool(workers) as pool:
            pool.starmap(_write_clip, jobs)
    else:
        for job in jobs:
            _write_clip(*job)
    return rows


def derange(rows: List[Dict[str, Any]], seed: int) -> List[Dict[str, Any]]:
    """The same rows with `windows` permuted so that no video keeps its own (labels carry no signal)."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    for _ in range(1000):
        rng.shuffle(order)
        if all(i != j for i, j in enumerate(order)) or len(rows) < 2:
            break
    return [{**row, 'windows': rows[j]['windows']} for row, j in zip(rows, order)]


def write_jsonl(rows, path):
    with open(path, 'w') as f:
        for row in rows:
            f.write(json.dumps(row) + '\n')
    return path


def windowed_answers(rows: List[Dict[str, Any]], window: float) -> List[List[List[float]]]:
    """The answers the plugin will train on (same windowing code)."""
    from swift_vora.data.annotations import Annotation
    from swift_vora.data.windowing import WindowConfig, make_windows
    out = []
    config = WindowConfig(window=window)
    for row in rows:
        ann = Annotation(id=row['id'], video=row['video'], duration=row['duration'], query=row.get('query'),
                         windows=[tuple(w) for w in row['windows']], line=0, source='<learnability>')
        for sample in make_windows(ann, config):
            out.append([[s, e] for s, e in sample.events])
    return out


# ---- scoring -------------------------------------------------------------------------------------------------

def _parser():
    try:
        from swift_vora.answer_parser import parse_answer

        def parse(text, duration):
            res = parse_answer(text, duration=duration)
            return [list(w) for w in res.windows], bool(res.ok)
        return parse, 'swift_vora.answer_parser.parse_answer'
    except ImportError:  # the project parser is not there yet: strict JSON
        def parse(text, duration):
            try:
                value = json.loads(text)
                pairs = [[float(a), float(b)] for a, b in value]
                return pairs, True
            except Exception:  # noqa: BLE001
                return [], False
        return parse, 'json.loads (swift_vora.answer_parser.parse_answer not importable)'


def iou(a, b) -> float:
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def first_hit(pred: List[List[float]], gt: List[List[float]], thr: float = 0.5) -> bool:
    return bool(pred) and any(iou(pred[0], g) >= thr for g in gt)


def score(result_path: str, clip_seconds: float) -> Dict[str, Any]:
    parse, parser_name = _parser()
    rows = read_jsonl(result_path)
    hits = nonempty = empty = empty_ok = failures = 0
    examples = []
    for row in rows:
        gt_text = row.get('labels')
        gt, _ = parse(gt_text if isinstance(gt_text, str) else json.dumps(gt_text), clip_seconds)
        pred, ok = parse(row.get('response') or '', clip_seconds)
        failures += not ok
        if gt:
            nonempty += 1
            hits += first_hit(pred, gt)
        else:
            empty += 1
            empty_ok += ok and not pred
        if len(examples) < 8:
            examples.append({'id': (row.get('chat_template_kwargs') or {}).get('sample_id'), 'labels': gt_text,
                             'response': (row.get('response') or '')[:200]})
    total = len(rows)
    return {
        'clips': total, 'clips_with_events': nonempty, 'clips_empty': empty,
        'r1_at_0_5': round(hits / nonempty, 4) if nonempty else None,
        'r1_at_0_5_all': round((hits + empty_ok) / total, 4) if total else None,
        'empty_accuracy': round(empty_ok / empty, 4) if empty else None,
        'parse_failures': failures, 'parser': parser_name, 'examples': examples,
    }


def chance_levels(train_answers: List[List[List[float]]], test_answers: List[List[List[float]]]) -> Dict[str, float]:
    nonempty = [gt for gt in test_answers if gt]
    if not nonempty or not train_answers:
        return {'chance_r1_at_0_5': None, 'majority_r1_at_0_5': None, 'majority_answer': None}
    expected = sum(sum(first_hit(a, gt) for a in train_answers) / len(train_answers) for gt in nonempty) / len(nonempty)
    counts = Counter(json.dumps(a) for a in train_answers)
    majority = json.loads(counts.most_common(1)[0][0])
    maj = sum(first_hit(majority, gt) for gt in nonempty) / len(nonempty)
    return {'chance_r1_at_0_5': round(expected, 4), 'majority_r1_at_0_5': round(maj, 4),
            'majority_answer': majority}


# ---- runs ----------------------------------------------------------------------------------------------------

def budget_env(args) -> Dict[str, str]:
    return {'SWIFT_VORA_WINDOW': str(args.window), 'SWIFT_VORA_FPS': '2', 'SWIFT_VORA_MIN_FRAMES': '4',
            'SWIFT_VORA_MAX_FRAMES': str(int(args.window * 2)), 'SWIFT_VORA_PAIR_TOKENS': '12',
            'SWIFT_VORA_MIN_PAIR_TOKENS': '4', 'SWIFT_VORA_LOG_FIRST': '2'}


def train_command(args, model: str, dataset: str, out_dir: str) -> List[str]:
    cmd = swift_cmd() + ['sft', '--custom_register_path', 'swift_vora', '--model', model, '--model_type', 'qwen3_vl',
                         '--template', 'video_ora', '--dataset', dataset, '--tuner_type', args.tuner,
                         '--freeze_vit', 'false', '--freeze_aligner', 'false', '--attn_impl', 'sdpa',
                         '--per_device_train_batch_size', str(args.batch), '--gradient_accumulation_steps', '1',
                         '--learning_rate', str(args.lr), '--lr_scheduler_type', 'cosine', '--warmup_ratio', '0.05',
                         '--weight_decay', '0.01', '--split_dataset_ratio', '0', '--eval_strategy', 'no',
                         '--save_strategy', 'steps', '--save_steps', str(max(1, args.max_steps // 4)),
                         '--save_total_limit', '2', '--save_only_model', 'true',
                         '--output_dir', out_dir, '--add_version', 'false', '--check_model', 'false',
                         '--report_to', 'none', '--logging_steps', str(args.logging_steps),
                         '--gradient_checkpointing', 'false', '--dataloader_num_workers', str(args.workers),
                         '--dataset_num_proc', '1', '--max_length', '2048', '--seed', str(args.seed),
                         '--data_seed', str(args.seed)]
    if args.tuner == 'lora':  # every linear of the LLM; the tower and merger then stay frozen (swift's default)
        cmd += ['--target_modules', 'all-linear', '--lora_rank', str(args.lora_rank), '--lora_alpha',
                str(2 * args.lora_rank)]
    if args.workers > 0:
        cmd += ['--dataloader_persistent_workers', 'true', '--dataloader_prefetch_factor', '4']
    cmd += ['--max_steps', str(args.max_steps)]
    if cuda_available():
        cmd += ['--torch_dtype', 'float32', '--bf16', 'true', '--fp16', 'false']  # fp32 weights, bf16 autocast
    else:
        cmd += ['--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false']
    return cmd


def infer_command(args, ckpt: str, dataset: str, result_path: str, base_model: Optional[str] = None) -> List[str]:
    """swift infer on a full checkpoint, or (LoRA: `base_model` given) on the base with the adapter."""
    weights = ['--model', base_model, '--adapters', ckpt] if base_model else ['--model', ckpt]
    cmd = swift_cmd() + ['infer', '--custom_register_path', 'swift_vora', *weights, '--model_type', 'qwen3_vl',
                         '--template', 'video_ora', '--val_dataset', dataset, '--infer_backend', 'transformers',
                         '--max_new_tokens', '48', '--temperature', '0', '--max_batch_size', str(args.infer_batch),
                         '--result_path', result_path, '--torch_dtype', 'float32',
                         '--attn_impl', 'sdpa', '--dataset_num_proc', '1']
    return cmd


def run_env(name: str, env: Dict[str, str], smoke: bool) -> Dict[str, str]:
    """The environment of run `name`: normal_fp8 adds FP8 frozen base weights (emulated casts on the CPU smoke)."""
    if name != 'normal_fp8':
        return env
    return {**env, 'SWIFT_VORA_FP8': 'frozen_base', **({'SWIFT_VORA_FP8_EMULATE': '1'} if smoke else {})}


def fp8_comparison(results: Dict[str, Dict[str, Any]], work: str) -> Optional[Dict[str, Any]]:
    """normal_fp8 against normal: R1@0.5 of both and the largest relative difference of their logged losses."""
    if 'normal_fp8' not in results or 'normal' not in results:
        return None

    def losses(name):
        return [float(r['loss']) for r in read_jsonl(os.path.join(work, name, 'output', 'logging.jsonl'))
                if 'loss' in r]
    fp8, bf16 = losses('normal_fp8'), losses('normal')
    return {'r1_at_0_5_fp8': results['normal_fp8'].get('score', {}).get('r1_at_0_5'),
            'r1_at_0_5_bf16': results['normal'].get('score', {}).get('r1_at_0_5'),
            'loss_max_rel_diff_vs_bf16': loss_max_rel_diff(fp8, bf16),
            'logged_steps_compared': sum(1 for _, b in zip(fp8, bf16) if b)}


def start_train(name, args, model, dataset, work, env):
    import shutil
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)  # no stale checkpoint or log from an earlier run
    out_dir = os.path.join(work, name, 'output')
    log = os.path.join(work, name, 'sft.log')
    cmd = train_command(args, model, dataset, out_dir)
    run_env = dict(env, SWIFT_VORA_ENCODE_LOG=os.path.join(work, name, 'encode.jsonl'))
    return cmd, log, run_logged(cmd, log, run_env)


def wait_soft(proc, deadline_at: Optional[float]) -> Any:
    """Exit code of `proc`, or 'deadline' after killing its process group at `deadline_at` (epoch seconds)."""
    return wait_or_kill(proc, None if deadline_at is None else max(1.0, deadline_at - time.time()), 'deadline')


def find_checkpoint(out_dir: str) -> Optional[str]:
    """The newest complete checkpoint (weights or a LoRA adapter written), or None."""
    ckpts = sorted(glob.glob(os.path.join(out_dir, 'checkpoint-*')),
                   key=lambda p: int(p.rsplit('-', 1)[1]) if p.rsplit('-', 1)[1].isdigit() else -1)
    ckpts = [c for c in ckpts if (os.path.isfile(os.path.join(c, 'config.json'))
                                  or os.path.isfile(os.path.join(c, 'adapter_config.json')))
             and glob.glob(os.path.join(c, '*.safetensors'))]
    return ckpts[-1] if ckpts else None


def train_log_summary(out_dir: str) -> Dict[str, Any]:
    logs = read_jsonl(os.path.join(out_dir, 'logging.jsonl'))
    losses = [(r.get('global_step/max_steps'), r['loss']) for r in logs if 'loss' in r]
    final = next((r for r in reversed(logs) if 'train_runtime' in r), {})

    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return v
    return {'first_loss': num(losses[0][1]) if losses else None, 'last_loss': num(losses[-1][1]) if losses else None,
            'last_token_acc': num(next((r.get('token_acc') for r in reversed(logs) if 'token_acc' in r), None)),
            'steps': losses[-1][0] if losses else None, 'train_runtime_s': num(final.get('train_runtime')),
            'train_samples_per_s': num(final.get('train_samples_per_second'))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--smoke', action='store_true', help='CPU: tiny model, few clips, 2 steps; nothing asserted')
    parser.add_argument('--out', default=os.environ.get('OUT') or None, help='logs + JSON copy (default $OUT)')
    parser.add_argument('--work', default=None)
    parser.add_argument('--results-dir', default=os.path.join(REPO, 'benchmarks', 'results'))
    parser.add_argument('--train-videos', type=int, default=None, help='default 1000 (smoke 4); 2 windows each')
    parser.add_argument('--test-videos', type=int, default=None, help='default 60 (smoke 2)')
    parser.add_argument('--video-seconds', type=int, default=16)
    parser.add_argument('--window', type=float, default=8.0)
    parser.add_argument('--epochs', type=float, default=16, help='default 16: 2000 steps of 16 on 1000 videos')
    parser.add_argument('--max-steps', type=int, default=None, help='overrides --epochs (smoke: 2)')
    parser.add_argument('--batch', type=int, default=None, help='default 16 (smoke 2)')
    parser.add_argument('--lr', type=float, default=1e-3)
    parser.add_argument('--shape', default=None, help="swift_vora.tiny_model.QWEN3_VL_SHAPES key (default 'learn'; "
                                                      "smoke 'tiny')")
    parser.add_argument('--workers', type=int, default=None, help='DataLoader workers per run (default: cores/2 - 1)')
    parser.add_argument('--infer-batch', type=int, default=64)
    parser.add_argument('--logging-steps', type=int, default=None)
    parser.add_argument('--runs', default='normal,shuffled',
                        help='normal, shuffled, and normal_fp8: the normal labels with SWIFT_VORA_FP8=frozen_base '
                             '(--tuner lora; its losses are compared with normal\'s step by step)')
    parser.add_argument('--tuner', choices=('full', 'lora'), default='full',
                        help='full (the default task setting) or lora (what FP8 frozen base weights need)')
    parser.add_argument('--lora-rank', type=int, default=64)
    parser.add_argument('--sequential', action='store_true', help='run the two trainings one after the other')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--deadline', type=float, default=None,
                        help='seconds from start: training still running at deadline - infer_reserve is killed '
                             '(its last periodic checkpoint is evaluated), inference at the deadline')
    parser.add_argument('--infer-reserve', type=float, default=90, help='seconds kept for inference (with --deadline)')
    parser.add_argument('--no-assert', action='store_true', help='write results but exit 0 even below the thresholds')
    parser.add_argument('--allow-cpu', action='store_true', help='full-size run without CUDA (slow; for experiments)')
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run atexit: kill the swift process groups
    smoke = args.smoke
    args.train_videos = args.train_videos or (4 if smoke else 1000)
    args.test_videos = args.test_videos or (2 if smoke else 60)
    args.batch = args.batch or (2 if smoke else 16)
    args.shape = args.shape or ('tiny' if smoke else 'learn')
    args.logging_steps = args.logging_steps or (1 if smoke else 50)
    cores = os.cpu_count() or 2
    if args.workers is None:
        args.workers = 1 if smoke else max(1, cores // 2 - 1)
    windows_per_video = max(1, int(round(args.video_seconds / args.window))) if args.window else 1
    if args.max_steps is None:
        args.max_steps = 2 if smoke else max(
            1, math.ceil(args.epochs * args.train_videos * windows_per_video / args.batch))
    if not smoke and not cuda_available() and not args.allow_cpu:
        raise SystemExit('no CUDA device: run with --smoke on CPU (or --allow-cpu)')
    work = args.work or os.path.join(tempfile.gettempdir(), 'swift_vora_learn_smoke' if smoke else 'swift_vora_learn')
    os.makedirs(work, exist_ok=True)
    out = args.out or work
    runs = [r.strip() for r in args.runs.split(',') if r.strip()]
    t0 = time.time()

    # Data, then the model (in its own process: the driver keeps no CUDA context)
    data = os.path.join(work, 'data')
    size, fps = (128, 96), 4.0
    gen_workers = 1 if smoke else min(16, cores)
    train_rows = make_split(os.path.join(data, 'train'), 'train', args.train_videos, args.video_seconds, fps, size,
                            args.seed + 1, gen_workers)
    test_rows = make_split(os.path.join(data, 'test'), 'test', args.test_videos, args.video_seconds, fps, size,
                           args.seed + 2, gen_workers)
    shuffled_rows = derange(train_rows, args.seed + 3)
    datasets = {'normal': write_jsonl(train_rows, os.path.join(data, 'train.jsonl')),
                'shuffled': write_jsonl(shuffled_rows, os.path.join(data, 'train_shuffled.jsonl'))}
    datasets['normal_fp8'] = datasets['normal']
    unknown = [r for r in runs if r not in datasets]
    if unknown or ('normal_fp8' in runs and args.tuner != 'lora'):
        raise SystemExit(f'--runs {args.runs}: runs are {", ".join(datasets)}; normal_fp8 needs --tuner lora')
    test_path = write_jsonl(test_rows, os.path.join(data, 'test.jsonl'))
    model = os.path.join(work, f'model-{args.shape}')
    build_model(model, args.shape, 'float32', seed=args.seed)
    t_data = time.time() - t0
    print(f'model + data ready in {t_data:.0f} s ({len(train_rows)} train videos, {len(test_rows)} test videos)',
          flush=True)

    env = base_env(budget_env(args))
    deadline_at = None if args.deadline is None else t0 + args.deadline
    infer_reserve = 0 if deadline_at is None else args.infer_reserve
    # Train (both at once unless --sequential), then infer. A failed or stopped run is recorded, not fatal.
    results: Dict[str, Dict[str, Any]] = {}
    t_train0 = time.time()
    procs = []
    for name in runs:
        cmd, log, proc = start_train(name, args, model, datasets[name], work, run_env(name, env, smoke))
        results[name] = {'train_command': cmdline(cmd, budget_env(args)), 'train_log': log}
        procs.append((name, proc, log))
        if args.sequential:
            results[name]['train_exit'] = wait_soft(proc, deadline_at and deadline_at - infer_reserve)
    for name, proc, log in procs:
        if not args.sequential:
            results[name]['train_exit'] = wait_soft(proc, deadline_at and deadline_at - infer_reserve)
        if results[name]['train_exit'] != 0:
            print(f'--- swift sft ({name}) exit {results[name]["train_exit"]}; last lines of {log}:\n{tail(log, 40)}',
                  file=sys.stderr, flush=True)
        _copy(log, out, f'learnability-{name}-sft.log')
    t_train = time.time() - t_train0
    infer_procs = []
    for name in runs:
        out_dir = os.path.join(work, name, 'output')
        ckpt = find_checkpoint(out_dir)
        results[name].update({'checkpoint': ckpt, 'train': train_log_summary(out_dir)})
        if ckpt is None:
            results[name]['error'] = 'no checkpoint written'
            continue
        result_path = os.path.join(work, name, 'infer.jsonl')
        if os.path.exists(result_path):
            os.remove(result_path)
        cmd = infer_command(args, ckpt, test_path, result_path, base_model=model if args.tuner == 'lora' else None)
        log = os.path.join(work, name, 'infer.log')
        results[name].update({'infer_command': cmdline(cmd, budget_env(args)), 'result_path': result_path,
                              'infer_log': log})
        proc = run_logged(cmd, log, env)
        infer_procs.append((name, proc, log))
        if args.sequential:
            results[name]['infer_exit'] = wait_soft(proc, deadline_at)
    for name, proc, log in infer_procs:
        if not args.sequential:
            results[name]['infer_exit'] = wait_soft(proc, deadline_at)
        _copy(log, out, f'learnability-{name}-infer.log')
        if results[name]['infer_exit'] != 0:
            print(f'--- swift infer ({name}) exit {results[name]["infer_exit"]}; last lines of {log}:\n{tail(log, 40)}',
                  file=sys.stderr, flush=True)
            results[name]['error'] = f'swift infer exit {results[name]["infer_exit"]}'
            continue
        results[name]['score'] = score(results[name]['result_path'], args.window)

    enc = read_jsonl(os.path.join(work, runs[0], 'encode.jsonl'))
    encode_summary = {'frames': sorted({r.get('frames_from_tensors') for r in enc}),
                      'video_tokens': sorted({r.get('video_tokens') for r in enc}),
                      'total_tokens': sorted({r.get('total_tokens') for r in enc}),
                      'samples_logged': len(enc)}
    chance = chance_levels(windowed_answers(train_rows, args.window), windowed_answers(test_rows, args.window))
    r1 = results.get('normal', {}).get('score', {}).get('r1_at_0_5')
    r1_shuf = results.get('shuffled', {}).get('score', {}).get('r1_at_0_5')
    chance_ceiling = max(v for v in (chance['chance_r1_at_0_5'], chance['majority_r1_at_0_5'], 0.0) if v is not None)
    passed = None
    if not smoke and r1 is not None and r1_shuf is not None:
        passed = r1 >= R1_THRESHOLD and r1_shuf <= chance_ceiling + SHUFFLED_MARGIN
    payload = {
        'benchmark': 'learnability',
        'date': _dt.datetime.now().isoformat(timespec='seconds'),
        'smoke': smoke,
        'gpu': hardware().get('gpu'),
        'hardware': hardware(),
        'command': 'python benchmarks/learnability.py ' + ' '.join(argv if argv is not None else sys.argv[1:]),
        'r1_at_0_5': r1,
        'shuffled_r1_at_0_5': r1_shuf,
        **chance,
        'pass': passed,
        'criteria': f'r1_at_0_5 >= {R1_THRESHOLD} and shuffled_r1_at_0_5 <= max(chance, majority) + {SHUFFLED_MARGIN}; '
                    'R1@0.5 over clips with a non-empty ground truth (first predicted window IoU >= 0.5 with any '
                    'ground-truth window); empty-ground-truth clips reported as empty_accuracy',
        'task': {'video_seconds': args.video_seconds, 'video_fps': fps, 'size': list(size),
                 'window_seconds': args.window,
                 'sampled_fps': 2, 'events': '1-3 per video, 2-4 s, 1 s grid, >= 1 s apart',
                 'train_videos': len(train_rows), 'test_videos': len(test_rows),
                 'train_windows': len(windowed_answers(train_rows, args.window)),
                 'budget_env': budget_env(args)},
        'model': {'shape': args.shape, 'dir': model, 'tuner': args.tuner, 'epochs': args.epochs,
                  'max_steps': args.max_steps, 'batch': args.batch, 'lr': args.lr},
        'encode_log': encode_summary,
        'fp8': fp8_comparison(results, work),
        'runs': results,
        'seconds': {'data_and_model': round(t_data, 1), 'training': round(t_train, 1),
                    'total': round(time.time() - t0, 1)},
    }
    path = write_results(payload, args.results_dir if not smoke else os.path.join(work, 'results'), 'learnability',
                         out)
    print(json.dumps({k: payload[k] for k in ('gpu', 'r1_at_0_5', 'shuffled_r1_at_0_5', 'chance_r1_at_0_5',
                                               'majority_r1_at_0_5', 'pass', 'seconds')}, indent=1))
    for name in runs:
        s = results[name].get('score', {})
        print(f'{name}: R1@0.5 {s.get("r1_at_0_5")} (all {s.get("r1_at_0_5_all")}, '
              f'empty acc {s.get("empty_accuracy")}, '
              f'parse failures {s.get("parse_failures")}/{s.get("clips")}); train {results[name].get("train")}')
    print(f'wrote {path}')
    if passed is False and not args.no_assert:
        return 1
    if any('error' in r for r in results.values()):
        return 1
    return 0


def _copy(src: str, out: Optional[str], name: str) -> None:
    import shutil
    if out and os.path.isfile(src):
        os.makedirs(out, exist_ok=True)
        dst = os.path.join(out, name)
        if os.path.abspath(dst) != os.path.abspath(src):
            shutil.copy(src, dst)


if __name__ == '__main__':
    sys.exit(main())
