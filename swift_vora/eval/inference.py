"""Inference through ms-swift's own engine over the windowed dataset: `swift-vora eval --model/--adapters` and
`swift-vora predict` run it the same way.

`swift infer --val_dataset ANNOTATIONS` loads the annotation file as the `video_ora` dataset (the same
windows, budget and prompt as training) and writes one result row per window. Each row is turned into a
prediction row of docs/eval.md: `id` = the source video's id, `clip_start`/`clip_end` = the window in
source time, `response` = the model's text, so that `evaluate` maps the window-relative answer back to
source time and merges overlapping windows. vLLM is used when it is installed, else transformers.

`prepare` (the environment with the checkpoint's trained budget, the answer length) and `swift_infer` (the
child process, its progress, its result rows) are the shared path; `run_inference` is eval's use of them, and
swift_vora/predict/ hands them an annotation file of unlabelled videos.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..offline import OFFLINE_ENV, swift_argv
from ..progress import HEARTBEAT_SECONDS


class InferenceError(RuntimeError):
    """`swift infer` failed; carries the tail of its log."""


def default_backend() -> str:
    return 'vllm' if importlib.util.find_spec('vllm') is not None else 'transformers'


def swift_infer_argv(annotations: str, result_path: str, model: Optional[str], adapters: Optional[str],
                     backend: str, max_new_tokens: int, model_type: Optional[str] = None) -> List[str]:
    argv = swift_argv() + ['infer', '--val_dataset', annotations, '--result_path', result_path, '--infer_backend',
                           backend, '--max_new_tokens', str(max_new_tokens), '--temperature', '0']
    if adapters:
        argv += ['--adapters', adapters]  # the checkpoint's args.json brings model, template and plugin
    if model:
        argv += ['--model', model]
    if not adapters:
        argv += ['--custom_register_path', 'swift_vora', '--template', 'video_ora']
    if model_type:
        argv += ['--model_type', model_type]
    return argv


def results_to_predictions(rows: Iterable[Dict]) -> List[Dict]:
    """swift infer result rows -> prediction rows (id, clip_start, clip_end, response)."""
    predictions = []
    for row in rows:
        kwargs = row.get('chat_template_kwargs') or {}
        source_id = kwargs.get('source_id')
        if source_id is None and kwargs.get('sample_id'):
            source_id = str(kwargs['sample_id']).rsplit('@', 1)[0]
        predictions.append({'id': source_id, 'clip_start': kwargs.get('video_start', 0.0),
                            'clip_end': kwargs.get('video_end'), 'response': row.get('response', ''),
                            'sample_id': kwargs.get('sample_id')})
    return predictions


def count_windows(annotations: str, environ: Optional[Dict[str, str]] = None) -> Optional[int]:
    """How many clips `swift infer` will answer: the annotation file windowed as the video_ora dataset does (same
    window settings from `environ`, default this process's); None when it cannot be read (swift infer will say
    why)."""
    from .. import switches
    from ..dataset import count_samples, window_config_from_env
    return count_samples(annotations, window_config_from_env(environ),
                         video_root=switches.read('SWIFT_VORA_VIDEO_ROOT', environ) or None)


def _lines(path: str) -> int:
    try:
        with open(path, 'rb') as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


_LOGGED_ROWS = re.compile(r'val_dataset: Dataset\(\{.*?num_rows: (\d+)', re.S)


def _logged_total(log_path: str, total: Optional[int]) -> Tuple[bool, Optional[int]]:
    try:
        with open(log_path, encoding='utf-8', errors='replace') as f:
            found = _LOGGED_ROWS.search(f.read())
    except OSError:
        return False, total
    return (True, int(found.group(1))) if found else (False, total)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


def wait_with_progress(proc, log_path: str, result_path: str, total: Optional[int], stream=None,
                       interval: float = 2.0, label: str = 'swift-vora eval',
                       on_progress: Optional[Callable[[int], Optional[str]]] = None) -> int:
    """Wait for `swift infer`, printing clips done / total, the elapsed time and an estimate of the time left
    (from the pace since the first answers arrived, so model loading does not skew it) whenever the result file
    grows, and at least every HEARTBEAT_SECONDS while it does not. `on_progress(clips done)` runs whenever the
    count moves (predict keeps the videos already answered there); its text, if any, ends the line. Returns the
    exit code."""
    stream = stream or sys.stderr
    start = last_line = time.monotonic()
    first_at, first_done, shown, confirmed = None, 0, -1, False
    while True:
        code = proc.poll()
        if not confirmed:  # ms-swift logs the dataset it will answer; its size is the one that counts
            confirmed, total = _logged_total(log_path, total)
        done = _lines(result_path)
        # a line when the count moves, and at least every HEARTBEAT_SECONDS while it does not (model loading)
        now = time.monotonic()
        if done != shown or now - last_line >= HEARTBEAT_SECONDS:
            extra = on_progress(done) if on_progress is not None and done != shown else None
            last_line = now
            line = (f'{label}: inference {done}/{total if total else "?"} clips, '
                    f'{_duration(now - start)} elapsed')
            if done == 0:
                line += ' (loading the model and the clips)'
            elif first_at is None:
                first_at, first_done = now, done
            elif total and done > first_done:
                rate = (done - first_done) / (now - first_at)
                line += f', about {_duration(max(0, total - done) / rate)} left'
            if extra:
                line += f'; {extra}'
            print(line, file=stream, flush=True)
            shown = done
        if code is not None:
            return code
        time.sleep(interval)


DEFAULT_MAX_NEW_TOKENS = 64  # without a recorded answer length (a checkpoint from before swift_vora_budget.json)


def use_trained_budget(model: Optional[str], adapters: Optional[str], max_new_tokens: Optional[int],
                       environ: Dict[str, str], stream=None, label: str = 'swift-vora eval') -> int:
    """The checkpoint's trained video budget into `environ`, the environment `swift infer` is started with (and the
    windows are counted with; values the caller set there win, with a warning naming both), and the max_new_tokens
    to use: the caller's, else the checkpoint's, else DEFAULT_MAX_NEW_TOKENS. This process's own environment is left
    as it was: a second checkpoint evaluated from the same process gets its own budget, not the first one's."""
    from .. import trained_budget
    stream = stream or sys.stderr
    path = trained_budget.find(adapters, model)
    if path is None:
        print(f'{label}: the checkpoint records no video budget (swift_vora_budget.json): the environment\'s '
              'SWIFT_VORA_* values (or the defaults) are used; they must be the ones it was trained with',
              file=stream, flush=True)
        return max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    done = trained_budget.apply_to_environment(path, environ, warn=lambda msg: print(msg, file=stream, flush=True))
    print(f'{label}: video budget from the checkpoint ({path}): '
          f'{trained_budget.describe({**done["used"], **{k: v["given"] for k, v in done["overridden"].items()}})}',
          file=stream, flush=True)
    return max_new_tokens or done['max_new_tokens'] or DEFAULT_MAX_NEW_TOKENS


