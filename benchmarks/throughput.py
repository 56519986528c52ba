"""Training throughput on video: plain `swift sft` against the swift-vora path, same model, clips and tokens.

    python benchmarks/throughput.py                 # on the GPU machine (after scripts/gpu/setup_env.sh)
    python benchmarks/throughput.py --smoke         # CPU: tiny model, 2 clips, a few steps (tests the script)

What runs (each variant is one real `swift sft` process; nothing is timed in-process by hand):
- `baseline`: gpu-machine.md's measured baseline. Random-weight Qwen3-VL with the 2B shape, synthetic 32 s
  clips (640x360, 8 fps, mp4v), `FPS=2 FPS_MAX_FRAMES=64 VIDEO_MAX_TOKEN_NUM=196 VIDEO_MIN_TOKEN_NUM=128`
  (64 frames, 32 groups x 180 tokens), `--tuner_type lora --target_modules all-linear --torch_dtype bfloat16
  --gradient_checkpointing true --attn_impl sdpa --per_device_train_batch_size 1 --dataloader_num_workers 4`.
- `vora`: the same model, clips and video token budget through `--custom_register_path swift_vora
  --template video_ora --dataset ANNOTATIONS.jsonl` (SWIFT_VORA_FPS=2, SWIFT_VORA_MAX_FRAMES=64,
  SWIFT_VORA_PAIR_TOKENS=196, SWIFT_VORA_MIN_PAIR_TOKENS=128, whole-clip windows), with these levers:
  no checkpointing and no backward through the frozen vision tower (`--vit_gradient_checkpointing false`:
  swift otherwise checkpoints the frozen ViT and makes its inputs require grad), no LLM checkpointing
  (`--gradient_checkpointing false`: trades memory, which the H200 has, for the recomputed forward), and
  12 persistent DataLoader workers. The per-sample tokens are asserted equal to the
  baseline's from the two encode logs.
- `vora_gc` (optional, `--variants baseline,vora,vora_gc`): `vora` with the LLM checkpointed (memory-lean).
Both runs use the same text (prompt and answer) per clip, so only the path differs. Further variants (all opt-in
through `--variants`; each is commented where `variant_specs` defines it):
- plain swift as a knowledgeable user tunes it: `baseline_strong` (`--vit_gradient_checkpointing false`, the
  DataLoader workers of the swift-vora variants, persistent, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`),
  `baseline_strong_liger` (+ `--use_liger_kernel true`), and at any memory `baseline_strong_liger_nogc` (LLM not
  checkpointed), `baseline_strong_mb4`, `baseline_strong_liger_mb4` and `baseline_strong_liger_nogc_mb4`
  (`--per_device_train_batch_size 4`).
  ms-swift 4.6's other Qwen3-VL speed switches, `--padding_free` and `--packing`, refuse any `--attn_impl` but
  flash-attention (SftArguments._check_padding_free) and the GPU machine has no flash-attn wheel, so plain swift
  has no packed variant.
- swift-vora's levers: `vora_gc_compile` (regional torch.compile, the default path) and its ablations, at any memory
  `vora_compile` (LLM not checkpointed), `vora_gc_compile_mb4` / `vora_compile_mb4` (micro-batch 4), and selective
  activation checkpointing instead of whole-layer checkpointing: `vora_gc_sac` (attention outputs saved) and
  `vora_gc_sac_matmul` (every matmul output saved), swift_vora/speed/selective_checkpoint.py; and packed
  micro-batches (`--padding_free true --attn_impl vora_varlen`, swift_vora/speed/packed_attention.py: the four
  clips of a micro-batch in one row, attention per clip through torch's varlen flash kernel, no padding):
  `vora_gc_compile_packed_mb4`, `vora_compile_packed_mb4`; CUDA graphs of the compiled layers
  (`SWIFT_VORA_COMPILE_MODE=reduce-overhead`): `vora_gc_compile_cg`, and inductor's GEMM autotuning without them:
  `vora_gc_compile_autotune`.
A `_mb4` variant keeps the samples per optimizer step: its gradient accumulation is divided by 4 (at least 1).

Headline (`headline_rule` in the JSON): the memory budget is `baseline`'s peak reserved memory. `swift_vora_*` and
`speedup` are the fastest swift-vora variant within it against `baseline`; `baseline_variant` is the fastest plain
variant within the same budget and `speedup_vs_strongest` ours over it; `any_memory` puts the fastest swift-vora
variant against the fastest plain variant with memory and micro-batch free on both sides (`ours`, `baseline`,
`speedup`, ours' `mfu`).

`--parallel N` runs N variants side by side, one GPU each (`CUDA_VISIBLE_DEVICES` per process, `gpu_index` in the
JSON), in groups of N in the order given: on a machine with N GPUs one device call measures N times as many variants.
The host (CPU cores for the DataLoader workers, memory bandwidth) is shared between the variants of a group, so a
ratio compares variants of one invocation, as always.

Measurement: a callback (this file doubles as a swift plugin: `--custom_register_path benchmarks/throughput.py
--callbacks vora_bench`) logs a CUDA-synchronised timestamp at every optimizer step, the number of samples
(micro-batches x batch size, gradient accumulation set explicitly), the main process's time blocked in
`DataLoader.__next__`, and torch's peak memory. The rate is samples after the warm-up steps divided by the
time between the end of the last warm-up step and the end of the last step. swift's own logging.jsonl gives
its `memory(GiB)`. py-spy (if on PATH and --profile-seconds N is given) samples the trainer for N seconds inside
the measured window.

Model FLOPs per sample (written into the JSON as `flops_formula`), frozen ViT and merger, LoRA on the LLM:
  F = 2*N_vit*P + L_vit*4*sum_g(p_g^2)*d_vit             vision tower, forward only (frozen, no input grad)
    + 2*N_merger*V                                        patch mergers, forward only (frozen)
    + 4*N_llm*T + 6*N_lora*T                              LLM: forward 2N + activation-grad backward 2N on frozen
                                                          weights; LoRA weights trainable (6N)
    + 6*L*T^2*d_attn                                      causal attention: forward 2*T^2*d per layer, backward 2x
    + 4*h*vocab*S                                         LM head on the S supervised positions (logits_to_keep)
  with P = vision patches (4 per video token), p_g = patches per temporal group, V = video tokens, T = tokens,
  N_* = matmul weights (swift_vora.tiny_model.qwen3_vl_param_counts). Recomputation under checkpointing and
  backward through the frozen ViT are not useful work and are not counted, so MFU compares runs fairly:
  MFU = F * samples_per_s / 790e12 (the H200's measured bf16 matmul rate, gpu-machine.md / KINDS.md).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICRO_BATCH = 4  # the *_mb4 variants' --per_device_train_batch_size
MICRO_BATCH_LARGE = 6  # the *_mb6 variants'
PEAK_BF16_FLOPS = 790e12  # measured 8192^3 bf16 matmul on the lent H200 (KINDS.md)
BENCH_DIR_ENV = 'SWIFT_VORA_BENCH_DIR'
CALLBACK_NAME = 'vora_bench'
VIDEO_TOKEN_ID = 151656

OFFLINE_ENV = {
    'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'MODELSCOPE_OFFLINE': '1',
    'USE_HF': '1', 'NCCL_NVLS_ENABLE': '0', 'TORCH_SYMM_MEM_DISABLE_MULTICAST': '1', 'NVSHMEM_DISABLE_NVLS': '1',
    'FORCE_QWENVL_VIDEO_READER': 'decord', 'TOKENIZERS_PARALLELISM': 'false', 'PYTHONUNBUFFERED': '1',
}


# ==== shared helpers (learnability.py imports these) =============================================================


def switch(name: str):
    """A SWIFT_VORA_* switch of the benchmark tools, read through the plugin's one table (swift_vora/switches.py)
    from this checkout."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from swift_vora import switches
    return switches.read(name)

def now_stamp() -> str:
    return _dt.datetime.now().strftime('%Y-%m-%d')


def swift_cmd() -> List[str]:
    """`swift` as installed next to this interpreter (or on PATH); else the same CLI through `python -m`."""
    local = os.path.join(os.path.dirname(sys.executable), 'swift')
    if os.path.isfile(local) and os.access(local, os.X_OK):
        return [local]
    found = shutil.which('swift')
    if found:
        return [found]
    return [sys.executable, '-m', 'swift.cli.main']


def base_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    for key, value in OFFLINE_ENV.items():
        env.setdefault(key, value)
    env.setdefault('HF_DATASETS_CACHE', os.path.join(tempfile.gettempdir(), 'swift_vora_hf_datasets'))
    env.setdefault('MODELSCOPE_CACHE', os.path.join(tempfile.gettempdir(), 'swift_vora_modelscope'))
    # DataLoader workers and swift's own subprocess must find this checkout (the plugin, this file).
    env['PYTHONPATH'] = os.pathsep.join(p for p in [REPO, env.get('PYTHONPATH', '')] if p)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def run_logged(cmd: List[str], log_path: str, env: Dict[str, str], cwd: str = REPO,
               timeout: Optional[float] = None) -> subprocess.Popen:
    """Start `cmd` with stdout+stderr to `log_path` (the command line is the log's first line)."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    log = open(log_path, 'w')
    log.write('$ ' + ' '.join(_quote(c) for c in cmd) + '\n')
    log.flush()
    # Own process group (not a new session: the device machine ends a call's leftover processes by session),
    # so a timeout can kill swift's whole tree (its trainer subprocess and DataLoader workers).
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, process_group=0)
    proc._log = log  # closed by wait_logged
    proc._timeout = timeout
    _CHILDREN.append(proc)
    return proc


_CHILDREN: List[subprocess.Popen] = []


def _kill_children() -> None:
    for proc in _CHILDREN:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


import atexit  # noqa: E402

atexit.register(_kill_children)


def wait_or_kill(proc: subprocess.Popen, timeout: Optional[float], expired: str = 'timeout') -> Any:
    """Exit code of `proc` (started by run_logged), or `expired` after killing its process group once `timeout`
    seconds have passed; closes its log either way (learnability.py uses it too)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return expired
    finally:
        proc._log.close()


