"""Every `SWIFT_VORA_*` environment switch in one table, read one way.

`SWITCHES` gives each switch's type, default, meaning and the recipe key that sets it (`env` = an entry of a
recipe's `env:` or `guards.env:` mapping; a dotted key = that recipe key, from which `swift-vora train` derives the
variable; none = not set from a recipe). `read(name)` is the only parser: an unset or empty variable gives the
default, anything it cannot read -- a typo such as `flase`, a negative count, a choice that does not exist --
raises `SwitchError` quoting `NAME=value` and what is accepted. `check_environment()` also refuses
`SWIFT_VORA_*` names that are not in the table (a misspelt switch would otherwise be ignored); the plugin runs it
when ms-swift imports it. `swift-vora switches` prints the table with the effective values (the user settings;
`--all` adds the switches of the benchmarks, the set-up scripts and the probes).

This module is a leaf: it imports nothing of swift-vora (its defaults are written here, and the dataclasses that
mirror switches take theirs from it), so every module may read a switch without an import circle. Importing it
imports neither torch nor ms-swift.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

PREFIX = 'SWIFT_VORA_'
COUNT_MAX = 10 ** 9  # no count a switch takes comes near; a 5000-digit one is refused, not carried along
WEEK_S = 7 * 24 * 3600.0
ON = ('1', 'true', 'yes', 'on')
OFF = ('0', 'false', 'no', 'off')
KINDS = ('flag', 'count', 'number', 'seconds', 'choice', 'text', 'path', 'guards')
# Who sets a switch: a user's training setting, or a switch of the benchmarks, the GPU set-up scripts, the probes'
# test hooks and what `swift-vora train` sets for its own process (`swift-vora switches` lists those with --all).
GROUPS = ('setting', 'tool')
ENV_KEY = 'env'  # recipe column: settable as an entry of the recipe's `env` (or `guards.env`)


class SwitchError(ValueError):
    """A switch set to a value it does not accept, or a `SWIFT_VORA_*` name that is not a switch."""


class Switch(NamedTuple):
    name: str
    kind: str  # one of KINDS
    default: Any  # what an unset or empty variable means (None: not set / decided where it is read)
    help: str
    recipe: Optional[str] = ENV_KEY  # the recipe key that sets it (see the module docstring)
    choices: Tuple[str, ...] = ()  # kind 'choice'
    aliases: Tuple[Tuple[str, str], ...] = ()  # kind 'choice': other spellings -> a choice
    unit: str = ''  # kind 'count': what is counted (for the error message)
    where: str = ''  # the module that reads it
    # kinds 'count', 'number', 'seconds': (lowest, highest, lowest allowed itself); every value is also finite.
    # The video budget's and the windows' are the recipe's RANGES for the same keys (tests/test_switches.py).
    bounds: Tuple[float, float, bool] = (0, COUNT_MAX, True)
    group: str = 'setting'  # one of GROUPS


# The defaults of the video budget and of the windows are the table's: swift_vora/budget.py's VideoBudget and
# swift_vora/data/windowing.py's WindowConfig take theirs from here, so the template, the dataset, the planner and
# `swift-vora switches` cannot disagree.
BUDGET_DEFAULTS = {'fps': 2.0, 'min_frames': 4, 'max_frames': 64, 'pair_tokens': 256, 'min_pair_tokens': 16,
                   'max_video_tokens': None}
WINDOW_DEFAULTS = {'window': 60.0, 'stride': None, 'min_event': 0.5}
# One SWIFT_VORA_GUARD_<NAME> switch per guard, in run order: the names of swift_vora/guards/registry.py's GUARDS
# (tests/test_switches.py keeps the two lists equal).
GUARD_NAMES = ('fingerprint', 'zero3_load', 'memory', 'coverage', 'supervision', 'lora_update', 'verify_adapter')


def _budget(field: str, help: str) -> Switch:
    default = BUDGET_DEFAULTS[field]
    if field == 'fps':
        return Switch(PREFIX + 'FPS', 'number', default, help, 'video.fps', where='budget.py', bounds=(0, 240, False))
    unit = 'tokens' if 'tokens' in field else 'frames'
    highest = 100_000 if unit == 'frames' else 1_000_000  # a frame pair of 0 tokens would plan "fits"
    return Switch(PREFIX + field.upper(), 'count', default, help, f'video.{field}', unit=unit, where='budget.py',
                  bounds=(1, highest, True))


def _window(field: str, help: str) -> Switch:
    kind = 'number' if field == 'min_event' else 'seconds'  # min_event has no 'none': 0 keeps every sliver
    bounds = {'window': (1, WEEK_S, True), 'stride': (0.1, WEEK_S, True), 'min_event': (0, 3600, True)}[field]
    return Switch(PREFIX + field.upper(), kind, WINDOW_DEFAULTS[field], help, f'data.{field}', where='dataset.py',
                  bounds=bounds)


def _guard_switches() -> List[Switch]:
    return [Switch(f'{PREFIX}GUARD_{name.upper()}', 'flag', None, f'1/0: the {name} guard on/off whatever '
                   f'{PREFIX}GUARDS says (unset: as it says)', where='guards/registry.py') for name in GUARD_NAMES]


def _table() -> Tuple[Switch, ...]:
    off_aliases = tuple((k, 'off') for k in ('0', 'false', 'no', 'none'))
    return (
        # --- video budget and windows (dataset and template) ----------------------------------------------------
        _budget('fps', 'frames sampled per second of clip'),
        _budget('min_frames', 'never fewer frames per clip'),
        _budget('max_frames', 'frame cap per clip'),
        _budget('pair_tokens', 'max tokens per frame pair (resolution)'),
        _budget('min_pair_tokens', 'lowest resolution a frame pair may be shrunk to'),
        Switch(PREFIX + 'MAX_VIDEO_TOKENS', 'count', None, 'hard cap on one clip\'s video tokens (0 or none: no cap)',
               'video.max_video_tokens', unit='tokens', where='budget.py', bounds=(1, 100_000_000, True)),
        _window('window', 'clip length in seconds (0 or none: whole videos)'),
        _window('stride', 'distance between clip starts in seconds (none: the window)'),
        _window('min_event', 'event slivers shorter than this (seconds) at clip edges are dropped'),
        Switch(PREFIX + 'VIDEO_ROOT', 'path', None, 'directory relative video paths are resolved against',
               'data.video_root', where='dataset.py'),
        Switch(PREFIX + 'ENCODE_LOG', 'path', None, 'JSONL file that gets one line per encoded sample',
               'train.output_dir', where='template.py'),
        Switch(PREFIX + 'LOG_FIRST', 'count', 3, 'encoded samples logged at INFO', unit='samples',
               where='template.py'),
        # --- guards ---------------------------------------------------------------------------------------------
        Switch(PREFIX + 'GUARDS', 'guards', 'all', 'all | none | a comma list of guards, -name removes one',
               where='guards/registry.py'),
        *_guard_switches(),
        Switch(PREFIX + 'TAIL', 'choice', 'pad', 'samples ms-swift would never train: pad | drop | stop',
               choices=('pad', 'drop', 'stop'), where='guards/coverage.py'),
        Switch(PREFIX + 'REPLICATE_TINY', 'flag', False, 'smoke tests: replicate a dataset smaller than the world '
               'size', where='guards/coverage.py'),
        Switch(PREFIX + 'LORA_CHECK_STEPS', 'count', 2, 'optimizer steps after which every adapter tensor must '
               'have changed (0 counts as 1)', unit='steps', where='guards/lora_update.py'),
        Switch(PREFIX + 'MEMORY_FIRST', 'count', 3, 'memory phases recorded on the first N optimizer steps',
               unit='steps', where='guards/memory.py'),
        Switch(PREFIX + 'MEMORY_EVERY', 'count', 50, 'then every N steps (0: only the first ones)', unit='steps',
               where='guards/memory.py'),
        Switch(PREFIX + 'ZERO3_LOAD', 'choice', 'auto', 'checkpoint-vs-parameter check: auto (under ZeRO-3) | '
               'always | never', choices=('auto', 'always', 'never'),
               aliases=tuple((k, 'never') for k in OFF) + tuple((k, 'always') for k in ON),
               where='guards/zero3_load.py'),
        Switch(PREFIX + 'VERIFY_TIMEOUT', 'number', 1800.0, 'seconds the adapter reload may take',
               where='guards/verify_adapter.py', bounds=(0, WEEK_S, False)),
        Switch(PREFIX + 'RECIPE', 'path', None, 'the recipe file hashed into fingerprint.json',
               'the recipe file itself', where='guards/fingerprint.py', group='tool'),
        Switch(PREFIX + 'RECIPE_OVERRIDES', 'text', None, 'JSON list of the key=value overrides applied over the '
               'recipe, recorded in fingerprint.json', 'the key=value overrides', where='guards/fingerprint.py',
               group='tool'),
        # --- speed levers (swift_vora/speed/) -------------------------------------------------------------------
        Switch(PREFIX + 'COMPILE', 'choice', 'off', 'regional torch.compile: off | layers',
               'train.compile', choices=('off', 'layers'), aliases=off_aliases, where='speed/compile_layers.py'),
        Switch(PREFIX + 'COMPILE_BACKEND', 'text', 'inductor', 'torch.compile backend',
               where='speed/compile_layers.py'),
        Switch(PREFIX + 'COMPILE_MODE', 'choice', 'default', 'inductor mode of the compiled layers: default | '
               'reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs',
               choices=('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs'),
               where='speed/compile_layers.py'),
        Switch(PREFIX + 'COMPILE_CHECKPOINT', 'choice', 'eager', 'gradient checkpointing around the compiled layer '
               '(eager) or inside its graph (graph)', choices=('graph', 'eager'), where='speed/compile_layers.py'),
        Switch(PREFIX + 'COMPILE_VISION', 'flag', True, 'with compiled layers, compile the vision blocks too',
               where='speed/compile_layers.py'),
        Switch(PREFIX + 'SELECTIVE_CHECKPOINT', 'choice', 'off', 'selective checkpointing of the checkpointed, '
               'uncompiled decoder layers: off | attention (save attention outputs) | matmul (save matmul and '
               'attention outputs); the pointwise ops are recomputed', choices=('off', 'attention', 'matmul'),
               aliases=off_aliases, where='speed/selective_checkpoint.py'),
        Switch(PREFIX + 'CHECKPOINT_LAYERS', 'count', None, 'with gradient checkpointing: checkpoint only the first N '
               'decoder layers, the others keep their activations (unset: all)', 'train.checkpoint_layers',
               unit='layers', where='speed/partial_checkpoint.py', bounds=(0, 100_000, True)),
        Switch(PREFIX + 'FP8', 'choice', 'off', 'FP8 GEMMs (torchao) for the frozen base linears of the decoder '
               'layers, weights held in FP8: off | frozen_base (GPUs with compute capability 8.9+; not under '
               'ZeRO-3, Megatron or Unsloth)', 'train.fp8', choices=('off', 'frozen_base'), aliases=off_aliases,
               where='speed/fp8_frozen.py'),
        Switch(PREFIX + 'FP8_EMULATE', 'flag', False, 'with FP8 on: emulate the FP8 casts in high precision where '
               'there are no FP8 tensor cores (checks on a CPU; no speed)', where='speed/fp8_frozen.py'),
        Switch(PREFIX + 'FP8_ACCUM', 'choice', 'fast', 'with FP8 on: accumulation of the forward FP8 GEMM: fast '
               '(torchao\'s default recipe: Hopper\'s fast accumulation) | exact (full-precision accumulation, as '
               'the input gradient always has)', choices=('fast', 'exact'), where='speed/fp8_frozen.py'),
        Switch(PREFIX + 'MOE_LORA_SCALE', 'choice', 'output', 'Unsloth MoE expert LoRA: scaling applied to the expert '
               'output (output, unsloth_zoo as it is) | to the rank-r intermediate (rank: same product, fewer kernels)',
               choices=('output', 'rank'), where='speed/moe_lora_scale.py'),
        Switch(PREFIX + 'MOE_DOWN_LORA', 'choice', 'add', 'Unsloth MoE expert down projection\'s LoRA: add '
               '(unsloth_zoo as it is: base GEMM, B product, addition) | fold (one grouped GEMM over '
               '[inter | s inter A] x [W_down ; B])', choices=('add', 'fold'), where='speed/moe_down_fold.py'),
        Switch(PREFIX + 'MOE_GATE_GRAD', 'choice', 'eager', 'Unsloth MoE gate-gradient identity\'s fp32 dot product: '
               'eager (unsloth_zoo as it is: fp32 copies, product, sum) | fused (one compiled reduction)',
               choices=('eager', 'fused'), where='speed/moe_gate_grad.py'),
        Switch(PREFIX + 'MOE_GATHER', 'choice', 'index', 'Unsloth MoE routed-row gather in eager mode: index '
               '(unsloth_zoo as it is: indexing, a sort-based backward) | permutation (unsloth_zoo\'s '
               '_RoutedRowGather: the backward undoes the permutation and sums over top_k)',
               choices=('index', 'permutation'), where='speed/moe_gather.py'),
        Switch(PREFIX + 'GDN_QK_HEADS', 'choice', 'repeat', 'Gated DeltaNet query and key under the Unsloth runner: '
               'repeat (transformers as it is: repeated to the value heads) | grouped (handed to fla\'s kernel at '
               'their own head count; it reads each for its group of value heads)', choices=('repeat', 'grouped'),
               where='speed/gdn_qk_heads.py'),
        Switch(PREFIX + 'DIST_TIMEOUT', 'number', 1800.0, 'Unsloth runner on several processes: seconds a rank '
               'waits for the others in a collective before the run stops (the process group\'s timeout; '
               '`swift sft`\'s ddp_timeout default)', where='backends/data_parallel.py', bounds=(0, WEEK_S, False)),
        Switch(PREFIX + 'STEP_SYNC', 'choice', 'each', 'Unsloth runner, CUDA: synchronise after each optimizer step '
               '(each) | keep one step in flight and record it one step late (lagged)', choices=('each', 'lagged'),
               where='backends/step_ends.py'),
        Switch(PREFIX + 'VISION_PREAMBLE', 'choice', 'model', 'vision tower preamble (interpolation, position ids, '
               'cu_seqlens): model (computed by the tower, 14 syncs a step) | prefetch (on the prefetch thread, '
               'Unsloth runner)', choices=('model', 'prefetch'), where='speed/vision_preamble.py'),
        Switch(PREFIX + 'VIT_ATTENTION', 'choice', 'batched', 'vision attention: batched (one call per layer, no '
               'sync) | transformers', choices=('batched', 'transformers'), where='speed/vit_attention.py'),
        Switch(PREFIX + 'PATCH_EMBED', 'choice', 'gemm', 'vision patch embedding: gemm (the stride == kernel Conv3d '
               'as one matrix product) | conv (torch\'s Conv3d)', choices=('gemm', 'conv'),
               where='speed/patch_embed.py'),
        Switch(PREFIX + 'PACKED_ATTENTION', 'flag', True, 'register the vora_varlen attention (--attn_impl '
               'vora_varlen with --padding_free/--packing: packed rows without flash-attn)',
               where='speed/packed_attention.py'),
        Switch(PREFIX + 'LORA_AUTOCAST_INPUTS', 'flag', True, 'LoRA inputs stay in the autocast dtype',
               where='speed/lora_autocast.py'),
        Switch(PREFIX + 'HOST_OVERHEAD', 'flag', True, 'the four host-overhead fixes of the training loop',
               where='speed/host_overhead.py'),
        Switch(PREFIX + 'PAD_MULTIPLE', 'count', None, 'training encodes padded to a multiple of N tokens (unset: 64 '
               'with compiled layers, else 0 = off)', unit='tokens (0 = off)', where='speed/shape_bucket.py'),
        Switch(PREFIX + 'PIXEL_DTYPE', 'choice', 'model', 'pixels handed over in the model\'s dtype (model) or '
               'float32', choices=('model', 'float32'), aliases=tuple((k, 'float32') for k in OFF),
               where='speed/pixel_dtype.py'),
        Switch(PREFIX + 'DECODE_THREADS', 'count', 1, 'decord threads per video reader (0: decord\'s default)',
               unit='threads (0 = decord default)', where='speed/video_decode.py'),
        # --- doctor / plan probes -------------------------------------------------------------------------------
        Switch(PREFIX + 'CGROUP_ROOT', 'path', '/sys/fs/cgroup', 'cgroup filesystem root the probes read', None,
               where='plan/probe.py', group='tool'),
        Switch(PREFIX + 'MEMINFO', 'path', '/proc/meminfo', 'the meminfo file the probes read', None,
               where='plan/probe.py', group='tool'),
        Switch(PREFIX + 'PROBE_TORCH', 'flag', True, 'probe GPUs through torch.cuda (0: nvidia-smi only)', None,
               where='plan/probe.py'),
        Switch(PREFIX + 'TRACEBACK', 'flag', False, 'print the traceback of an unexpected error in a swift-vora '
               'command (otherwise one line and exit 1)', None, where='cli.py'),
        Switch(PREFIX + 'CACHE_DIR', 'path', None, 'Unsloth runner: the folder under which Triton, inductor and '
               'Unsloth keep compiled kernels and autotuning results between launches (unset: $XDG_CACHE_HOME/'
               'swift_vora, else ~/.cache/swift_vora)', where='backends/kernel_cache.py'),
        Switch(PREFIX + 'MEGATRON_FLA', 'choice', 'off', 'megatron sft, Gated DeltaNet models: which flash-linear-'
               'attention the GatedDeltaNet layers bind -- off (upstream\'s imports) | auto (unsloth_zoo\'s vendored '
               'fla on a Hopper GPU with Triton < 3.7.1, refused without it; set by the launch for such models) | '
               'vendored', choices=('off', 'auto', 'vendored'), aliases=off_aliases,
               where='backends/megatron_fla.py'),
        Switch(PREFIX + 'MEGATRON_PREFETCH', 'choice', 'epochs', 'megatron sft: the training DataLoader\'s workers '
               'keep encoding across the end of each epoch -- epochs (the launch names the vora_epoch_prefetch '
               'callback) | off (Megatron-SWIFT\'s loader as it is: the first step of every epoch waits for its '
               'micro-batch to be encoded)', choices=('epochs', 'off'), aliases=off_aliases,
               where='backends/megatron_prefetch.py'),
        Switch(PREFIX + 'MEGATRON_EXPERT_LORA', 'choice', 'te', 'megatron sft, MoE LoRA: how an expert layer\'s LoRA '
               'factors compute -- te (mcore-bridge\'s Transformer Engine grouped linears: one GEMM per expert) | '
               'grouped_mm (one torch._grouped_mm per product for all experts; bf16 on compute capability 9.0+)',
               choices=('te', 'grouped_mm'), where='backends/megatron_expert_lora.py'),
        Switch(PREFIX + 'MEGATRON_EXPERT_BASE', 'choice', 'te', 'megatron sft, MoE LoRA: how the frozen experts '
               'under an expert LoRA compute -- te (megatron-core\'s Transformer Engine grouped linears) | '
               'grouped_mm (the experts\' weights stacked once, one torch._grouped_mm per product; bf16 on compute '
               'capability 9.0+)',
               choices=('te', 'grouped_mm'), where='backends/megatron_expert_base.py'),
        Switch(PREFIX + 'MEGATRON_OPTIMIZER', 'choice', 'per_tensor', 'megatron sft: what the distributed '
               'optimizer steps over -- per_tensor (megatron-core\'s: one tensor per parameter) | coalesced (one '
               'view per run of consecutive parameters in a gradient buffer: the same updates, far fewer tensors '
               'for the host to walk; needs the precision-aware optimizer and --no_save_optim true, else it stays '
               'per tensor)', choices=('per_tensor', 'coalesced'), where='backends/megatron_coalesced_optimizer.py'),
        # --- benchmark and GPU-script tools (not read by the plugin) --------------------------------------------
        Switch(PREFIX + 'BENCH_DIR', 'path', None, 'benchmarks/throughput.py: where its probes write', None,
               where='benchmarks/throughput.py', group='tool'),
        Switch(PREFIX + 'PROFILE_STEP', 'count', None, 'Unsloth runner and megatron sft: torch.profiler over '
               'optimizer step N, with its host syncs by call site (torch_profile.txt / .json in the output dir; '
               'megatron sft also the chrome trace, torch_trace.json.gz); megatron sft: set at all (0 included), '
               'every step\'s data wait in data_wait.rank{R}.jsonl', unit='steps',
               where='backends/step_profile.py, backends/megatron_profile.py'),
        Switch(PREFIX + 'BENCH_TORCH_PROFILE', 'count', None, 'benchmarks/throughput.py: profile optimizer step N',
               None, unit='steps', where='benchmarks/throughput.py', group='tool'),
        Switch(PREFIX + 'BENCH_SYNC_DEBUG', 'count', None, 'benchmarks/throughput.py: count syncs of step N', None,
               unit='steps', where='benchmarks/throughput.py', group='tool'),
        Switch(PREFIX + 'FLA_PATH', 'path', None, 'benchmarks/moe_throughput.py: folder holding flash-linear-attention '
               '(added to PYTHONPATH by its *_fla variants)', None, where='benchmarks/moe_throughput.py', group='tool'),
        Switch(PREFIX + 'PYTHON', 'path', 'python3', 'scripts/gpu/setup_env.sh: interpreter', None,
               where='scripts/gpu/setup_env.sh', group='tool'),
        Switch(PREFIX + 'WHEELS', 'path', None, 'scripts/gpu/setup_env.sh: wheel folder', None,
               where='scripts/gpu/setup_env.sh', group='tool'),
        Switch(PREFIX + 'SITE', 'path', None, 'scripts/gpu/setup_env.sh: target folder', None,
               where='scripts/gpu/setup_env.sh', group='tool'),
        Switch(PREFIX + 'MEGATRON_WHEELS', 'path', None, 'scripts/gpu/setup_megatron.sh: the Megatron wheel folder '
               '(default .whl/megatron)', None, where='scripts/gpu/setup_megatron.sh', group='tool'),
        Switch(PREFIX + 'TE_PARTS', 'path', None, 'scripts/gpu/setup_megatron.sh: folder holding .te0-.te2 '
               '(default the repository root)', None, where='scripts/gpu/setup_megatron.sh', group='tool'),
        Switch(PREFIX + 'TE_READY', 'path', None, 'scripts/gpu/setup_megatron.sh: folder of a ready Transformer Engine '
               'core wheel and its SHA256SUMS, as scripts/gpu/wheel_pack.py unpacks it (default .whl/megatron-te)',
               None, where='scripts/gpu/setup_megatron.sh', group='tool'),
        Switch(PREFIX + 'TE_WORK', 'path', None, 'scripts/gpu/setup_megatron.sh: where the Transformer Engine wheel is '
               'reassembled (default $TMPDIR/swift_vora_te, /tmp without TMPDIR)', None,
               where='scripts/gpu/setup_megatron.sh', group='tool'),
        Switch(PREFIX + 'MEGATRON_SITE', 'path', None, 'scripts/gpu/setup_megatron.sh: install target (default '
               '$TMPDIR/site-megatron, /tmp without TMPDIR)', None, where='scripts/gpu/setup_megatron.sh',
               group='tool'),
        Switch(PREFIX + 'GDN_CHECK', 'choice', 'run', 'scripts/gpu/run_all.sh megatron_moe: the Gated DeltaNet '
               'gradient check before the Megatron runs (run) | skip it (~150 s of cold Triton compile; it passed on '
               'every run of this wheel set, benchmarks/results/gdn-grad-check-*.json)', choices=('run', 'skip'),
               where='scripts/gpu/run_all.sh', group='tool'),
    )


_TABLE: Optional[Dict[str, Switch]] = None


def table() -> Dict[str, Switch]:
    """name -> Switch, in the order above (built on first use)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = {s.name: s for s in _table()}
    return _TABLE


