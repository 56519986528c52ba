"""`swift-vora demo`: the whole Video-ORA path on CPU, offline, in a few minutes.

Builds a tiny random Qwen3-VL (real checkpoint layout, special tokens on the real Qwen ids), writes
synthetic videos whose answer is visible (a red square inside the intervals), validates and windows the
annotations, trains a LoRA adapter with `swift sft --custom_register_path swift_vora`, predicts the held-out
videos as new, unlabelled ones (`swift-vora predict`: the checkpoint's windows, `swift infer`), scores those
predictions with `swift-vora eval`'s evaluator (report.md, overview.png and timelines under OUT/report/), and cuts
them (`swift-vora cut`): an OpenTimelineIO timeline and a CMX 3600 EDL under OUT/cut/, and the kept clips rendered
into OUT/highlights.mp4. Every clip, trained on or held out, is one 8 s window with at least one event, so every
answer has something to find; the held-out videos are 25 fps, a rate EDL timecode has.

What the scores mean: R1@0.5 (the first predicted window overlaps a true one with IoU >= 0.5) and mean IoU are
printed next to the same figures for a shuffled-answer control: the same answers scored against the true
windows of *other* held-out clips. An adapter that learned to see the square beats its control; answers that
ignore the video score the same on both. The demo says which it observed, and never claims learning it did not
measure: a random model this small, trained for a few minutes on two cores, is expected to learn the answer
format, not the task; benchmarks/learnability.py trains a larger model through the same pipeline on a GPU until
it does (its result is in docs/benchmarks.md).
"""
from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
import time
from typing import Dict, List

from .budget import VideoBudget
from .cli_values import OUTPUT_DIR_FLAGS, positive_int
from .offline import OFFLINE_ENV, swift_argv

DEMO_BUDGET = VideoBudget(fps=1.0, min_frames=4, max_frames=8, pair_tokens=16, min_pair_tokens=4)
DEMO_WINDOW = {'SWIFT_VORA_WINDOW': '8', 'SWIFT_VORA_STRIDE': '8', 'SWIFT_VORA_MIN_EVENT': '0.5'}
CLIP_SECONDS = 8.0  # videos one window long, each with an event: every clip trained on and scored has an answer
HELD_OUT_FPS = 25.0  # the held-out videos are cut into an EDL, whose SMPTE timecode has no 4 fps
LEARNED_MARGIN = 0.25  # R1@0.5 above the shuffled control by this much (and no parse failure) counts as learned


def register_commands(subparsers) -> None:
    p = subparsers.add_parser('demo', help='tiny model + synthetic videos: build, train, predict, report, cut (CPU)')
    p.add_argument(*OUTPUT_DIR_FLAGS, dest='out', default='swift_vora_demo', metavar='DIR',
                   help='working directory (default: ./swift_vora_demo; ms-swift\'s name; --out-dir and --out are the '
                        'older ones)')
    p.add_argument('--train-videos', type=positive_int(1000), default=24,
                   help='training clips, each with at least one event')
    p.add_argument('--eval-videos', type=positive_int(1000), default=8,
                   help='held-out clips, each with at least one event')
    p.add_argument('--epochs', type=positive_int(1000), default=3)
    p.set_defaults(handler=run_demo)


def _run(argv: List[str], env: Dict[str, str], log_path: str, label: str, status=None) -> None:
    """Run a step's command with its output in `log_path`, a progress line every 10 s (the step is otherwise
    silent for minutes on two cores)."""
    from .progress import wait_with_heartbeat
    print(f'$ {" ".join(argv)}\n  (log: {log_path})', flush=True)
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        code = wait_with_heartbeat(proc, label, status, stream=sys.stdout)
    if code != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f'command failed with exit code {code}; last lines of {log_path}:\n{tail}')


def _latest_checkpoint(output_dir: str) -> str:
    found = sorted(glob.glob(os.path.join(output_dir, 'v*', 'checkpoint-*')), key=os.path.getmtime)
    if not found:
        raise SystemExit(f'no checkpoint under {output_dir}')
    return found[-1]


def derange_windows(rows: List[Dict], seed: int = 0) -> List[Dict]:
    """The same rows with `windows` moved to other rows (no row keeps its own): the shuffled-answer control."""
    if len(rows) < 2:
        return [dict(r) for r in rows]
    rng = random.Random(seed)
    order = list(range(len(rows)))
    while any(i == j for i, j in enumerate(order)):
        rng.shuffle(order)
    return [{**row, 'windows': rows[j]['windows']} for row, j in zip(rows, order)]


def r1_at(result, threshold: float = 0.5) -> float:
    """Fraction of videos whose first predicted window has IoU >= threshold with a true window (0 if none)."""
    from .intervals import iou
    hits = 0
    for key, ann in result.annotations.items():
        pred = result.predictions.get(key)
        first = pred.windows[0][:2] if pred and pred.windows else None
        hits += bool(first and any(iou(first, w) >= threshold for w in ann.windows))
    return hits / max(1, len(result.annotations))