KILLED_AFTER_MEASURING = 'killed at its timeout after every measured step was logged'


def wait_logged(proc: subprocess.Popen, what: str, log_path: str,
                measured: Optional[Callable[[], bool]] = None) -> Any:
    """The exit code of a run_logged process; a failure raises SystemExit. A process killed at its timeout counts
    when `measured()` says every measured step had been logged: what it was doing then (saving, a profiled step,
    its workers' shutdown) is not measured (on the H200, 2026-12-02, two variants that had logged their 12 steps
    were reported failed while they saved their adapter). Returns 'timeout' for those."""
    rc = wait_or_kill(proc, getattr(proc, '_timeout', None))
    if rc == 'timeout' and measured is not None and measured():
        print(f'--- {what}: {KILLED_AFTER_MEASURING}; its steps count', file=sys.stderr)
        return rc
    if rc != 0:
        print(f'--- {what} failed (exit {rc}); last lines of {log_path}:', file=sys.stderr)
        print(tail(log_path, 60), file=sys.stderr)
        raise SystemExit(f'{what} failed (exit {rc}); see {log_path}')
    return rc


def progress_steps(vdir: str) -> int:
    """How many optimizer steps the bench callback logged in VDIR/progress.jsonl."""
    return sum(1 for r in read_jsonl(os.path.join(vdir, 'progress.jsonl')) if r.get('event') == 'step')


def tail(path: str, n: int = 40) -> str:
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-n:])
    except OSError:
        return ''


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in '@%+=:,./-_' for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def cmdline(cmd: List[str], env_keys: Dict[str, str]) -> str:
    """A copy-pasteable shell line: the benchmark-specific env assignments, then the command."""
    prefix = ' '.join(f'{k}={_quote(str(v))}' for k, v in env_keys.items())
    return (prefix + ' ' if prefix else '') + ' '.join(_quote(c) for c in cmd)


def hardware() -> Dict[str, Any]:
    info: Dict[str, Any] = {'cpus': os.cpu_count(), 'python': sys.version.split()[0]}
    try:
        import torch
        info['torch'] = torch.__version__
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info['gpu'] = props.name
            info['gpu_mem_gib'] = round(props.total_memory / 2**30, 1)
            info['gpu_count'] = torch.cuda.device_count()
        else:
            info['gpu'] = None
    except Exception as exc:  # noqa: BLE001 - informational only
        info['torch_error'] = repr(exc)
    for name in ('transformers', 'peft', 'ms_swift', 'accelerate'):
        try:
            from importlib.metadata import version
            info[name] = version(name.replace('_', '-'))
        except Exception:  # noqa: BLE001
            info[name] = None
    return info


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    rows = []
    if not os.path.isfile(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def write_results(payload: Dict[str, Any], results_dir: str, name: str, out_dir: Optional[str]) -> str:
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f'{name}-{now_stamp()}.json')
    with open(path, 'w') as f:
        json.dump(payload, f, indent=2, sort_keys=False)
        f.write('\n')
    if out_dir and os.path.abspath(out_dir) != os.path.abspath(results_dir):
        os.makedirs(out_dir, exist_ok=True)
        shutil.copy(path, os.path.join(out_dir, os.path.basename(path)))
    return path


def build_model(out_dir: str, shape: str, dtype: str, seed: int = 0) -> float:
    """Build a random checkpoint in a separate process (the driver keeps no CUDA context or cached memory)."""
    if os.path.isfile(os.path.join(out_dir, 'config.json')):
        return 0.0
    t0 = time.time()
    device = 'cuda' if cuda_available() else 'cpu'
    code = ('import sys; sys.path.insert(0, %r); from swift_vora.tiny_model import build_qwen3_vl; '
            'build_qwen3_vl(%r, %r, seed=%d, dtype=%r, device=%r)' % (REPO, out_dir, shape, seed, dtype, device))
    subprocess.run([sys.executable, '-c', code], check=True, env=base_env())
    return time.time() - t0


def make_clips(out_dir: str, n: int, duration: float, fps: float, size, seed: int = 0, workers: int = 1,
               max_events: int = 2) -> List[Dict[str, Any]]:
    """`n` synthetic clips (swift_vora.synthetic) in parallel; returns [{'video', 'duration', 'windows'}]."""
    import random

    from swift_vora import synthetic
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        events = synthetic.random_intervals(duration, rng, max_events=max_events)
        jobs.append((os.path.join(out_dir, f'clip_{i:04d}.mp4'), duration, events, fps, tuple(size), seed + i))
    if workers > 1 and n > 1:
        from multiprocessing import get_context
        with get_context('fork').Pool(min(workers, n)) as pool:
            pool.starmap(_write_clip, jobs)
    else:
        for job in jobs:
            _write_clip(*job)
    return [{'video': j[0], 'duration': duration, 'windows': [list(e) for e in j[2]]} for j in jobs]


def _write_clip(path, duration, events, fps, size, seed):
    from swift_vora import synthetic
    if not os.path.isfile(path):
        synthetic.write_video(path, duration, events, fps=fps, size=size, seed=seed)
    return path


# ==== the swift plugin side: instrumentation inside the `swift sft` process ======================================

def _install_instrumentation() -> None:
    """Registers the `vora_bench` callback and the data-wait / encode probes (only with SWIFT_VORA_BENCH_DIR)."""
    bench_dir = switch(BENCH_DIR_ENV)
    if not bench_dir:
        return
    import threading

    import torch
    from swift.callbacks import callbacks_map
    from swift.callbacks.base import TrainerCallback

    state = {'data_wait_s': 0.0, 'batches': 0, 'main_pid': None}
    # SWIFT_VORA_BENCH_TORCH_PROFILE=N: torch.profiler over optimizer step N (all its micro-batches)
    torch_profile_step = switch('SWIFT_VORA_BENCH_TORCH_PROFILE')
    # SWIFT_VORA_BENCH_SYNC_DEBUG=N: count the synchronising CUDA calls of optimizer step N by call site
    sync_debug_step = switch('SWIFT_VORA_BENCH_SYNC_DEBUG')
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import step_timeline
    gc_timer = step_timeline.GcTimer().start()
    lock = threading.Lock()
    progress_path = os.path.join(bench_dir, 'progress.jsonl')
    encode_path = os.path.join(bench_dir, 'encode.jsonl')

    def _emit(record):
        with lock, open(progress_path, 'a') as f:
            f.write(json.dumps(record) + '\n')

    # 1. Time the training loop spends blocked on the next batch (main process only).
    from torch.utils.data import dataloader as _dl
    if not getattr(_dl._BaseDataLoaderIter.__next__, '_vora_bench', False):
        original_next = _dl._BaseDataLoaderIter.__next__

        def __next__(self):
            if state['main_pid'] != os.getpid():
                return original_next(self)
            t0 = time.perf_counter()
            try:
                return original_next(self)
            finally:
                state['data_wait_s'] += time.perf_counter() - t0
                state['batches'] += 1

        __next__._vora_bench = True
        _dl._BaseDataLoaderIter.__next__ = __next__

    # 2. Tokens per encoded sample, whatever the template (runs in the DataLoader workers too).
    from swift.template import Template
    if not getattr(Template.encode, '_vora_bench', False):
        original_encode = Template.encode
        counter = {'n': 0}

        def encode(self, inputs, *args, **kwargs):
            encoded = original_encode(self, inputs, *args, **kwargs)
            if counter['n'] < 256 and isinstance(encoded, dict) and encoded.get('input_ids') is not None:
                counter['n'] += 1
                ids = list(encoded['input_ids'])
                labels = encoded.get('labels')
                grid = encoded.get('video_grid_thw')
                rec = {'pid': os.getpid(), 'template': type(self).__name__, 'tokens': len(ids),
                       'video_tokens': sum(1 for t in ids if t == getattr(self, 'video_token_id', VIDEO_TOKEN_ID)),
                       'supervised': sum(1 for t in labels if t != -100) if labels is not None else None,
                       'video_grid_thw': grid.tolist() if hasattr(grid, 'tolist') else None}
                with open(encode_path, 'a') as f:
                    f.write(json.dumps(rec) + '\n')
            return encoded

        encode._vora_bench = True
        Template.encode = encode

    class BenchCallback(TrainerCallback):

        def __init__(self, args, trainer):
            super().__init__(args, trainer)
            self.micro = 0
            self.batch_size = int(args.per_device_train_batch_size)

        def _sync(self):
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        def on_train_begin(self, args, state_, control, **kwargs):
            state['main_pid'] = os.getpid()
            if torch_profile_step is not None:  # phase marks, so that the trace's GPU gaps can be placed
                step_timeline.Regions(self.trainer)
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            _emit({'event': 'begin', 'pid': os.getpid(), 't': time.time(), 'batch_size': self.batch_size,
                   'grad_accum': int(args.gradient_accumulation_steps), 'max_steps': int(state_.max_steps)})

        def on_step_begin(self, args, state_, control, **kwargs):
            if torch_profile_step is not None and int(state_.global_step) == torch_profile_step:
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                               torch.profiler.ProfilerActivity.CUDA])
                self.prof.__enter__()
            if sync_debug_step is not None and int(state_.global_step) == sync_debug_step:
                from swift_vora.backends.sync_sites import SyncRecorder
                self.syncs = SyncRecorder().__enter__()

        def on_substep_end(self, args, state_, control, **kwargs):
            self.micro += 1

        def on_step_end(self, args, state_, control, **kwargs):
            self.micro += 1
            self._sync()
            rec = {'event': 'step', 'step': int(state_.global_step), 'micro': self.micro,
                   'samples': self.micro * self.batch_size, 't': time.time(), 'data_wait_s': state['data_wait_s'],
                   'batches_fetched': state['batches'], 'gc_s': gc_timer.snapshot()['seconds']}
            if torch.cuda.is_available():
                rec['max_allocated_gib'] = torch.cuda.max_memory_allocated() / 2**30
                rec['max_reserved_gib'] = torch.cuda.max_memory_reserved() / 2**30
            _emit(rec)
            if getattr(self, 'prof', None) is not None:
                self.prof.__exit__(None, None, None)
                _write_torch_profile(self.prof, bench_dir)
                self.prof = None
            if getattr(self, 'syncs', None) is not None:
                self.syncs.__exit__(None, None, None)
                with open(os.path.join(bench_dir, 'syncs.json'), 'w') as f:
                    json.dump(self.syncs.summary(), f, indent=1)
                self.syncs = None

        def on_train_end(self, args, state_, control, **kwargs):
            self._sync()
            rec = {'event': 'end', 't': time.time(), 'data_wait_s': state['data_wait_s']}
            if torch.cuda.is_available():
                rec['max_allocated_gib'] = torch.cuda.max_memory_allocated() / 2**30
                rec['max_reserved_gib'] = torch.cuda.max_memory_reserved() / 2**30
            _emit(rec)

    callbacks_map[CALLBACK_NAME] = BenchCallback


