"""`swift-vora demo`: the whole Video-ORA path on CPU, offline, in a few minutes.

Builds a tiny random Qwen3-VL (real checkpoint layout, special tokens on the real Qwen ids), writes
synthetic videos whose answer is visible (a red square inside the intervals), validates and windows the
annotations, trains a LoRA adapter with `swift sft --custom_register_path swift_vora`, runs `swift infer`
with the adapter on held-out clips, parses the answers and prints a short report. The model is random and
trains for seconds: the demo shows that every stage runs and is accounted for, not that it learns
(benchmarks/learnability.py shows that, on a GPU).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from typing import Dict, List

from .budget import VideoBudget
from .cli_values import positive_int
from .offline import OFFLINE_ENV, swift_argv

DEMO_BUDGET = VideoBudget(fps=1.0, min_frames=4, max_frames=8, pair_tokens=16, min_pair_tokens=4)
DEMO_WINDOW = {'SWIFT_VORA_WINDOW': '8', 'SWIFT_VORA_STRIDE': '8', 'SWIFT_VORA_MIN_EVENT': '0.5'}


def register_commands(subparsers) -> None:
    p = subparsers.add_parser('demo', help='tiny model + synthetic videos: build, train, infer, report (CPU)')
    p.add_argument('--out', default='swift_vora_demo', help='working directory (default: ./swift_vora_demo)')
    p.add_argument('--train-videos', type=positive_int(1000), default=6)
    p.add_argument('--eval-videos', type=positive_int(1000), default=2)
    p.add_argument('--epochs', type=positive_int(1000), default=2)
    p.set_defaults(handler=run_demo)


def _run(argv: List[str], env: Dict[str, str], log_path: str) -> None:
    print(f'$ {" ".join(argv)}\n  (log: {log_path})', flush=True)
    with open(log_path, 'w') as log:
        result = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f'command failed with exit code {result.returncode}; last lines of {log_path}:\n{tail}')


def _latest_checkpoint(output_dir: str) -> str:
    found = sorted(glob.glob(os.path.join(output_dir, 'v*', 'checkpoint-*')), key=os.path.getmtime)
    if not found:
        raise SystemExit(f'no checkpoint under {output_dir}')
    return found[-1]


def run_demo(args) -> int:
    from .data.annotations import load_annotations
    from .intervals import parse_answer
    from .synthetic import make_dataset
    from .tiny_model import build_tiny_qwen3_vl

    from .outputs import check_output_dir

    started = time.time()
    out = os.path.abspath(check_output_dir(args.out, what='--out'))
    os.makedirs(out, exist_ok=True)
    model_dir = os.path.join(out, 'model')
    if not os.path.exists(os.path.join(model_dir, 'model.safetensors')):
        print(f'[1/5] building a tiny random Qwen3-VL in {model_dir}', flush=True)
        build_tiny_qwen3_vl(model_dir)
    else:
        print(f'[1/5] reusing the tiny model in {model_dir}', flush=True)

    print('[2/5] writing synthetic videos (a red square marks the moments to keep)', flush=True)
    train_ann = make_dataset(os.path.join(out, 'videos_train'), args.train_videos, duration=16.0, seed=1)
    eval_ann = make_dataset(os.path.join(out, 'videos_eval'), args.eval_videos, duration=16.0, seed=2)
    for path in (train_ann, eval_ann):
        report = load_annotations(path)
        print(f'      {path}: {report.total} lines, {len(report.rows)} valid, {len(report.invalid)} invalid')
        if report.invalid:
            raise SystemExit(f'synthetic annotations invalid: {report.invalid}')

    env = {**os.environ, **OFFLINE_ENV, 'TOKENIZERS_PARALLELISM': 'false', **DEMO_BUDGET.to_env(), **DEMO_WINDOW,
           'SWIFT_VORA_ENCODE_LOG': os.path.join(out, 'encode_log.jsonl')}
    if os.path.exists(env['SWIFT_VORA_ENCODE_LOG']):
        os.remove(env['SWIFT_VORA_ENCODE_LOG'])
    train_dir = os.path.join(out, 'train')
    print('[3/5] training LoRA with swift sft --custom_register_path swift_vora', flush=True)
    _run(swift_argv() + [
        'sft', '--custom_register_path', 'swift_vora', '--model', model_dir, '--model_type', 'qwen3_vl',
        '--template', 'video_ora', '--dataset', train_ann, '--tuner_type', 'lora', '--target_modules', 'all-linear',
        '--lora_rank', '8', '--learning_rate', '1e-3', '--num_train_epochs', str(args.epochs),
        '--per_device_train_batch_size', '1', '--gradient_accumulation_steps', '2', '--output_dir', train_dir,
        '--check_model', 'false', '--fp16', 'false', '--bf16', 'false', '--torch_dtype', 'float32',
        '--dataloader_num_workers', '0', '--logging_steps', '1', '--save_strategy', 'epoch', '--report_to', 'none',
        '--split_dataset_ratio', '0', '--max_length', '1024', '--seed', '0'
    ], env, os.path.join(out, 'train.log'))
    checkpoint = _latest_checkpoint(train_dir)

    print('[4/5] inference with the adapter on held-out clips (swift infer)', flush=True)
    result_path = os.path.join(out, 'predictions.jsonl')
    if os.path.exists(result_path):
        os.remove(result_path)
    _run(swift_argv() + [
        'infer', '--adapters', checkpoint, '--val_dataset', eval_ann, '--infer_backend', 'transformers',
        '--max_new_tokens', '24', '--temperature', '0', '--result_path', result_path
    ], env, os.path.join(out, 'infer.log'))

    print('[5/5] report', flush=True)
    encodes = [json.loads(line) for line in open(env['SWIFT_VORA_ENCODE_LOG'])]
    train_encodes = [e for e in encodes if e['mode'] == 'train']
    losses = []
    for log_file in glob.glob(os.path.join(os.path.dirname(checkpoint), 'logging.jsonl')):
        records = [json.loads(line) for line in open(log_file)]
        losses += [r['loss'] for r in records if 'loss' in r]  # the last record is the run summary
    predictions = [json.loads(line) for line in open(result_path)]
    parsed = [parse_answer(p['response']) for p in predictions]
    tokens = [e['total_tokens'] for e in train_encodes] or [0]
    print(f'  training samples encoded : {len(train_encodes)} (windows of {DEMO_WINDOW["SWIFT_VORA_WINDOW"]} s)')
    print(f'  tokens per sample        : {min(tokens)}-{max(tokens)} (video {train_encodes[0]["video_tokens"] if train_encodes else 0}, '
          f'frames {train_encodes[0]["frames_from_tensors"] if train_encodes else 0}; read from the tensors)')
    print(f'  loss                     : first {losses[0] if losses else "n/a"} -> last {losses[-1] if losses else "n/a"}')
    print(f'  adapter                  : {checkpoint}')
    print(f'  predictions              : {len(predictions)} clips, {sum(1 for p in parsed if not p.ok)} parse failures '
          f'-> {result_path}')
    for p, r in list(zip(predictions, parsed))[:3]:
        print(f'    labels {p.get("labels")!s:<28} response {p["response"][:40]!r:<44} parsed {r.windows}')
    print(f'  wall time                : {time.time() - started:.0f} s')
    return 0