def score_against_control(annotations: str, predictions: str, control_path: str):
    """(real EvalResult, control EvalResult): the answers scored against their clips and against others'."""
    from .eval.evaluate import evaluate
    from .outputs import write_text_atomic
    with open(annotations) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    write_text_atomic(control_path, ''.join(json.dumps(row) + '\n' for row in derange_windows(rows)),
                      what='control annotations')
    real, _ = evaluate(annotations, predictions)
    control, _ = evaluate(control_path, predictions)
    return real, control


def run_demo(args) -> int:
    from .eval.report import write_outputs
    from .outputs import check_output_dir
    from .progress import swift_training_status

    started = time.time()
    out = os.path.abspath(check_output_dir(args.out, what='--output_dir'))
    os.makedirs(out, exist_ok=True)
    model_dir, train_ann, eval_ann = _inputs(out, args)
    env = {**os.environ, **OFFLINE_ENV, 'TOKENIZERS_PARALLELISM': 'false', **DEMO_BUDGET.to_env(), **DEMO_WINDOW,
           'SWIFT_VORA_ENCODE_LOG': os.path.join(out, 'encode_log.jsonl')}
    if os.path.exists(env['SWIFT_VORA_ENCODE_LOG']):
        os.remove(env['SWIFT_VORA_ENCODE_LOG'])
    train_dir = os.path.join(out, 'train')
    print('[3/6] training LoRA with swift sft --custom_register_path swift_vora', flush=True)
    _run(swift_argv() + [
        'sft', '--custom_register_path', 'swift_vora', '--model', model_dir, '--model_type', 'qwen3_vl',
        '--template', 'video_ora', '--dataset', train_ann, '--tuner_type', 'lora', '--target_modules', 'all-linear',
        # a high rate: the random model has a few dozen steps to learn the answer format
        '--lora_rank', '16', '--lora_alpha', '32', '--learning_rate', '5e-3', '--num_train_epochs', str(args.epochs),
        '--per_device_train_batch_size', '1', '--gradient_accumulation_steps', '1', '--output_dir', train_dir,
        '--check_model', 'false', '--fp16', 'false', '--bf16', 'false', '--torch_dtype', 'float32',
        '--dataloader_num_workers', '0', '--logging_steps', '1', '--save_strategy', 'epoch', '--report_to', 'none',
        '--split_dataset_ratio', '0', '--max_length', '1024', '--seed', '0'
    ], env, os.path.join(out, 'train.log'), '      training', swift_training_status(train_dir))
    checkpoint = _latest_checkpoint(train_dir)

    videos = os.path.dirname(eval_ann)
    predictions = os.path.join(out, 'predictions.jsonl')
    print('[4/6] predicting the held-out videos as new ones (swift-vora predict: the checkpoint\'s windows, swift '
          f'infer)\n$ swift-vora predict {videos} --adapters {checkpoint} --output {predictions}', flush=True)
    from .predict.run import predict
    predict([videos], predictions, adapters=checkpoint, overwrite=True, backend='transformers', max_new_tokens=24,
            environ=env)  # env: the encode log; its budget and windows are the checkpoint's

    print('[5/6] report (swift-vora eval\'s evaluator on those predictions)', flush=True)
    real, control = score_against_control(eval_ann, predictions, os.path.join(out, 'videos_eval',
                                                                               'annotations_shuffled.jsonl'))
    written = write_outputs(real, os.path.join(out, 'report'), inputs={'annotations': eval_ann,
                                                                       'predictions': predictions})
    _print_summary(real, control, written, env['SWIFT_VORA_ENCODE_LOG'], checkpoint, predictions)
    _cut(out, predictions)
    print(f'  wall time                : {time.time() - started:.0f} s')
    return 0


def _cut(out: str, predictions: str) -> None:
    """Step 6: the predictions as an editor gets them: .otio + EDL timelines and the kept clips rendered."""
    from .edit.cli import print_result
    from .edit.cut import cut
    from .errors import InvalidInput
    highlights = os.path.join(out, 'highlights.mp4')
    print(f'[6/6] cut (swift-vora cut: OpenTimelineIO\'s adapters, PyAV)\n$ swift-vora cut {predictions} --to otio '
          f'--to edl --output_dir {os.path.join(out, "cut")} --render {highlights}', flush=True)
    try:
        result = cut(predictions, formats=['otio', 'edl'], output_dir=os.path.join(out, 'cut'), render_to=highlights)
    except InvalidInput as exc:  # a model that kept nothing: said, not a failure of the demo
        print(f'  {exc}', flush=True)
        return
    print_result(result)