def _write_torch_profile(prof, out_dir: str) -> None:
    """torch_profile.txt (top ops by device time) and torch_profile.json (GPU time by kernel family)."""
    import step_timeline  # next to this file (on sys.path in the instrumented trainer)
    events = prof.key_averages()
    with open(os.path.join(out_dir, 'torch_profile.txt'), 'w') as f:
        f.write(events.table(sort_by='self_device_time_total', row_limit=60))
    by_class: Dict[str, float] = {}
    kernels = []
    for e in events:
        t = getattr(e, 'self_device_time_total', 0.0) or 0.0
        if t <= 0 or getattr(e, 'device_type', None) is None or 'CUDA' not in str(e.device_type):
            continue
        if e.key.startswith(step_timeline.REGION_PREFIX):  # phase marks: spans over kernels, not kernels
            continue
        cls = step_timeline.kernel_family(e.key)
        by_class[cls] = by_class.get(cls, 0.0) + t
        kernels.append((t, e.key[:120], cls, e.count))
    total = sum(by_class.values()) or 1.0
    kernels.sort(reverse=True)
    summary = {'gpu_kernel_ms': round(total / 1e3, 1),
               'by_class_fraction': {k: round(v / total, 4) for k, v in sorted(by_class.items(), key=lambda x: -x[1])},
               'top_kernels': [{'ms': round(t / 1e3, 2), 'kernel': k, 'class': c, 'calls': n}
                               for t, k, c, n in kernels[:25]]}
    trace = os.path.join(out_dir, 'trace.json')
    try:  # where the GPU idles in this step (step_timeline.gpu_idle), then the trace compressed for the logs
        prof.export_chrome_trace(trace)
        summary['gpu_idle'] = step_timeline.gpu_idle_from_file(trace)
        with open(trace, 'rb') as src, gzip.open(trace + '.gz', 'wb') as dst:
            shutil.copyfileobj(src, dst)
        os.remove(trace)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        summary['gpu_idle'] = {'error': repr(exc)}
    with open(os.path.join(out_dir, 'torch_profile.json'), 'w') as f:
        json.dump(summary, f, indent=1)


if __name__ != '__main__' and 'swift' in sys.modules:  # imported by swift's plugin loader
    _install_instrumentation()


# ==== the driver =================================================================================================