def default(name: str) -> Any:
    """What switch `name` means when its variable is unset (the defaults of the dataclasses that mirror switches)."""
    return switch(name).default


def switch(name: str) -> Switch:
    try:
        return table()[name]
    except KeyError:
        raise SwitchError(f'{name}: not a swift-vora switch{_suggest(name)}') from None


def _suggest(name: str) -> str:
    # compared without the shared prefix, which would make every name look close
    close = difflib.get_close_matches(name[len(PREFIX):] if name.startswith(PREFIX) else name,
                                      [n[len(PREFIX):] for n in table()], n=1, cutoff=0.6)
    return f' (did you mean {PREFIX}{close[0]}?)' if close else ''


def parse(name: str, raw: Optional[str]) -> Any:
    """The value of switch `name` given the variable's text (None or blank: the default)."""
    s = switch(name)
    if raw is None or not str(raw).strip():
        return s.default
    text = str(raw).strip()
    lower = text.lower()
    if s.kind == 'flag':
        if lower in ON:
            return True
        if lower in OFF:
            return False
        raise SwitchError(f'{name}={_shown(text)}: expected one of {", ".join(ON + OFF)}')
    if s.kind == 'count':
        if name == PREFIX + 'MAX_VIDEO_TOKENS' and lower in ('none', '0'):
            return None
        try:
            value = int(text) if len(text) <= 30 else None  # 5000 digits: refused here, not by int()'s limit
        except ValueError:
            value = None
        if value is None:
            raise SwitchError(f'{name}={_shown(text)}: expected a whole number of {s.unit}')
        return _in_bounds(s, value, text)
    if s.kind in ('number', 'seconds'):
        if s.kind == 'seconds' and lower in ('none', '0'):
            return None
        try:
            value = float(text)
        except ValueError:
            raise SwitchError(f'{name}={_shown(text)}: expected a number') from None
        if not math.isfinite(value):  # inf would be planned with and printed as Infinity, which is not JSON
            raise SwitchError(f'{name}={_shown(text)}: expected a finite number')
        return _in_bounds(s, value, text)
    if s.kind == 'guards':
        return _guard_list(name, lower)
    if s.kind == 'choice':
        value = dict(s.aliases).get(lower, lower)
        if value not in s.choices:
            raise SwitchError(f'{name}={_shown(lower)}: expected one of {", ".join(s.choices)}')
        return value
    return text if s.kind == 'text' else str(raw)