def _inputs(out: str, args):
    """Steps 1-2: the tiny model (built once, then reused) and the synthetic clips with their annotations, checked
    as `data check` would."""
    from .data.annotations import load_annotations
    from .synthetic import make_dataset
    from .tiny_model import build_tiny_qwen3_vl
    model_dir = os.path.join(out, 'model')
    if not os.path.exists(os.path.join(model_dir, 'model.safetensors')):
        print(f'[1/6] building a tiny random Qwen3-VL in {model_dir}', flush=True)
        build_tiny_qwen3_vl(model_dir)
    else:
        print(f'[1/6] reusing the tiny model in {model_dir}', flush=True)

    print('[2/6] writing synthetic videos (a red square marks the moments to keep)', flush=True)
    train_ann = make_dataset(os.path.join(out, 'videos_train'), args.train_videos, duration=CLIP_SECONDS, seed=1,
                             min_events=1)
    eval_ann = make_dataset(os.path.join(out, 'videos_eval'), args.eval_videos, duration=CLIP_SECONDS, seed=2,
                            min_events=1, fps=HELD_OUT_FPS)
    for path in (train_ann, eval_ann):
        report = load_annotations(path)
        print(f'      {path}: {report.total} lines, {len(report.rows)} valid, {len(report.invalid)} invalid')
        if report.invalid:
            raise SystemExit(f'synthetic annotations invalid: {report.invalid}')
    return model_dir, train_ann, eval_ann


def _print_summary(real, control, written, encode_log: str, checkpoint: str, predictions: str) -> None:
    """What the run shows: the encoded samples, the loss, the held-out scores against the shuffled-answer control,
    and what that means for a tiny model on a CPU."""
    encodes = [json.loads(line) for line in open(encode_log)]
    train_encodes = [e for e in encodes if e['mode'] == 'train']
    losses = []
    for log_file in glob.glob(os.path.join(os.path.dirname(checkpoint), 'logging.jsonl')):
        records = [json.loads(line) for line in open(log_file)]
        losses += [r['loss'] for r in records if 'loss' in r]  # the last record is the run summary
    tokens = [e['total_tokens'] for e in train_encodes] or [0]
    m, c = real.metrics, control.metrics
    r1, r1_control = r1_at(real), r1_at(control)
    print(f'  training samples encoded : {len(train_encodes)} (windows of {DEMO_WINDOW["SWIFT_VORA_WINDOW"]} s)')
    print(f'  tokens per sample        : {min(tokens)}-{max(tokens)} '
          f'(video {train_encodes[0]["video_tokens"] if train_encodes else 0}, '
          f'frames {train_encodes[0]["frames_from_tensors"] if train_encodes else 0}; read from the tensors)')
    print(f'  loss                     : first {losses[0] if losses else "n/a"} '
          f'-> last {losses[-1] if losses else "n/a"}')
    print(f'  adapter                  : {checkpoint}')
    print(f'  held-out clips           : {m["queries"]}, each {CLIP_SECONDS:g} s with at least one event; '
          f'{m["parse_failures"]} parse failures, {m["empty_predictions"]} empty answers')
    print(f'  R1@0.5                   : {r1:.2f}   (shuffled-answer control {r1_control:.2f})')
    print(f'  mean IoU                 : {m["mIoU"] / 100:.2f}   (shuffled-answer control {c["mIoU"] / 100:.2f})')
    lines = [json.loads(line) for line in open(predictions)]
    for row in lines[:3]:
        truth = real.annotations[row['id']].windows
        answer = ' | '.join(clip['response'] for clip in row['clips'])
        print(f'    truth {json.dumps([list(w) for w in truth]):<28} answer {answer[:40]!r}')
    print(f'  report                   : {written["report"]} (overview: {written["overview"]})')
    answers = [clip['response'].strip() for row in lines for clip in row['clips']]
    distinct = len(set(answers))
    print(f'  distinct answers         : {distinct} for {len(answers)} clips')
    learned = m['parse_failures'] == 0 and r1 >= r1_control + LEARNED_MARGIN
    if learned:
        print(f'  verdict                  : the answers come from the frames: R1@0.5 {r1:.2f} '
              f'against {r1_control:.2f} for the same answers scored on other clips')
    else:
        what = ('every answer parsed: the answer format is learned' if m['parse_failures'] == 0 else
                f'{m["parse_failures"]} of {m["queries"]} answers did not parse')
        print(f'  verdict                  : {what}; no evidence that the answers come from the frames (R1@0.5 '
              f'{r1:.2f} against {r1_control:.2f} on other clips' +
              (', one answer for every clip' if distinct == 1 else '') + '). A tiny random model trained for a minute '
              'on a CPU is not expected to see the square: this run shows that every stage runs and is accounted for. '
              'benchmarks/learnability.py trains a larger model through the same pipeline on a GPU, next to a '
              'shuffled-label control, until it does (docs/benchmarks.md has its result).')