def variant_specs(smoke: bool, workers_baseline: int, workers_vora: int) -> Dict[str, Dict[str, Any]]:
    """Per variant: extra env, template flags and lever flags."""
    if smoke:  # tiny clips: 8 s, 1 fps -> 8 frames, 4 groups of 3x4 tokens
        baseline_env = {'FPS': '1', 'FPS_MAX_FRAMES': '8', 'VIDEO_MAX_TOKEN_NUM': '12', 'VIDEO_MIN_TOKEN_NUM': '4'}
        vora_env = {'SWIFT_VORA_FPS': '1', 'SWIFT_VORA_MAX_FRAMES': '8', 'SWIFT_VORA_PAIR_TOKENS': '12',
                    'SWIFT_VORA_MIN_PAIR_TOKENS': '4'}
    else:
        baseline_env = {'FPS': '2', 'FPS_MAX_FRAMES': '64', 'VIDEO_MAX_TOKEN_NUM': '196', 'VIDEO_MIN_TOKEN_NUM': '128'}
        vora_env = {'SWIFT_VORA_FPS': '2', 'SWIFT_VORA_MAX_FRAMES': '64', 'SWIFT_VORA_PAIR_TOKENS': '196',
                    'SWIFT_VORA_MIN_PAIR_TOKENS': '128'}
    vora_env.update({'SWIFT_VORA_MIN_FRAMES': '4', 'SWIFT_VORA_WINDOW': '0', 'SWIFT_VORA_LOG_FIRST': '2'})
    # The compiled path also lets the CUDA allocator grow segments instead of caching fixed blocks
    # (expandable_segments): the same allocations in less reserved memory (what swift-vora train sets).
    # The CPU smoke checks the wiring with dynamo + AOT autograd; inductor's C++ codegen would take minutes there.
    compile_env = {'SWIFT_VORA_COMPILE': 'layers', 'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True',
                   **({'SWIFT_VORA_COMPILE_BACKEND': 'aot_eager'} if smoke else {})}
    def vora_flags(workers: int) -> List[str]:
        flags = ['--dataloader_num_workers', str(workers), '--vit_gradient_checkpointing', 'false']
        # prefetch stays at 2 per worker: a 64-frame sample is ~140 MB of float32 pixels in /dev/shm (70 in bf16)
        if workers > 0:
            flags += ['--dataloader_persistent_workers', 'true']
        return flags

    def vora(gc: bool, *flags: str, env: Optional[Dict[str, str]] = None, workers: Optional[int] = None,
             **keys) -> Dict[str, Any]:
        """A swift-vora variant: the plugin, the video_ora template, the annotations, the levers above; `env` is
        laid over the swift-vora budget env; `workers` DataLoader workers (default `--workers-vora`)."""
        return {'env': {**vora_env, **(env or {})}, 'plugins': ['swift_vora'], 'template': ['--template', 'video_ora'],
                'dataset': 'annotations', 'flags': ['--gradient_checkpointing', 'true' if gc else 'false', *flags]
                + vora_flags(workers_vora if workers is None else workers), **keys}

    def plain(gc: bool, *flags: str, env: Optional[Dict[str, str]] = None, **keys) -> Dict[str, Any]:
        """A plain `swift sft` variant as a knowledgeable user tunes it: the frozen ViT not checkpointed, the
        DataLoader workers of the swift-vora variants (persistent), the CUDA allocator's expandable segments."""
        return {'env': {**baseline_env, 'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True', **(env or {})},
                'plugins': [], 'template': [], 'dataset': 'rows',
                'flags': ['--gradient_checkpointing', 'true' if gc else 'false', *flags] + vora_flags(workers_vora),
                **keys}

    liger = ('--use_liger_kernel', 'true')
    # The same samples per optimizer step at a larger micro-batch: `batch_size` N sets
    # --per_device_train_batch_size N and divides the gradient accumulation by N (sft_command).
    mb = MICRO_BATCH
    # Plain swift has no packed variant: ms-swift 4.6's `--padding_free true` and `--packing true` raise in
    # SftArguments._check_padding_free unless --attn_impl is a flash-attention implementation (flash_attn,
    # flash_attention_2/3/4), and the GPU machine has no flash-attn wheel for its torch. swift-vora's `vora_varlen`
    # attention (swift_vora/speed/packed_attention.py) is the way round it.
    packed = ('--padding_free', 'true', '--attn_impl', 'vora_varlen')
    fp8_env = {'SWIFT_VORA_FP8': 'frozen_base', **({'SWIFT_VORA_FP8_EMULATE': '1'} if smoke else {})}
    return {
        'baseline': {'env': baseline_env, 'plugins': [], 'template': [], 'dataset': 'rows',
                     'flags': ['--gradient_checkpointing', 'true', '--dataloader_num_workers', str(workers_baseline)]},
        # Plain swift, tuned (the headline's `baseline_variant` is the fastest of these within the default's memory)
        'baseline_strong': plain(True),
        'baseline_strong_liger': plain(True, *liger),
        # ... at any memory: the LLM not checkpointed, larger micro-batches
        'baseline_strong_liger_nogc': plain(False, *liger),
        'baseline_strong_mb4': plain(True, batch_size=mb),  # (also runs where Liger cannot: the CPU smoke)
        'baseline_strong_liger_mb4': plain(True, *liger, batch_size=mb),
        'baseline_strong_liger_nogc_mb4': plain(False, *liger, batch_size=mb),
        'vora': vora(False),
        'vora_gc': vora(True),
        # Liger's Triton kernels for Qwen3-VL (RMSNorm, RoPE, fused linear cross entropy) through HF Trainer's
        # `use_liger_kernel`, as ms-swift passes it.
        'vora_liger': vora(False, '--use_liger_kernel', 'true'),
        'vora_gc_liger': vora(True, '--use_liger_kernel', 'true'),
        # + regional torch.compile of the 28 decoder layers (swift_vora/speed/compile_layers.py), with and without Liger
        # (inductor fuses RMSNorm and RoPE itself; without Liger the loss is swift's, not the fused linear CE).
        'vora_gc_liger_compile': vora(True, '--use_liger_kernel', 'true', env=compile_env),
        # Since run 6 with swift_vora/speed/host_overhead.py (on by default): the parameter count for the logged FLOPs
        # taken once and the DeepStack merge without host syncs. Since run 11 with the vision blocks compiled too
        # (SWIFT_VORA_COMPILE_VISION) and the pixels handed over in bf16 (swift_vora/speed/pixel_dtype.py), both
        # default.
        'vora_gc_compile': vora(True, env=compile_env),
        # ... as runs 7-10 measured it: vision tower eager, float32 pixels from the workers
        'vora_gc_compile_r10': vora(True, env={**compile_env, 'SWIFT_VORA_COMPILE_VISION': '0',
                                               'SWIFT_VORA_PIXEL_DTYPE': 'float32'}),
        # ... with the batches copied to the GPU without blocking the host (accelerate's `non_blocking`, from the
        # pinned DataLoader memory; swift's own accelerator_config default kept)
        'vora_gc_compile_nb': vora(True, '--accelerator_config', '{"dispatch_batches": false, "non_blocking": true}',
                                   env=compile_env),
        # ... with bf16 pixels but the vision tower eager (what the vision compile adds on its own)
        'vora_gc_compile_eager_vision': vora(True, env={**compile_env, 'SWIFT_VORA_COMPILE_VISION': '0'}),
        # ... with one batch in flight per DataLoader worker instead of swift's 2: a smaller backlog for the 12
        # workers to decode next to the trainer in the first measured steps
        'vora_gc_compile_pf1': vora(True, '--dataloader_prefetch_factor', '1', env=compile_env),
        # ... with the checkpoint inside the compiled layers (SWIFT_VORA_COMPILE_CHECKPOINT=graph; fails to compile on
        # torch 2.11, run 6)
        'vora_gc_compile_graphckpt': vora(True, env={**compile_env, 'SWIFT_VORA_COMPILE_CHECKPOINT': 'graph'}),
        # ... without swift_vora/speed/host_overhead.py: what runs 3-5 measured as `vora_gc_compile`
        'vora_gc_compile_r5': vora(True, env={**compile_env, 'SWIFT_VORA_HOST_OVERHEAD': '0'}),
        # + inductor's C++ wrapper (upstream switch): the compiled graphs launch their kernels from C++ instead of
        # generated Python; the run-3 py-spy had ~20 % of the host samples in the Python wrappers. Run 8: no gain
        # (3.278 samples/s, the same step times as run 7, 0.2 GiB more reserved).
        'vora_gc_compile_cpp': vora(True, env={**compile_env, 'TORCHINDUCTOR_CPP_WRAPPER': '1'}),
        # ... at a larger micro-batch (any memory), and without the LLM checkpointed (any memory)
        'vora_gc_compile_mb4': vora(True, env=compile_env, batch_size=mb),
        'vora_compile': vora(False, env=compile_env),
        'vora_compile_mb4': vora(False, env=compile_env, batch_size=mb),
        # ... with transformers' Conv3d patch embedding (run 15: cuDNN's generic kernel, 20 ms of a 6-sample step)
        # instead of the GEMM swift_vora/speed/patch_embed.py makes of it: the lever's share, side by side
        'vora_compile_mb4_conv': vora(False, env={**compile_env, 'SWIFT_VORA_PATCH_EMBED': 'conv'}, batch_size=mb),
        # ... at micro-batch 6 (run 14: micro-batch 4 peaked at 79 GiB, the planner puts 6 at ~118 GiB reserved; plain
        # swift's micro-batch 4 already needs 101 GiB, so 6 is a size only the compiled layers reach on one H200)
        'vora_compile_mb6': vora(False, env=compile_env, batch_size=MICRO_BATCH_LARGE),
        # ... with inductor's CUDA graphs (SWIFT_VORA_COMPILE_MODE=reduce-overhead: each compiled layer replayed as one
        # graph launch, against the host-bound step) or its GEMM autotuning without them
        'vora_gc_compile_cg': vora(True, env={**compile_env, 'SWIFT_VORA_COMPILE_MODE': 'reduce-overhead'}),
        'vora_gc_compile_autotune': vora(True, env={**compile_env,
                                                    'SWIFT_VORA_COMPILE_MODE': 'max-autotune-no-cudagraphs'}),
        # ... the micro-batch packed into one row (no padding; one varlen attention call per layer for its clips).
        # Run 14: slower than the padded micro-batch on these equal-length clips (5.01 against 5.70 samples/s without
        # checkpointing), with the same losses: there is no padding to save, and the row costs per-layer q/k/v copies
        # (and KV heads repeated for torch 2.11's kernel, which has no enable_gqa)
        'vora_gc_compile_packed_mb4': vora(True, *packed, env=compile_env, batch_size=mb),
        'vora_compile_packed_mb4': vora(False, *packed, env=compile_env, batch_size=mb),
        # Selective activation checkpointing (swift_vora/speed/selective_checkpoint.py) instead of whole-layer
        # checkpointing: the attention outputs (or every matmul output too) saved, the pointwise ops recomputed. It
        # leaves compiled layers alone, so these run the layers eager. Run 14: 1.35 samples/s at 6.98 GiB, against
        # 3.76 at 6.31 for the compiled, whole-layer checkpointed default.
        'vora_gc_sac': vora(True, env={'SWIFT_VORA_SELECTIVE_CHECKPOINT': 'attention',
                                       'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}),
        'vora_gc_sac_matmul': vora(True, env={'SWIFT_VORA_SELECTIVE_CHECKPOINT': 'matmul',
                                              'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}),
        # ... with half the DataLoader workers (6 still decode ahead of 3.5 samples/s, and compete less with the
        # trainer while they do; run 9: slower, 3.10 against 3.30 samples/s)
        'vora_gc_compile_w6': vora(True, env=compile_env, workers=6),
        # Memory calibration (docs/memory-model.md), not speed: a second video budget (4 fps -> 128 frames, twice
        # the tokens) and ZeRO-3 on one GPU, both with the LLM checkpointed.
        'cal_f128': vora(True, env={'SWIFT_VORA_FPS': str(2 * float(vora_env['SWIFT_VORA_FPS'])),
                                    'SWIFT_VORA_MAX_FRAMES': str(2 * int(vora_env['SWIFT_VORA_MAX_FRAMES']))},
                         other_budget=True),
        'cal_zero3': vora(True, '--deepspeed', 'zero3', env={'NPROC_PER_NODE': '1'}),
        # FP8 GEMMs for the frozen base linears (swift_vora/speed/fp8_frozen.py, torchao), each next to its bf16
        # twin (the name without FP8_SUFFIX): the same flags, seed and samples, so the logged losses compare step by
        # step (`loss_max_rel_diff_vs_bf16`). On the CPU smoke the casts are emulated (no speed, the wiring only).
        'vora_gc_fp8': vora(True, env=fp8_env),
        'vora_gc_compile_fp8': vora(True, env={**compile_env, **fp8_env}),
        'vora_compile_mb4_fp8': vora(False, env={**compile_env, **fp8_env}, batch_size=mb),
        # the same with the forward FP8 GEMM accumulating exactly (a suspect of the first run's loss drift); its
        # twin is vora_gc_compile too (FP8_TWIN_QUALIFIERS)
        'vora_gc_compile_fp8_exact': vora(True, env={**compile_env, **fp8_env, 'SWIFT_VORA_FP8_ACCUM': 'exact'}),
        # 26 of 28 decoder layers checkpointed (speed/partial_checkpoint.py): the memory FP8 frees (1.4 GiB) spent
        # on two layers that keep their activations (0.64 GiB each planned): the FP8 one within plain swift's 6.66
        # GiB; the bf16 twin (above it) for the FP8 loss comparison
        'vora_gc_compile_ck26': vora(True, env={**compile_env, 'SWIFT_VORA_CHECKPOINT_LAYERS': '26'}),
        'vora_gc_compile_ck26_fp8': vora(True, env={**compile_env, 'SWIFT_VORA_CHECKPOINT_LAYERS': '26', **fp8_env}),
    }


def build_inputs(args, work: str) -> Dict[str, str]:
    """Model + clips + the two dataset files (same clips, same text)."""

    t0 = time.time()
    if args.smoke:
        clips = make_clips(os.path.join(work, 'clips'), args.clips, 8.0, 4.0, (128, 96), workers=1)
    else:
        clips = make_clips(os.path.join(work, 'clips'), args.clips, 32.0, 8.0, (640, 360),
                           workers=min(16, os.cpu_count() or 1))
    t_clips = time.time() - t0
    model_dir = args.model_dir or os.path.join(work, 'model')
    t_model = build_model(model_dir, 'tiny' if args.smoke else '2b', 'float32' if args.smoke else 'bfloat16')
    return {'model': model_dir, **write_datasets(work, clips), 'build_model_s': round(t_model, 1),
            'make_clips_s': round(t_clips, 1)}


def write_datasets(work: str, clips: List[Dict[str, Any]]) -> Dict[str, str]:
    """The same clips and text as swift-vora annotations (whole-clip windows) and as plain ms-swift rows
    (messages + videos): {'rows': path, 'annotations': path}. moe_throughput.py uses it too."""
    from swift_vora import intervals, prompt, synthetic
    rows_path, ann_path = os.path.join(work, 'rows.jsonl'), os.path.join(work, 'annotations.jsonl')
    with open(rows_path, 'w') as rows, open(ann_path, 'w') as anns:
        for i, clip in enumerate(clips):
            text = prompt.build_prompt(synthetic.QUERY, clip['duration'])
            answer = intervals.format_answer(clip['windows'])
            rows.write(json.dumps({'messages': [{'role': 'user', 'content': text},
                                                {'role': 'assistant', 'content': answer}],
                                   'videos': [clip['video']]}) + '\n')
            anns.write(json.dumps({'id': f'clip_{i:04d}', 'video': clip['video'], 'duration': clip['duration'],
                                   'query': synthetic.QUERY, 'windows': clip['windows']}) + '\n')
    return {'rows': rows_path, 'annotations': ann_path}


def micro_steps(grad_accum: int, batch_size: int) -> int:
    """Gradient accumulation at micro-batch `batch_size` that keeps `grad_accum` samples per optimizer step (at least
    one micro-batch: a step then holds `batch_size` samples)."""
    return max(1, grad_accum // batch_size)


def samples_per_step(grad_accum: int, batch_size: int) -> int:
    return micro_steps(grad_accum, batch_size) * batch_size


def sft_command(args, spec: Dict[str, Any], inputs: Dict[str, str], out_dir: str, extra_steps: int = 0) -> List[str]:
    plugins = spec['plugins'] + [os.path.relpath(os.path.abspath(__file__), REPO)]
    batch_size = spec.get('batch_size', 1)
    cmd = swift_cmd() + ['sft', '--custom_register_path', *plugins,
                         '--model', inputs['model'], '--model_type', 'qwen3_vl', *spec['template'],
                         '--dataset', inputs[spec['dataset']],
                         '--tuner_type', 'lora', '--target_modules', 'all-linear',
                         '--attn_impl', 'sdpa', '--per_device_train_batch_size', str(batch_size),
                         '--gradient_accumulation_steps', str(micro_steps(args.grad_accum, batch_size)),
                         '--max_steps', str(args.steps + extra_steps),
                         '--learning_rate', '1e-4', '--logging_steps', '1', '--save_strategy', 'no',
                         '--split_dataset_ratio', '0', '--eval_strategy', 'no', '--report_to', 'none',
                         '--output_dir', out_dir, '--add_version', 'false', '--check_model', 'false',
                         '--callbacks', CALLBACK_NAME, '--dataset_num_proc', '1', '--seed', '42']
    if args.smoke:
        cmd += ['--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false']
    else:
        cmd += ['--torch_dtype', 'bfloat16']
    return cmd + spec['flags']


def run_variant(name: str, args, spec, inputs, work: str) -> Dict[str, Any]:
    """One variant, start to summary (py-spy inside its timed window with --profile-seconds)."""
    started = start_variant(name, args, spec, inputs, work)
    if args.profile_seconds > 0 and shutil.which('py-spy'):
        started['profile'] = _profile_when_measuring(started['proc'], started['vdir'], args)
    return finish_variant(started, args)


def start_variant(name: str, args, spec, inputs, work: str, gpu: Optional[str] = None, slot: int = 0) -> Dict[str, Any]:
    """Start the variant's `swift sft` (on the one GPU `gpu` names, if given, as side-by-side slot `slot`) and
    return what finish_variant needs."""
    vdir = os.path.join(work, name)
    shutil.rmtree(vdir, ignore_errors=True)
    os.makedirs(vdir)
    env_extra = dict(spec['env'])
    env_extra[BENCH_DIR_ENV] = vdir
    if gpu is not None:  # --parallel: one GPU per variant; a port of its own for a torchrun launch (cal_zero3)
        env_extra['CUDA_VISIBLE_DEVICES'] = gpu
        env_extra['MASTER_PORT'] = str(29500 + slot)
    # Diagnostic steps run after the measured ones and are not counted: the profiled step first
    # (global_step == steps when it begins), then the sync-debug step.
    extra = 0
    if name in args.torch_profile:
        env_extra['SWIFT_VORA_BENCH_TORCH_PROFILE'] = str(args.steps + extra)
        extra += 1
    if name in args.sync_debug:
        env_extra['SWIFT_VORA_BENCH_SYNC_DEBUG'] = str(args.steps + extra)
        extra += 1
    if name.startswith('vora'):
        env_extra['SWIFT_VORA_ENCODE_LOG'] = os.path.join(vdir, 'vora_encode.jsonl')
    cmd = sft_command(args, spec, inputs, os.path.join(vdir, 'output'), extra_steps=extra)
    log_path = os.path.join(vdir, 'sft.log')
    proc = run_logged(cmd, log_path, base_env(env_extra), timeout=args.variant_timeout)
    return {'name': name, 'spec': spec, 'vdir': vdir, 'cmd': cmd, 'log_path': log_path, 'proc': proc,
            't0': time.time(), 'gpu': gpu, 'profile': None}


def finish_variant(started: Dict[str, Any], args) -> Dict[str, Any]:
    """Wait for a started variant (its timeout counted from its start) and summarize it."""
    proc = started['proc']
    if proc._timeout is not None:
        proc._timeout = max(1.0, proc._timeout - (time.time() - started['t0']))
    rc = wait_logged(proc, f'swift sft ({started["name"]})', started['log_path'],
                     measured=lambda: progress_steps(started['vdir']) >= args.steps)
    wall = time.time() - started['t0']
    result = summarize_variant(started['name'], started['vdir'], args, cmdline(started['cmd'], started['spec']['env']),
                               wall, started['profile'], batch_size=started['spec'].get('batch_size', 1))
    if rc == 'timeout':
        result['exit'] = KILLED_AFTER_MEASURING
    if started['gpu'] is not None:
        result['gpu_index'] = started['gpu']
    return result


def _profile_when_measuring(proc, vdir, args) -> Optional[Dict[str, Any]]:
    """Wait for the first measured step, then py-spy the trainer process for `profile_seconds`."""
    progress = os.path.join(vdir, 'progress.jsonl')
    pid = None
    while proc.poll() is None:
        rows = read_jsonl(progress)
        begin = [r for r in rows if r.get('event') == 'begin']
        steps = [r for r in rows if r.get('event') == 'step']
        if begin:
            pid = begin[0]['pid']
        if pid and steps and steps[-1]['step'] >= args.warmup_steps:
            break
        time.sleep(0.5)
    if proc.poll() is not None or not pid:
        return None
    raw = os.path.join(vdir, 'pyspy.txt')
    spy_log = os.path.join(vdir, 'pyspy.log')
    cmd = ['py-spy', 'record', '--pid', str(pid), '--duration', str(args.profile_seconds), '--rate', '50',
           '--format', 'raw', '--threads', '--nonblocking', '--output', raw]
    with open(spy_log, 'w') as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.profile_seconds + 60)
    if rc != 0 or not os.path.isfile(raw):
        return {'error': f'py-spy exit {rc}', 'log': tail(spy_log, 10)}
    return summarize_profile(raw)


def summarize_profile(raw_path: str, top: int = 15) -> Dict[str, Any]:
    """Self and inclusive shares per function from py-spy's raw (collapsed-stack) output."""
    self_counts: Dict[str, int] = {}
    incl_counts: Dict[str, int] = {}
    thread_counts: Dict[str, int] = {}
    buckets = {
        'checkpoint_recompute_or_backward': ('torch/utils/checkpoint.py',),
        'autograd_backward': ('torch/autograd/', '_engine_run_backward'),
        'vision_tower': ('Qwen3VLVisionModel', 'modeling_qwen3_vl.py:Qwen3VLVisionBlock', 'VisionBlock'),
        'dataloader_next': ('dataloader.py:__next__', '_next_data', '_get_data'),
        'pin_memory_thread': ('pin_memory.py',),
        'optimizer_step': ('optimizer.py', 'adamw.py'),
        'cuda_sync_or_item': ('synchronize', '.item', '_local_scalar_dense'),
    }
    bucket_counts = {k: 0 for k in buckets}
    total = 0
    with open(raw_path, errors='replace') as f:
        for line in f:
            line = line.rstrip('\n')
            if not line or ' ' not in line:
                continue
            stack, _, count = line.rpartition(' ')
            try:
                n = int(count)
            except ValueError:
                continue
            frames = [fr.strip() for fr in stack.split(';') if fr.strip()]
            if not frames:
                continue
            total += n
            thread = frames[0] if frames[0].startswith(('thread', 'process')) else 'main'
            thread_counts[thread] = thread_counts.get(thread, 0) + n
            funcs = [_frame_key(fr) for fr in frames if not fr.startswith(('thread', 'process'))]
            if funcs:
                self_counts[funcs[-1]] = self_counts.get(funcs[-1], 0) + n
            for key in set(funcs):
                incl_counts[key] = incl_counts.get(key, 0) + n
            for bucket, needles in buckets.items():
                if any(any(nd in fr for nd in needles) for fr in frames):
                    bucket_counts[bucket] += n

    def shares(counts):
        return [[k, round(v / total, 4)] for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {'samples': total, 'rate_hz': 50, 'threads': shares(thread_counts), 'top_self': shares(self_counts),
            'top_inclusive': shares(incl_counts),
            'buckets': {k: round(v / total, 4) if total else 0.0 for k, v in bucket_counts.items()},
            'note': 'shares of all sampled stacks (all threads, --nonblocking, idle excluded by py-spy)'}


def _frame_key(frame: str) -> str:
    """`func (path/file.py:123)` -> `func (file.py)`."""
    name, _, where = frame.partition(' (')
    where = where.rstrip(')')
    path = where.rsplit(':', 1)[0]
    parts = path.replace('\\', '/').split('/')
    short = '/'.join(parts[-2:]) if len(parts) > 1 else path
    return f'{name} ({short})'


def summarize_variant(name, vdir, args, command, wall, profile, batch_size: int = 1) -> Dict[str, Any]:
    progress = read_jsonl(os.path.join(vdir, 'progress.jsonl'))
    steps = [r for r in progress if r.get('event') == 'step'][:args.steps]  # not the profiled extra step
    end = next((r for r in progress if r.get('event') == 'end'), {})
    if name in args.torch_profile or name in args.sync_debug:  # the peaks of the measured steps only
        end = {}
    if len(steps) <= args.warmup_steps:
        raise SystemExit(f'{name}: only {len(steps)} steps logged (warm-up {args.warmup_steps}); see {vdir}/sft.log')
    first, last = steps[args.warmup_steps - 1] if args.warmup_steps else None, steps[-1]
    if first is None:
        begin = next(r for r in progress if r.get('event') == 'begin')
        t_start, s_start, w_start = begin['t'], 0, 0.0
    else:
        t_start, s_start, w_start = first['t'], first['samples'], first['data_wait_s']
    measured = last['samples'] - s_start
    seconds = last['t'] - t_start
    enc = read_jsonl(os.path.join(vdir, 'encode.jsonl'))
    tokens = [r['tokens'] for r in enc]
    video_tokens = [r['video_tokens'] for r in enc]
    supervised = [r['supervised'] for r in enc if r.get('supervised') is not None]
    grids = [r['video_grid_thw'] for r in enc if r.get('video_grid_thw')]
    swift_log = read_jsonl(os.path.join(vdir, 'output', 'logging.jsonl'))
    swift_mem = [r['memory(GiB)'] for r in swift_log if isinstance(r.get('memory(GiB)'), (int, float))]
    result = {
        'variant': name,
        'command': command,
        'samples_measured': measured,
        'seconds_measured': round(seconds, 3),
        'samples_per_s': round(measured / seconds, 4) if seconds > 0 else None,
        's_per_sample': round(seconds / measured, 4) if measured else None,
        'warmup_steps': args.warmup_steps,
        'steps': len(steps),
        'batch_size': batch_size,
        'grad_accum': micro_steps(args.grad_accum, batch_size),
        'data_wait_s_measured': round(last['data_wait_s'] - w_start, 3),
        'data_wait_fraction': round((last['data_wait_s'] - w_start) / seconds, 4) if seconds > 0 else None,
        'peak_allocated_gib': round(end.get('max_allocated_gib', last.get('max_allocated_gib', 0.0)), 2)
        if ('max_allocated_gib' in end or 'max_allocated_gib' in last) else None,
        'peak_reserved_gib': round(end.get('max_reserved_gib', last.get('max_reserved_gib', 0.0)), 2)
        if ('max_reserved_gib' in end or 'max_reserved_gib' in last) else None,
        'swift_log_memory_gib': max(swift_mem) if swift_mem else None,
        'tokens_per_sample': _mean(tokens),
        'video_tokens_per_sample': _mean(video_tokens),
        'supervised_tokens_per_sample': _mean(supervised),
        'tokens_per_sample_set': sorted(set(tokens)),
        'video_grid_thw': grids[0] if grids else None,
        'encoded_samples_logged': len(enc),
        'wall_s': round(wall, 1) if wall is not None else None,
        'log': os.path.relpath(os.path.join(vdir, 'sft.log'), vdir),
        # swift's logged training losses (every --logging_steps): what an FP8 variant is compared on
        'losses': [r['loss'] for r in swift_log if isinstance(r.get('loss'), (int, float))],
    }
    vora_enc = read_jsonl(os.path.join(vdir, 'vora_encode.jsonl'))
    if vora_enc:
        # Tokens appended by swift_vora/speed/shape_bucket.py: processed, but not counted as work (FLOPs, tokens/s).
        result['tail_padding_per_sample'] = _mean([r.get('tail_padding') or 0 for r in vora_enc])
        result['vora_encode_log'] = {'samples': len(vora_enc),
                                     'frames': sorted({r.get('frames_from_tensors') for r in vora_enc}),
                                     'video_tokens': sorted({r.get('video_tokens') for r in vora_enc}),
                                     'total_tokens': sorted({r.get('total_tokens') for r in vora_enc})}
    if result['samples_per_s'] and result['tokens_per_sample']:  # real tokens (without tail padding) per second
        result['tokens_per_s'] = round(result['samples_per_s'] * real_tokens(result), 1)
    if profile is not None:
        result['profile'] = profile
    for key, fname in (('torch_profile', 'torch_profile.json'), ('syncs', 'syncs.json')):
        path = os.path.join(vdir, fname)
        if os.path.isfile(path):
            with open(path) as f:
                result[key] = json.load(f)
    if first is not None and 'gc_s' in last and 'gc_s' in first:
        result['gc_s_measured'] = round(last['gc_s'] - first['gc_s'], 3)
    compile_stats = compile_counters_logged(os.path.join(vdir, 'sft.log'))
    if compile_stats is not None:
        result['compile'] = compile_stats
    return result


def summarize_kept_logs(variant_dirs: List[str], summarize: Callable[[str, str], Dict[str, Any]]
                        ) -> Dict[str, Dict[str, Any]]:
    """--summarize-logs: each kept variant folder (named as its variant) through the benchmark's own summary."""
    dirs = [d.rstrip('/') for d in variant_dirs]
    return {os.path.basename(d): summarize(os.path.basename(d), d) for d in dirs}


def print_derived(benchmark: str, argv: Optional[List[str]], args, variants: Dict[str, Dict[str, Any]]) -> int:
    """Print --summarize-logs' result (kept as benchmarks/results/derived-*.json, never over the run's own file)."""
    print(json.dumps({'benchmark': benchmark, 'derived_from_logs': True,
                      'command': f'python benchmarks/{benchmark}.py ' + ' '.join(argv or sys.argv[1:]),
                      'steps': args.steps, 'warmup_steps': args.warmup_steps, 'variants': variants}, indent=1))
    return 0


def compile_counters_logged(log_path: str) -> Optional[Dict[str, Any]]:
    """Dynamo's counters that compile_layers logs after step 1 (graphs, graph breaks by reason), or None: a graph
    break inside the compiled layers is a slowdown the step times alone do not explain (the first FP8 run on the
    H200 had 24)."""
    import ast

    from swift_vora.speed.compile_layers import COUNTERS_LOG_PREFIX
    try:
        with open(log_path, errors='replace') as f:
            for line in f:
                at = line.find(COUNTERS_LOG_PREFIX)
                if at >= 0:
                    return ast.literal_eval(line[at + len(COUNTERS_LOG_PREFIX):].strip())
    except (OSError, ValueError, SyntaxError):
        return None
    return None


def real_tokens(result: Dict[str, Any]) -> float:
    """Tokens per sample without the tail padding of swift_vora/speed/shape_bucket.py (the work a sample is)."""
    return (result.get('tokens_per_sample') or 0) - (result.get('tail_padding_per_sample') or 0)


def _mean(values):
    return round(sum(values) / len(values), 1) if values else None


def flops_per_sample(shape_name: str, tokens: float, video_tokens: float, supervised: float, grid) -> Dict[str, float]:
    """Model FLOPs of one sample (see the module docstring); `grid` = one video's [t, h, w] in patches."""
    from swift_vora.tiny_model import QWEN3_VL_SHAPES, qwen3_vl_param_counts
    shape = QWEN3_VL_SHAPES[shape_name]
    n = qwen3_vl_param_counts(shape)
    t_groups, gh, gw = grid
    patches_per_group = gh * gw
    patches = t_groups * patches_per_group
    lora_r = 8
    # LoRA on every LLM linear (q,k,v,o,gate,up,down): r * (in + out) per linear.
    h, hd = shape.hidden_size, shape.head_dim
    per_layer = [(h, shape.num_heads * hd), (h, shape.num_kv_heads * hd), (h, shape.num_kv_heads * hd),
                 (shape.num_heads * hd, h), (h, shape.intermediate_size), (h, shape.intermediate_size),
                 (shape.intermediate_size, h)]
    n_lora = shape.num_layers * sum(lora_r * (a + b) for a, b in per_layer)
    parts = {
        'vision_matmul': 2 * n['vision_matmul'] * patches,
        'vision_attention': shape.vision_depth * 4 * t_groups * patches_per_group ** 2 * n['vision_attn_dim'],
        'merger': 2 * n['merger'] * video_tokens,
        'llm_matmul': 4 * n['llm_matmul'] * tokens,
        'lora': 6 * n_lora * tokens,
        'llm_attention': 6 * shape.num_layers * tokens ** 2 * n['attn_dim'],
        'lm_head': 4 * n['lm_head'] * supervised,
    }
    parts['total'] = sum(parts.values())
    return parts


def parallel_gpus(parallel: int, smoke: bool) -> List[Optional[str]]:
    """The device index each of `parallel` side-by-side variants gets ([None]: one variant at a time). Indices are
    into the GPUs this process sees (CUDA_VISIBLE_DEVICES, if set, is mapped through)."""
    if parallel < 1:
        raise SystemExit(f'--parallel {parallel}: at least 1')
    if parallel == 1:
        return [None]
    visible = [d.strip() for d in os.environ.get('CUDA_VISIBLE_DEVICES', '').split(',') if d.strip()]
    if not smoke:
        import torch
        count = torch.cuda.device_count()
        if count < parallel:
            raise SystemExit(f'--parallel {parallel}: only {count} GPU(s) visible')
    return visible[:parallel] if len(visible) >= parallel else [str(i) for i in range(parallel)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--smoke', action='store_true', help='CPU: tiny model, 2 clips, a few steps, float32')
    parser.add_argument('--out', default=os.environ.get('OUT') or None,
                        help='folder for logs and a copy of the JSON (default: $OUT, else the work dir)')
    parser.add_argument('--work', default=None,
                        help='work dir (model, clips, runs); default: <temp dir>/swift_vora_bench')
    parser.add_argument('--results-dir', default=os.path.join(REPO, 'benchmarks', 'results'))
    parser.add_argument('--variants', default='baseline,vora')
    parser.add_argument('--clips', type=int, default=None, help='distinct clips (default: one per sample)')
    parser.add_argument('--steps', type=int, default=None, help='optimizer steps per variant (default 14; smoke 2)')
    parser.add_argument('--grad-accum', type=int, default=None, help='gradient accumulation (default 4; smoke 1)')
    parser.add_argument('--warmup-steps', type=int, default=None, help='steps not timed (default 2; smoke 1)')
    parser.add_argument('--workers-baseline', type=int, default=None, help='default 4 (smoke 1)')
    parser.add_argument('--workers-vora', type=int, default=None, help='default 12 (smoke 1)')
    parser.add_argument('--profile-seconds', type=int, default=None,
                        help='py-spy window inside the timed steps, seconds (default 0 = off)')
    parser.add_argument('--torch-profile', default='',
                        help='comma list of variants that run one extra optimizer step after the measured ones '
                             'under torch.profiler (CPU + CUDA): torch_profile.txt / .json (GPU time by kernel '
                             'family) next to the log; the extra step is not counted')
    parser.add_argument('--sync-debug', default='',
                        help='comma list of variants that run one more extra step with torch\'s CUDA sync debug mode '
                             'on: syncs.json counts the synchronising calls made from Python, by call site')
    parser.add_argument('--parallel', type=int, default=1,
                        help='run this many variants side by side, one GPU each (a machine with that many GPUs); '
                             'default 1: one at a time')
    parser.add_argument('--name', default='throughput', help='results file name prefix (default throughput)')
    parser.add_argument('--model-dir', default=None, help='reuse a built model directory')
    parser.add_argument('--variant-timeout', type=float, default=None, help='seconds per swift sft (default none)')
    parser.add_argument('--summarize-logs', metavar='VARIANT_DIR', nargs='+', default=None,
                        help="no run: the measured steps of variants' kept logs (VARIANT_DIR/progress.jsonl, "
                             "encode.jsonl, output/logging.jsonl, e.g. from a logs-throughput.tgz), printed as a "
                             "result file's variants with the FP8 comparison; with the run's --steps/--warmup-steps")
    parser.add_argument('--deadline', type=float, default=None,
                        help='seconds from start after which running swift processes are killed and the results '
                             'so far written (run_all.sh sets it from the device tool\'s 10-minute limit)')
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run atexit: kill the swift process groups
    smoke = args.smoke
    args.steps = args.steps or (2 if smoke else 14)
    args.grad_accum = args.grad_accum or (1 if smoke else 4)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (1 if smoke else 2)
    args.workers_baseline = args.workers_baseline if args.workers_baseline is not None else (1 if smoke else 4)
    args.workers_vora = args.workers_vora if args.workers_vora is not None else (1 if smoke else 12)
    # py-spy off unless asked: a sampler inside the timed window can only cost a host-limited step;
    # --torch-profile profiles an extra step outside the window instead.
    args.profile_seconds = args.profile_seconds or 0
    specs = variant_specs(smoke, args.workers_baseline, args.workers_vora)
    if args.summarize_logs:  # derived figures, from logs a run kept (its result file stays as written)
        args.torch_profile, args.sync_debug = [], []
        derived = summarize_kept_logs(args.summarize_logs, lambda name, vdir: summarize_variant(
            name, vdir, args, None, None, None, batch_size=(specs.get(name) or {}).get('batch_size', 1)))
        compare_fp8(derived)
        return print_derived('throughput', argv, args, derived)
    variants = [v.strip() for v in args.variants.split(',') if v.strip()]
    unknown = [v for v in variants if v not in specs]
    if unknown:
        raise SystemExit(f'unknown variant(s) {unknown}; known: {sorted(specs)}')
    # One distinct clip per timed sample of the variant with the most samples per step (a larger micro-batch may
    # hold more than the gradient accumulation does)
    per_step = max([samples_per_step(args.grad_accum, specs[v].get('batch_size', 1)) for v in variants] or [1])
    args.clips = args.clips or args.steps * per_step
    if not smoke and not cuda_available():
        raise SystemExit('no CUDA device: run with --smoke on CPU')
    work = args.work or os.path.join(tempfile.gettempdir(), 'swift_vora_bench_smoke' if smoke else 'swift_vora_bench')
    os.makedirs(work, exist_ok=True)
    out = args.out or work
    sys.path.insert(0, REPO)

    t0 = time.time()
    inputs = build_inputs(args, work)
    print(f'inputs ready in {time.time() - t0:.0f} s: model {inputs["build_model_s"]} s, '
          f'clips {inputs["make_clips_s"]} s', flush=True)
    args.torch_profile = [v.strip() for v in args.torch_profile.split(',') if v.strip()]
    args.sync_debug = [v.strip() for v in args.sync_debug.split(',') if v.strip()]
    results: Dict[str, Dict[str, Any]] = {}
    errors: Dict[str, str] = {}
    gpus = parallel_gpus(args.parallel, smoke)
    for group in [variants[i:i + len(gpus)] for i in range(0, len(variants), len(gpus))]:
        print(f'== {", ".join(group)}', flush=True)
        if args.deadline is not None:
            left = args.deadline - (time.time() - t0) - 10
            if left < 60:
                for name in group:
                    errors[name] = f'skipped: {left:.0f} s left before the deadline'
                    print(f'{name}: {errors[name]}', file=sys.stderr, flush=True)
                continue
            args.variant_timeout = min(args.variant_timeout or left, left)
        if len(gpus) == 1:  # one at a time on the default device (py-spy possible)
            started = {group[0]: None}
        else:  # side by side, one GPU each: started together, then waited for
            started = {name: start_variant(name, args, specs[name], inputs, work, gpu=gpu, slot=slot)
                       for slot, (name, gpu) in enumerate(zip(group, gpus))}
        for name, handle in started.items():
            try:
                results[name] = (run_variant(name, args, specs[name], inputs, work) if handle is None
                                 else finish_variant(handle, args))
            except SystemExit as exc:  # one failed variant must not cost the others' numbers
                errors[name] = str(exc)
                print(f'{name}: FAILED: {exc}', file=sys.stderr, flush=True)
                continue
            finally:
                _copy_logs(os.path.join(work, name), out, name)
            r = results[name]
            print(f'{name}: {r["samples_per_s"]} samples/s ({r["s_per_sample"]} s/sample), '
                  f'{r["tokens_per_sample"]} tokens/sample, peak reserved {r["peak_reserved_gib"]} GiB, '
                  f'data wait {r["data_wait_fraction"]}, wall {r["wall_s"]} s', flush=True)

    # Same work per sample? (the tokens of both paths, read from the encode logs)
    checks = {}
    if 'baseline' in results:
        base = results['baseline']
        for name, r in results.items():
            if name == 'baseline' or specs[name].get('other_budget'):
                continue
            same_video = base['video_tokens_per_sample'] == r['video_tokens_per_sample']
            rel = abs(real_tokens(r) - real_tokens(base)) / max(1, real_tokens(base))
            checks[name] = {'video_tokens_equal': same_video, 'total_tokens_rel_diff': round(rel, 4)}
            if not same_video or rel > 0.01:
                print(f'WARNING: {name} encodes {r["tokens_per_sample"]} tokens ({r["video_tokens_per_sample"]} video) '
                      f'per sample, baseline {base["tokens_per_sample"]} ({base["video_tokens_per_sample"]})',
                      file=sys.stderr)

    compare_fp8(results)
    shape_name = 'tiny' if smoke else '2b'
    mfu = {}
    flops = None
    for name, r in results.items():
        if not (r.get('tokens_per_sample') and r.get('video_grid_thw') and r.get('samples_per_s')):
            continue
        flops = flops_per_sample(shape_name, real_tokens(r), r['video_tokens_per_sample'] or 0,
                                 r['supervised_tokens_per_sample'] or 0, r['video_grid_thw'][0])
        r['model_flops_per_sample'] = flops
        r['mfu'] = round(flops['total'] * r['samples_per_s'] / PEAK_BF16_FLOPS, 4)
        mfu[name] = r['mfu']

    def pick(name, key):
        return results.get(name, {}).get(key)

    payload = {
        'benchmark': 'throughput',
        'date': _dt.datetime.now().isoformat(timespec='seconds'),
        'smoke': smoke,
        'gpu': hardware().get('gpu'),
        'hardware': hardware(),
        'model': {'shape': shape_name, 'dir': inputs['model'], 'build_s': inputs['build_model_s']},
        'clips': {'count': args.clips, 'seconds': 8.0 if smoke else 32.0, 'size': [128, 96] if smoke else [640, 360],
                  'fps': 4.0 if smoke else 8.0, 'codec': 'mp4v', 'make_s': inputs['make_clips_s']},
        'command': ('python benchmarks/throughput.py' + (' --smoke' if smoke else '') + ' '
                    + ' '.join(argv or sys.argv[1:])),
        'baseline_command': pick('baseline', 'command'),
        'peak_gib_source': 'torch.cuda.max_memory_reserved in the trainer (what swift logs as memory(GiB)); '
                           'allocated and swift\'s own value are in variants',
        'mfu': mfu,
        'mfu_peak_flops': PEAK_BF16_FLOPS,
        'flops_formula': 'F = 2*N_vit*P + L_vit*4*sum_g(p_g^2)*d_vit + 2*N_merger*V + 4*N_llm*T + 6*N_lora*T '
                         '+ 6*L*T^2*d_attn + 4*h*vocab*S; MFU = F * samples_per_s / 790e12 '
                         '(frozen ViT/merger forward only; frozen LLM weights forward + activation-grad backward; '
                         'recomputation not counted)',
        'model_flops_per_sample': flops,
        'parallel': args.parallel,
        'token_checks': checks,
        'variants': results,
        'errors': errors,
        'total_wall_s': round(time.time() - t0, 1),
    }
    apply_headline(payload)
    path = write_results(payload, args.results_dir if not smoke else os.path.join(work, 'results'), args.name,
                         out)
    print(json.dumps({k: payload[k] for k in ('gpu', 'baseline_samples_per_s', 'swift_vora_samples_per_s', 'speedup',
                                               'baseline_peak_gib', 'swift_vora_peak_gib', 'baseline_variant',
                                               'speedup_vs_strongest', 'any_memory', 'mfu', 'token_checks',
                                               'total_wall_s')}, indent=1))
    print(f'wrote {path}')
    return 1 if errors else 0


# An FP8 variant is its bf16 twin's name + FP8_SUFFIX (+ one of FP8_TWIN_QUALIFIERS, an FP8 setting): the same flags,
# seed and samples, SWIFT_VORA_FP8 (and that setting) added
FP8_SUFFIX = '_fp8'
FP8_TWIN_QUALIFIERS = {'_exact': {'SWIFT_VORA_FP8_ACCUM': 'exact'}}


def fp8_twin(name: str) -> Optional[str]:
    """The bf16 twin of an FP8 variant's name, or None for a name that is not an FP8 variant."""
    for qualifier in ('', *FP8_TWIN_QUALIFIERS):
        if name.endswith(FP8_SUFFIX + qualifier):
            return name[:len(name) - len(FP8_SUFFIX + qualifier)]
    return None


def loss_max_rel_diff(fp8: List[float], bf16: List[float]) -> Optional[float]:
    """The largest relative difference of the logged losses, step by step (None without a common step)."""
    pairs = [(a, b) for a, b in zip(fp8, bf16) if b]
    return round(max(abs(a - b) / abs(b) for a, b in pairs), 5) if pairs else None


def compare_fp8(results: Dict[str, Dict[str, Any]]) -> None:
    """`fp8: true` on every FP8 variant and, where its bf16 twin ran in the same call, the largest relative
    difference of their logged losses (the issue's 'within 2 % at every logged step') and its rate over the twin's
    (`samples_per_s_vs_bf16`, the benchmark's samples/s over the measured window on both)."""
    for name in [n for n in results if fp8_twin(n)]:
        twin = fp8_twin(name)
        results[name]['fp8'] = True
        results[name]['fp8_twin'] = twin
        if twin in results:
            results[name]['loss_max_rel_diff_vs_bf16'] = loss_max_rel_diff(results[name].get('losses', []),
                                                                           results[twin].get('losses', []))
            rate, twin_rate = results[name].get('samples_per_s'), results[twin].get('samples_per_s')
            results[name]['samples_per_s_vs_bf16'] = round(rate / twin_rate, 4) if rate and twin_rate else None


HEADLINE_RULE = ('memory budget = the peak reserved memory of `baseline` (plain swift sft as gpu-machine.md runs it); '
                 'swift_vora_* = the fastest swift-vora variant (vora*, not cal_*) within the budget; speedup = its '
                 'rate over `baseline`\'s; baseline_variant = the fastest plain-swift variant (baseline*) within the '
                 'same budget -- every plain variant at no more memory than ours is a candidate, and so is one using '
                 'more than ours but no more than the default -- and speedup_vs_strongest = ours over it; '
                 'any_memory = the fastest swift-vora variant against the fastest plain-swift variant, memory '
                 'and micro-batch free on both sides; fastest_any_memory = the fastest swift-vora variant against '
                 '`baseline`')


def _fastest(variants: Dict[str, Dict[str, Any]], prefix: str, budget_gib: Optional[float] = None) -> Optional[str]:
    """The name of the fastest measured variant starting with `prefix` whose peak reserved memory is within
    `budget_gib` (None: any memory; a variant without a measured peak passes only then)."""
    fits = {n: v for n, v in variants.items() if n.startswith(prefix) and v.get('samples_per_s')
            and (budget_gib is None or (v.get('peak_reserved_gib') is not None
                                        and v['peak_reserved_gib'] <= budget_gib))}
    return max(fits, key=lambda n: fits[n]['samples_per_s']) if fits else None


def _ratio(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[float]:
    return round(a['samples_per_s'] / b['samples_per_s'], 3) if a.get('samples_per_s') and b.get('samples_per_s') \
        else None


def _brief(variants: Dict[str, Dict[str, Any]], name: Optional[str]) -> Optional[Dict[str, Any]]:
    v = variants.get(name) if name else None
    return {'variant': name, 'samples_per_s': v['samples_per_s'], 'peak_gib': v.get('peak_reserved_gib'),
            'batch_size': v.get('batch_size', 1), 'mfu': v.get('mfu')} if v else None


def apply_headline(payload: Dict[str, Any]) -> Dict[str, Any]:
    """Fill the headline fields of a results payload from its variants (HEADLINE_RULE)."""
    variants = payload.get('variants') or {}
    base = variants.get('baseline') or {}
    budget = base.get('peak_reserved_gib')
    # Without a measured budget (a CPU smoke, or no `baseline` run) every variant is within it.
    name = _fastest(variants, 'vora', budget)  # budget None (no measured baseline peak): any memory
    strongest = _fastest(variants, 'baseline', budget)
    fastest = _fastest(variants, 'vora')
    head = variants.get(name) or {}
    plain = variants.get(strongest) or {}
    best_plain = _fastest(variants, 'baseline')
    payload.update({
        'headline_rule': HEADLINE_RULE,
        'baseline_samples_per_s': base.get('samples_per_s'),
        'swift_vora_variant': name,
        'swift_vora_command': head.get('command'),
        'swift_vora_samples_per_s': head.get('samples_per_s'),
        'swift_vora_mfu': head.get('mfu'),
        'speedup': _ratio(head, base),
        'baseline_tokens_per_s': base.get('tokens_per_s'),
        'swift_vora_tokens_per_s': head.get('tokens_per_s'),
        'baseline_peak_gib': base.get('peak_reserved_gib'),
        'swift_vora_peak_gib': head.get('peak_reserved_gib'),
        'baseline_variant': strongest,
        'baseline_variant_command': plain.get('command'),
        'baseline_variant_samples_per_s': plain.get('samples_per_s'),
        'baseline_variant_peak_gib': plain.get('peak_reserved_gib'),
        'speedup_vs_strongest': _ratio(head, plain),
        'any_memory': {'ours': _brief(variants, fastest), 'baseline': _brief(variants, best_plain),
                       'speedup': _ratio(variants.get(fastest) or {}, variants.get(best_plain) or {}),
                       'mfu': (variants.get(fastest) or {}).get('mfu')},
        'fastest_any_memory': {'variant': fastest, 'samples_per_s': variants[fastest]['samples_per_s'],
                               'peak_gib': variants[fastest].get('peak_reserved_gib'),
                               'speedup': _ratio(variants[fastest], base)} if fastest else None,
    })
    return payload


def _copy_logs(vdir: str, out: str, name: str) -> None:
    """sft.log (and the py-spy raw profile) into OUT, flat, for the device tool's 8-file limit."""
    if not out or not os.path.isdir(vdir) or os.path.abspath(out) == os.path.abspath(os.path.dirname(vdir)):
        return
    os.makedirs(out, exist_ok=True)
    src = os.path.join(vdir, 'sft.log')
    if os.path.isfile(src):
        shutil.copy(src, os.path.join(out, f'throughput-{name}.log'))


if __name__ == '__main__':
    sys.exit(main())