def prepare(model: Optional[str], adapters: Optional[str], max_new_tokens: Optional[int] = None,
            environ: Optional[Dict[str, str]] = None, label: str = 'swift-vora eval') -> Tuple[Dict[str, str], int]:
    """(the environment `swift infer` starts with, max_new_tokens): offline, with the checkpoint's trained video
    budget and windows unless the caller set others (in `environ`, default this process's environment, which is
    read, never changed)."""
    if not model and not adapters:
        raise ValueError('inference needs --model or --adapters')
    environ = {**(os.environ if environ is None else environ), **OFFLINE_ENV}
    return environ, use_trained_budget(model, adapters, max_new_tokens, environ, label=label)


def read_results(result_path: str) -> List[Dict]:
    """The result rows `swift infer` has written so far: complete lines only (it may be writing the next one)."""
    rows = []
    try:
        with open(result_path, encoding='utf-8') as f:
            for line in f:
                if line.endswith('\n') and line.strip():
                    rows.append(json.loads(line))
    except FileNotFoundError:
        pass
    return rows


def swift_infer(annotations: str, result_path: str, log_path: str, environ: Dict[str, str], max_new_tokens: int,
                model: Optional[str] = None, adapters: Optional[str] = None, backend: Optional[str] = None,
                model_type: Optional[str] = None, label: str = 'swift-vora eval',
                on_progress: Optional[Callable[[int], Optional[str]]] = None,
                total: Optional[int] = None) -> List[Dict]:
    """Run `swift infer` over `annotations` (the video_ora dataset: windows, budget and prompt from `environ`, see
    `prepare`) with progress on stderr, its log in `log_path`, its rows in `result_path`; return the rows. `total`:
    the clips it will answer, when the caller counted them (else the file is windowed here). Raises InferenceError
    with the log's tail when it fails; stops the child when this process stops waiting."""
    if os.path.exists(result_path):
        os.remove(result_path)
    argv = swift_infer_argv(os.path.abspath(annotations), result_path, model, adapters,
                            backend or default_backend(), max_new_tokens, model_type)
    total = count_windows(annotations, environ) if total is None else total
    if total:  # results are written every `write_batch_size` clips: about 50 progress steps, at least 1 clip each
        argv += ['--write_batch_size', str(max(1, math.ceil(total / 50)))]
    print(f'{label}: $ {" ".join(argv)}\n  (log: {log_path})', file=sys.stderr, flush=True)
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(argv, env=environ, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = wait_with_progress(proc, log_path, result_path, total, label=label, on_progress=on_progress)
        except BaseException:  # our side failed (a full disk, ^C, SIGTERM): the child must not run on unowned
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if code != 0:
        with open(log_path) as f:
            raise InferenceError(f'swift infer exited with {code}; last lines of {log_path}:\n{f.read()[-3000:]}')
    return read_results(result_path)


def run_inference(annotations: str, out_path: str, model: Optional[str] = None, adapters: Optional[str] = None,
                  backend: Optional[str] = None, max_new_tokens: Optional[int] = None, model_type: Optional[str] = None,
                  log_path: Optional[str] = None, environ: Optional[Dict[str, str]] = None) -> str:
    """Run `swift infer` and write prediction rows to `out_path` (atomically, never over `annotations`);
    return it. The checkpoint's trained video budget and answer length are used unless the caller set others
    (in `environ`, default this process's environment, which is read, never changed)."""
    from ..outputs import check_output_file, write_text_atomic
    environ, max_new_tokens = prepare(model, adapters, max_new_tokens, environ)
    out_path = os.path.abspath(check_output_file(out_path, [annotations], what='--predictions'))
    os.makedirs(os.path.dirname(out_path), exist_ok=True)  # --predictions may name a folder not made yet
    result_path = check_output_file(out_path + '.swift_infer.jsonl', [annotations], what='swift infer results')
    log_path = check_output_file(log_path or out_path + '.infer.log', [annotations], what='inference log')
    rows = swift_infer(annotations, result_path, log_path, environ, max_new_tokens, model=model, adapters=adapters,
                       backend=backend, model_type=model_type)
    write_text_atomic(out_path, ''.join(json.dumps(prediction) + '\n' for prediction in results_to_predictions(rows)),
                      [annotations], what='--predictions')
    return out_path