def _guard_list(name: str, text: str) -> str:
    """A guard selection (`all`, `none`, names, `-name`; swift_vora/guards/registry.py reads it), checked here so
    that a typo stops every command and the launch, not the trainer after the model has loaded."""
    words = ('all', 'none', *GUARD_NAMES)
    for token in (t.strip() for t in text.split(',')):
        if not token:
            continue
        guard = token[1:] if token.startswith('-') else token
        if guard in GUARD_NAMES or (guard == token and guard in ('all', 'none')):
            continue
        close = difflib.get_close_matches(guard, words, n=1, cutoff=0.6)
        hint = f' (did you mean {"-" if token.startswith("-") else ""}{close[0]}?)' if close else ''
        raise SwitchError(f'{name}={_shown(text)}: unknown guard {token!r}{hint}; known: all, none, '
                          f'{", ".join(GUARD_NAMES)} (a comma list; -name removes one)')
    return text


def _in_bounds(s: Switch, value, text: str):
    low, high, low_ok = s.bounds
    if value < low or (value == low and not low_ok) or value > high:
        what = f' {s.unit}' if s.unit else ''
        raise SwitchError(f'{s.name}={_shown(text)}: expected {">=" if low_ok else ">"} {low:g} and <= {high:g}{what}'
                          + (' (0 or none: no cap)' if s.name == PREFIX + 'MAX_VIDEO_TOKENS' else '')
                          + (' (0 or none: whole videos)' if s.name == PREFIX + 'WINDOW' else ''))
    return value


def _shown(text: str, limit: int = 40) -> str:
    """`text` quoted for a message, shortened: a variable may hold thousands of characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f'...({len(text)} characters)'


def read(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The effective value of switch `name` in `environ` (default: the process environment)."""
    environ = os.environ if environ is None else environ
    return parse(name, environ.get(name))


def given(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the variable of switch `name` is set to something (unset and blank both mean the default)."""
    switch(name)
    raw = (os.environ if environ is None else environ).get(name)
    return raw is not None and bool(str(raw).strip())


def unknown_names(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    environ = os.environ if environ is None else environ
    return sorted(k for k in environ if k.startswith(PREFIX) and k not in table())


def check_names(environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise on `SWIFT_VORA_*` variables that are not switches, each with the closest switch's name."""
    unknown = unknown_names(environ)
    if unknown:
        raise SwitchError('; '.join(f'{name}: not a swift-vora switch{_suggest(name)}' for name in unknown))


def check_environment(environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise on the first `SWIFT_VORA_*` variable that is not a switch or holds a value its switch refuses."""
    environ = os.environ if environ is None else environ
    check_names(environ)
    for name in table():
        read(name, environ)


def recipe_env_error(name: str, value: Any) -> Optional[str]:
    """Why a recipe's `env`/`guards.env` entry `name: value` cannot be used (None: it can)."""
    if not name.startswith(PREFIX):
        return None
    if name not in table():
        return f'not a swift-vora switch{_suggest(name)}'
    s = table()[name]
    if s.recipe != ENV_KEY:
        if not s.recipe:
            return f'not a training switch (read by {s.where})'
        source = f'the recipe key {s.recipe!r}' if '.' in s.recipe and ' ' not in s.recipe else s.recipe
        return f'set by swift-vora train from {source}'
    try:
        parse(name, None if value is None else str(value))
    except SwitchError as e:
        return str(e)
    return None


def shell_conflicts(launch_env: Mapping[str, str], environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The switches a recipe key decides that `environ` (the shell `train` runs in) sets to other than their default
    where the launch leaves them unset (`launch_env` has no entry): the launched process inherits the shell, so such
    a value would apply behind the plan's back (`SWIFT_VORA_CHECKPOINT_LAYERS=0` under a plan that checkpoints every
    layer). One message per switch."""
    environ = os.environ if environ is None else environ
    out = []
    for name, s in table().items():
        recipe_key = bool(s.recipe) and '.' in s.recipe and ' ' not in s.recipe
        # a value the launch sets replaces the shell's; one it leaves unset (the default) is inherited
        if not recipe_key or name in launch_env or not given(name, environ):
            continue
        try:
            same = parse(name, environ[name]) == parse(name, None)
        except SwitchError:
            same = False
        if not same:
            out.append(f'{name}={_shown(environ[name])} is set in this shell, but the recipe key {s.recipe} decides '
                       'it (this launch leaves it at its default) and the launched process would inherit it: unset '
                       f'it, or set {s.recipe} in the recipe')
    return out


def effective(environ: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
    """One row per switch: the table's columns, the value in effect, where it came from; a value the switch refuses
    is not in effect (every other command and the plugin refuse to start while it is set): its row holds `value`
    None, the text as `given`, `status` 'invalid' and the `error`."""
    environ = os.environ if environ is None else environ
    rows = []
    for s in table().values():
        raw = environ.get(s.name)
        given_here = raw is not None and bool(raw.strip())
        row = {'name': s.name, 'type': s.kind, 'default': s.default, 'help': s.help, 'recipe_key': s.recipe,
               'read_by': s.where, 'group': s.group, 'source': 'environment' if given_here else 'default',
               'status': 'set' if given_here else 'default'}
        if s.choices:
            row['choices'] = list(s.choices)
        try:
            row['value'] = parse(s.name, raw)
        except SwitchError as e:
            row.update(value=None, given=raw, status='invalid', error=str(e))
        rows.append(row)
    for name in unknown_names(environ):
        rows.append({'name': name, 'value': None, 'given': environ[name], 'source': 'environment',
                     'status': 'unknown', 'error': f'{name}: not a swift-vora switch{_suggest(name)}'})
    return rows


def shown(rows: List[Dict[str, Any]], everything: bool) -> List[Dict[str, Any]]:
    """The rows `swift-vora switches` prints: the user settings, and of the benchmark and set-up switches those set
    in the environment (or invalid); every row with --all."""
    return [r for r in rows if everything or r.get('group', 'setting') == 'setting' or r['status'] != 'default']


# --- `swift-vora switches` ----------------------------------------------------------------------------------
def register_commands(subparsers) -> None:
    p = subparsers.add_parser('switches', help='every SWIFT_VORA_* setting: type, default, recipe key, effective value',
                              description='Print the SWIFT_VORA_* environment switches a training reads with their '
                              'type, default, recipe key and the value in effect in this environment (--all: also '
                              'the benchmark, set-up and probe switches). Exit 1 if a variable holds a value its '
                              'switch refuses or a SWIFT_VORA_* name is not a switch: every other command refuses '
                              'to start then.')
    p.add_argument('--all', action='store_true', help='also the switches of the benchmarks, the GPU set-up scripts '
                   'and the probes, and those swift-vora train sets for the process it launches')
    p.add_argument('--json', action='store_true', help='print JSON (one object per switch shown)')
    p.set_defaults(handler=cmd_switches)


def cmd_switches(args: argparse.Namespace) -> int:
    rows = effective()
    listed = shown(rows, args.all)
    if args.json:
        print(json.dumps(listed, indent=2, default=str))
    else:
        print(render(listed, hidden=len(rows) - len(listed)))
    return 1 if any('error' in r for r in rows) else 0


def render(rows: List[Dict[str, Any]], hidden: int = 0) -> str:
    out = []
    bad = [r for r in rows if 'error' in r]
    if bad:
        out.append(f'INVALID ({len(bad)}): every other swift-vora command, and the plugin inside swift sft, refuse to '
                   'start while these are set:')
        out += [f'  ! {r["error"]}' for r in bad]
        out.append('')
    for r in rows:
        if r['status'] == 'unknown':
            out.append(f'! {r["name"]} = {r["given"]!r}  NOT A SWITCH: {r["error"]}')
            continue
        recipe = f'  [recipe: {r["recipe_key"]}]' if r['recipe_key'] else ''
        if r['status'] == 'invalid':
            value = f'{r["given"]!r}  INVALID, not in effect'
            mark = '!'
        else:
            value = repr(r['value'])
            mark = '*' if r['status'] == 'set' else ' '
        out.append(f'{mark} {r["name"]} = {value}  ({r["type"]}, default {r["default"]!r}){recipe}  {r["help"]}')
    out.append('(* = set in the environment; ! = refused; recipe: env = an entry of the recipe\'s env or guards.env)')
    if hidden:
        out.append(f'{hidden} benchmark, set-up and probe switches not shown: swift-vora switches --all')
    return '\n'.join(out)
