"""`swift-vora plan`: which backend trains a model on some hardware, whether it fits, and the command `train` would
run for it.

Exit codes: 0 fits, 3 does not fit, 4 refused; 1 unreadable/unsupported config.json; 2 usage error. The flags are
read twice, each way forward: into the planner's request, and into the recipe they stand for (`stand_in_recipe`),
whose launch gives the plan its command (swift_vora/cli/compose.py). Imports neither torch nor ms-swift.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

from .. import switches
from ..backends.base import command_line
from ..backends.recipe import SCHEMA, Recipe, recipe_from_dict
from ..budget import ENV_PREFIX, VideoBudget
from ..cli_values import count_or_auto, nonnegative_int, number, positive_int
from ..data.windowing import WindowConfig
from ..errors import InvalidInput, UsageError
from ..json_output import dumps
from ..plan import constants as C
from ..plan import speed
from ..plan.backend import AUTO, Backend
from ..plan.hardware import PROFILES, resolve
from ..plan.memory import BACKENDS, COMPILE_MODES, FP8_MODES, MEGATRON_BACKENDS, VISION_MODES
from ..plan.model_source import load_model_spec
from ..plan.model_spec import LORA_TARGETS, TUNERS, UnsupportedModel
from ..plan.request import CHECKPOINTS, Plan, PlanRequest
from ..plan.search import describe_setting
from ..plan.select import SampleCapError, make_plan
from ..plan.video_budget import budget_sample
from .compose import has_launch, launch_plan, refused, with_alternative_commands

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
PLAN_DATASET_PLACEHOLDER = 'ANNOTATIONS.jsonl'  # the stand-in recipe's dataset: `plan` has none


def register_commands(subparsers) -> None:
    p = subparsers.add_parser(
        'plan', help='choose a backend and predict whether training fits (reads config.json only)',
        description='Decide which backend can train MODEL on this hardware and whether it fits, from config.json '
        'alone (no weights are read). Exit 0 fits, 3 does not fit, 4 refused. Every number is a prediction.')
    p.add_argument('--model', required=True,
                   help='model directory, config.json, or a model id / name resolved offline (Hugging Face or '
                        'ModelScope cache, else the configs shipped with swift-vora)')
    hw = p.add_argument_group('hardware')
    hw.add_argument('--hardware', default=None,
                    help=f'profile: {", ".join(PROFILES)}, or local (probe this machine; the default)')
    hw.add_argument('--gpus', type=positive_int(4096), default=None, help='GPUs per node (custom hardware)')
    hw.add_argument('--gpu-mem-gib', type=number(0, 1e5, above=True), default=None,
                    help='memory per GPU in GiB, as torch reports it')
    hw.add_argument('--host-ram-gib', type=number(0, 1e6, above=True), default=None,
                    help='host RAM per node the job may use (container limit), GiB; overrides a profile')
    hw.add_argument('--nodes', type=positive_int(4096), default=1, help='nodes (default 1)')
    t = p.add_argument_group('training')
    t.add_argument('--tuner', choices=TUNERS, default='lora',
                   help='lora (default), full, or selective (attention + shared experts)')
    t.add_argument('--backend', choices=(AUTO, ) + BACKENDS, default=AUTO)
    t.add_argument('--offload', choices=('none', 'cpu'), default=None,
                   help='DeepSpeed CPU offload (default: searched -- used only where nothing fits without it)')
    t.add_argument('--quant', choices=('none', '4bit'), default='none', help='4bit = QLoRA base (dense only)')
    t.add_argument('--ep', type=positive_int(4096), default=None,
                   help='expert parallel size (Megatron; default: chosen)')
    t.add_argument('--tp', type=positive_int(4096), default=None, help='tensor parallel size (Megatron; default 1)')
    t.add_argument('--global-batch', type=positive_int(1_000_000_000), default=None, metavar='N',
                   help='Megatron: samples per optimizer step over all GPUs (recipe megatron.global_batch; default '
                        f'{SCHEMA["megatron.global_batch"][1]}), a multiple of micro-batch x data-parallel size')
    t.add_argument('--micro-batch', type=positive_int(1_000_000), default=None,
                   help='samples per GPU per step (default: searched, 1 2 4 8 -- the fastest that fits)')
    t.add_argument('--pack-length', type=positive_int(10_000_000), default=None, metavar='TOKENS',
                   help='dataset packing (swift sft --packing, recipe train.packing=dataset): rows filled with '
                        'samples up to TOKENS tokens, planned full')
    t.add_argument('--lora-rank', type=positive_int(65536), default=None,
                   help='LoRA rank (default 8, ms-swift\'s default)')
    t.add_argument('--lora-targets', choices=LORA_TARGETS, default='all-linear',
                   help='all-linear includes the routed experts (one rank-r pair per expert)')
    t.add_argument('--no-gradient-checkpointing', action='store_true')
    t.add_argument('--checkpoint-layers', type=count_or_auto(nonnegative_int(100_000)), default=None, metavar='N',
                   help='with gradient checkpointing: checkpoint the first N decoder layers only, the others keep '
                        'their activations; auto: the fewest the plan fits (recipe train.checkpoint_layers; '
                        'default: searched with the micro-batch; N = the layer count checkpoints every layer)')
    t.add_argument('--samples', type=positive_int(10 ** 12), default=None, metavar='N',
                   help='windowed samples per epoch of your dataset: the plan estimates hours per epoch (train '
                        'counts them from the recipe\'s dataset)')
    t.add_argument('--checkpoints', choices=CHECKPOINTS, default='auto',
                   help='unsloth_split_lora: layer checkpoints on the gpu, offloaded to host RAM, or auto (the GPU '
                        'when the plan fits so; default)')
    t.add_argument('--compile', choices=COMPILE_MODES, default='off',
                   help='layers = the decoder layers under torch.compile (recipe train.compile; applied by the ddp '
                        'backend only, planned with its measured activation memory)')
    t.add_argument('--fp8', choices=FP8_MODES, default='off',
                   help='frozen_base = the decoder\'s frozen base linears held and multiplied in FP8 (recipe '
                        'train.fp8; LoRA on the ddp backend, GPUs with compute capability 8.9+)')
    t.add_argument('--cross-entropy', choices=C.MEGATRON_CROSS_ENTROPY, default=C.MEGATRON_CROSS_ENTROPY_DEFAULT,
                   help='megatron_ep_lora\'s loss (recipe megatron.cross_entropy_fusion_impl): native = Megatron\'s '
                        'fused vocab-parallel cross entropy (ms-swift\'s default; an fp32 softmax of every '
                        'position), te = Transformer Engine\'s (bf16 logits only)')
    t.add_argument('--recompute', choices=C.MEGATRON_RECOMPUTE, default='full',
                   help='megatron_ep_lora\'s recompute (recipe megatron.recompute): full = every layer recomputed in '
                        'backward (the least memory); selective and none keep every layer\'s activations')
    t.add_argument('--vision-mode', choices=VISION_MODES, default=None,
                   help='frozen vision tower: no_grad (default; measured with ms-swift 4.6 + transformers 5.17) or '
                        'checkpointed_requires_grad')
    s = p.add_argument_group(
        'sample (video budget, or --seq-len)',
        'The same knobs, defaults and names as the recipe\'s video.* keys, the SWIFT_VORA_* environment the '
        'video_ora template reads, and data.window (swift_vora/budget.py, docs/planner.md). A flag not given is '
        'taken from SWIFT_VORA_<NAME> when set, else the template\'s default.')
    s.add_argument('--seq-len', type=positive_int(100_000_000), default=None,
                   help='tokens per sample (text; overrides the video budget)')
    s.add_argument('--fps', type=number(0, 240, above=True), default=None,
                   help='frames per second of clip (video.fps, SWIFT_VORA_FPS; default 2)')
    s.add_argument('--min-frames', type=positive_int(100_000), default=None,
                   help='video.min_frames, SWIFT_VORA_MIN_FRAMES (default 4)')
    s.add_argument('--max-frames', type=positive_int(100_000), default=None,
                   help='frame cap per clip (video.max_frames, SWIFT_VORA_MAX_FRAMES; default 64)')
    s.add_argument('--pair-tokens', '--frame-tokens', dest='pair_tokens', type=positive_int(1_000_000),
                   default=None,
                   help='tokens per frame pair (video.pair_tokens, SWIFT_VORA_PAIR_TOKENS; default 256). '
                        '--frame-tokens is the older name of the same flag')
    s.add_argument('--min-pair-tokens', type=positive_int(1_000_000), default=None,
                   help='the fewest tokens a frame pair may be shrunk to (video.min_pair_tokens, '
                        'SWIFT_VORA_MIN_PAIR_TOKENS; default 16): with --min-frames, the floor down to which the plan '
                        'lowers a video budget that does not fit')
    s.add_argument('--max-video-tokens', type=positive_int(100_000_000), default=None,
                   help='cap on one clip\'s video tokens (video.max_video_tokens, SWIFT_VORA_MAX_VIDEO_TOKENS)')
    s.add_argument('--window', '--clip-seconds', dest='window', type=number(1, 7 * 24 * 3600),  # data.window's range
                   default=None,
                   help='clip length in seconds (data.window, SWIFT_VORA_WINDOW; default 60). --clip-seconds is '
                        'the older name')
    s.add_argument('--answer-tokens', type=positive_int(1_000_000), default=None,
                   help='supervised (answer) tokens per sample')
    p.add_argument('--as-given', action='store_true',
                   help='plan exactly the settings given, their defaults for the others (micro-batch 1, every layer '
                        'checkpointed, no offload, the video budget as set): no search')
    p.add_argument('--explain', action='store_true',
                   help='also print where every number comes from (measurements, derivations, assumptions)')
    p.add_argument('--json', action='store_true', help='print JSON (it always carries the explanation)')
    p.set_defaults(handler=cmd_plan)


# ---------------------------------------------------------------------------------------------------------------
def sample_budget(args, environ=None):
    """(VideoBudget, window seconds) for `plan`: flags, else SWIFT_VORA_* environment, else the template's defaults."""
    environ = os.environ if environ is None else environ
    flags = {'fps': args.fps, 'min_frames': args.min_frames, 'max_frames': args.max_frames,
             'pair_tokens': args.pair_tokens, 'max_video_tokens': args.max_video_tokens,
             'min_pair_tokens': getattr(args, 'min_pair_tokens', None)}
    try:
        budget = VideoBudget.from_env(environ)
    except ValueError as e:
        bad = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in
                     VideoBudget.__dataclass_fields__)
        given = ', '.join(f'{k}={environ[k]!r}' for k in bad)
        raise ValueError(f'the video budget in the environment is not valid ({given}): {e}') from e
    budget = budget.updated({k: v for k, v in flags.items() if v is not None})
    if budget.min_frames > budget.max_frames:
        raise ValueError(f'--min-frames {budget.min_frames} is above --max-frames {budget.max_frames} (flags or '
                         f'SWIFT_VORA_MIN_FRAMES/MAX_FRAMES): the template would sample {budget.min_frames} frames, '
                         'past the cap; lower the minimum or raise the cap')
    window = args.window
    if window is None and switches.given(ENV_PREFIX + 'WINDOW', environ):
        window = switches.read(ENV_PREFIX + 'WINDOW', environ)
        if window is None:
            raise ValueError(f'{ENV_PREFIX}WINDOW={environ[ENV_PREFIX + "WINDOW"]} trains whole videos: give the '
                             f'clip length to plan with --window')
    if window is None:
        window = WindowConfig().window
    return budget, float(window)


def _check_args(args) -> None:
    video = [args.fps, args.min_frames, args.max_frames, args.pair_tokens, args.max_video_tokens, args.window,
             args.min_pair_tokens]
    if args.seq_len is not None and any(v is not None for v in video):
        raise ValueError('give either --seq-len or the video budget (--fps/--min-frames/--max-frames/--pair-tokens/'
                         '--max-video-tokens/--window), not both')


def request_from_args(args, budget: VideoBudget, window: float) -> PlanRequest:
    """The planner's request: the sample the template makes of a `window`-second clip under `budget`."""
    if window <= 0:
        raise ValueError('--window must be positive')
    frames, pair_tokens = budget_sample(budget, window)
    answer = args.answer_tokens if args.answer_tokens is not None else C.DEFAULT_ANSWER_TOKENS
    return PlanRequest(
        model=args.model, hardware=args.hardware, tuner=args.tuner, backend=args.backend,
        offload=args.offload or 'none', quant=args.quant, ep=args.ep, tp=args.tp, micro_batch=args.micro_batch or 1,
        seq_len=args.seq_len, search=searched(args, budget),
        pack_length=args.pack_length,
        fps=float(budget.fps), max_frames=frames, min_frames=min(int(budget.min_frames), frames),
        frame_tokens=pair_tokens, clip_seconds=window,
        text_tokens=C.DEFAULT_PROMPT_TOKENS + answer, supervised_tokens=answer,
        lora_rank=args.lora_rank if args.lora_rank is not None else C.DEFAULT_LORA_RANK,
        lora_targets=args.lora_targets, nodes=args.nodes,
        gradient_checkpointing=not args.no_gradient_checkpointing, compile=args.compile, checkpoints=args.checkpoints,
        checkpoint_layers=None if args.no_gradient_checkpointing else args.checkpoint_layers,
        fp8=args.fp8, samples_per_epoch=args.samples, cross_entropy=args.cross_entropy, recompute=args.recompute,
        vision_mode=args.vision_mode or C.VISION_MODE_DEFAULT, min_pair_tokens=int(budget.min_pair_tokens),
        global_batch=args.global_batch or SCHEMA['megatron.global_batch'][1])  # what the stand-in recipe launches


def searched(args, budget: VideoBudget) -> tuple:
    """The settings `plan` leaves to the search: those no flag (nor, for the video budget, SWIFT_VORA_* variable)
    set; none with --as-given."""
    if args.as_given:
        return ()
    free = []
    if args.micro_batch is None and not args.pack_length:
        free.append('micro_batch')
    if args.checkpoint_layers is None and not args.no_gradient_checkpointing:
        free.append('checkpoint_layers')
    if args.offload is None:
        free.append('offload')
    env_budget = any(switches.given(ENV_PREFIX + name, os.environ)
                     for name in ('MAX_FRAMES', 'PAIR_TOKENS', 'MAX_VIDEO_TOKENS'))
    if args.max_frames is None and args.pair_tokens is None and args.max_video_tokens is None and not env_budget \
            and args.seq_len is None:
        free.append('video_budget')
    return tuple(free)


def command_model(path: str) -> str:
    """What `--model` the printed command takes for `plan --model PATH`: a model's config.json stands for its
    directory (`swift sft --model` reads the directory, never the file); a model id or a directory as given."""
    if os.path.basename(path) == 'config.json' and os.path.isfile(path):
        return os.path.dirname(path) or '.'
    return path


def stand_in_recipe(args, budget: VideoBudget, window: float, hw) -> Recipe:
    """The recipe `plan`'s flags stand for, made from the flags as the request is (not from the request): what
    `train` would run for them, with ANNOTATIONS.jsonl in place of the dataset `plan` has none of. The video budget
    travels as the budget (its caps, not the frames one clip gets); RecipeError where the flags make no recipe."""
    model = command_model(args.model)
    pack = args.pack_length
    doc = {
        'gpus': int(hw.num_gpus or 1), 'gpu_mem_gib': float(hw.gpu_mem_gib or 1.0), 'nodes': int(args.nodes),
        'model': {'path': model},
        'data': {'dataset': PLAN_DATASET_PLACEHOLDER, 'window': float(window),
                 **({'max_length': pack} if pack else {})},
        'video': budget.to_dict(),
        'train': {'backend': args.backend, 'tuner': args.tuner, 'quantization': args.quant,
                  'lora_rank': args.lora_rank if args.lora_rank is not None else C.DEFAULT_LORA_RANK,
                  **({'micro_batch': args.micro_batch} if args.micro_batch is not None else {}),
                  'target_modules': 'attention' if args.lora_targets == 'attention' else 'all-linear',
                  'gradient_checkpointing': not args.no_gradient_checkpointing, 'compile': args.compile,
                  **({'checkpoint_layers': args.checkpoint_layers}
                     if args.checkpoint_layers is not None and not args.no_gradient_checkpointing else {}),
                  'fp8': args.fp8, **({'packing': 'dataset'} if pack else {})},
        'deepspeed': {'offload': args.offload},
        'megatron': {'ep': args.ep, 'tp': args.tp, 'cross_entropy_fusion_impl': args.cross_entropy,
                     'recompute': args.recompute,
                     **({'global_batch': args.global_batch} if args.global_batch is not None else {})},
    }
    return recipe_from_dict(doc, where='<plan request>')


class PlanUsageError(ValueError):
    """Bad arguments (exit 2)."""


def plan_from_args(args) -> Plan:
    """The plan for parsed `plan` arguments, with the commands `train` would run for the recipe they stand for.
    Raises PlanUsageError (exit 2), UnsupportedModel/ValueError (exit 1)."""
    try:
        _check_args(args)
        budget, window = sample_budget(args)
        req = request_from_args(args, budget, window)
        req.validate()
        hw = resolve(args.hardware, args.gpus, args.gpu_mem_gib, args.host_ram_gib, args.nodes)
    except (ValueError, KeyError) as e:
        raise PlanUsageError(e.args[0] if e.args else str(e)) from e
    try:
        spec = load_model_spec(args.model)
    except FileNotFoundError as e:
        raise PlanUsageError(str(e)) from e
    req.hardware = hw
    try:
        plan = make_plan(req, spec=spec, hardware=hw)
    except SampleCapError as e:
        raise PlanUsageError(str(e)) from e
    recipe = None
    try:  # environ={}: the commands do not depend on the environment `plan` runs in
        recipe = stand_in_recipe(args, budget, window, hw)
        return launch_plan(plan, recipe, environ={})[0]
    except ValueError as exc:  # RecipeError, LaunchUsageError: `train` would stop on these settings
        plan = with_alternative_commands(plan, recipe, environ={})
        return refused(plan, [f'swift-vora train would not launch this: {exc}']) if has_launch(plan) else plan


def plan_from_argv(argv: List[str]) -> Plan:
    """`swift-vora plan ARGV` as a Plan object (benchmarks/calibration_table.py recomputes its table with it)."""
    parser = argparse.ArgumentParser(prog='swift-vora')
    register_commands(parser.add_subparsers(dest='command'))
    return plan_from_args(parser.parse_args(['plan', *argv]))


def cmd_plan(args) -> int:
    try:
        plan = plan_from_args(args)
    except PlanUsageError as e:
        raise UsageError(str(e)) from None
    except (UnsupportedModel, ValueError) as e:
        raise InvalidInput(str(e)) from None
    if args.json:
        print(dumps(plan.to_dict(), indent=2))
    else:
        print(render_plan(plan, explain=args.explain))
    if plan.verdict != 'fits':  # one line on stderr too, so that a script's log says why without parsing stdout
        print(f'swift-vora plan: {plan.verdict.replace("_", " ")} (exit {plan.exit_code})', file=sys.stderr)
    return plan.exit_code


# ---------------------------------------------------------------------------------------------------------------
def _table(items: Dict[str, float], indent: str = '  ') -> List[str]:
    if not items:
        return [f'{indent}(none)']
    w = max(len(k) for k in items)
    rows = [f'{indent}{k:<{w}}  {v:>9.2f}' for k, v in sorted(items.items(), key=lambda kv: -kv[1])]
    rows.append(f'{indent}{"total":<{w}}  {sum(items.values()):>9.2f}')
    return rows


def _peak_note(plan) -> List[str]:
    """A line naming why the breakdown's total is not the GPU peak: the breakdown is the training step, and the
    peak can be elsewhere (loading, where FP8 weights are converted after a bf16 load)."""
    total = round(sum(plan.breakdown.values()), 2)
    if plan.gpu_peak_gib is None or abs(total - plan.gpu_peak_gib) < 0.005:
        return []
    phase = max(plan.phases, key=lambda k: plan.phases[k]['gpu_gib']) if plan.phases else 'another phase'
    return [f'  (the breakdown is the training step, {total:.2f} GiB; the GPU peak, {plan.gpu_peak_gib:.2f} GiB, is at '
            f'{phase.replace("_", " ")}: see phases)']


def _speed_line(plan) -> str:
    if not plan.est_measured:
        return f'speed    : {plan.est_basis or "no measurement"}: no estimate'
    hours = (f', {speed.format_hours(plan.est_hours_per_epoch)} per epoch of {plan.est_samples_per_epoch:,} samples'
             if plan.est_hours_per_epoch is not None else ' (hours: --samples N)')
    unknown = speed.unknown_gpu_note((plan.hardware or {}).get('gpu_name') or '')
    return (f'speed    : {plan.est_tokens_per_s:,.0f} tokens/s{hours}  [estimated'
            + (f'; {unknown}]' if unknown else ']'))


def _option_lines(plan, layers: int) -> List[str]:
    lines = []
    for o in plan.options:
        hours = (f', {speed.format_hours(o["est_hours_per_epoch"])}' if o['est_hours_per_epoch'] is not None
                 else '')
        pace = f'{o["est_tokens_per_s"]:,.0f} tokens/s{hours}' if o['est_measured'] else 'no measurement'
        mark = '*' if o['chosen'] else ' '
        lines.append(f'  {mark} {describe_setting(o, layers)}: {o["gpu_peak_gib"]:.1f} GiB, {pace}')
        lines.append(f'      {o["est_basis"]}')
    return lines


def _alternative_lines(plan, spec_layers: int) -> List[str]:
    lines = []
    for a in (plan.alternatives or [])[:3]:
        pace = (f'{a["est_tokens_per_s"]:,.0f} tokens/s' + (f', {speed.format_hours(a["est_hours_per_epoch"])}'
                                                          if a.get('est_hours_per_epoch') is not None else '')
                if a.get('est_measured') else 'no measurement')
        where = f'{a["num_gpus"]} GPU{"s" if a["num_gpus"] > 1 else ""}' + (f' x {a["nodes"]} nodes'
                                                                          if a['nodes'] > 1 else '')
        bits = [a['tuner'], str(a['backend'])] + (['CPU offload'] if a['offload'] == 'cpu' else []) + (
            ['4-bit base'] if a['quant'] == '4bit' else []) + [f'micro-batch {a["micro_batch"]}']
        lines.append(f'  - {" ".join(bits[:2])}, {", ".join(bits[2:])} on {where}: {a["gpu_peak_gib"]:.1f} GiB, '
                     f'{pace}')
        lines.append(f'      {a.get("est_basis", "")}')
    return lines


def render_plan(plan, explain: bool = False) -> str:
    m = plan.model
    kind = m.get('kind', '?')
    desc = f'{m.get("model_type")} ({m.get("architecture")}), {kind}, {m.get("total_params", 0) / 1e9:.2f} B params'
    if kind == 'moe':
        moe = m.get('moe', {})
        desc += (f' ({m.get("active_params", 0) / 1e9:.2f} B active; {moe.get("routed_experts")} experts, top-'
                 f'{moe.get("experts_per_token")}' + (f' + {moe.get("shared_experts")} shared' if
                                                       moe.get('shared_experts') else '') + ')')
    hw = plan.hardware
    lines = [f'model    : {desc}']
    src = getattr(plan, 'config_source', None) or {}
    if src.get('description'):
        lines.append(f'config   : {src["description"]}')
    host = (f'{hw.get("host_ram_gib"):.1f} GiB host RAM ({hw.get("host_ram_source")})'
            if hw.get('host_ram_gib') is not None else 'host RAM unknown')
    lines.append(f'hardware : {hw.get("name")}: {hw.get("num_gpus")} x {hw.get("gpu_name") or "GPU"} '
                 f'{hw.get("gpu_mem_gib", 0):.2f} GiB' + (f' x {hw.get("nodes")} nodes' if hw.get('nodes', 1) > 1
                                                          else '') + f', {host}')
    tok = plan.tokens or {}
    layers = int(m.get('num_layers') or 0)
    tuner = plan.tuner + (f' r={plan.lora_rank} ({plan.lora_targets})' if plan.tuner == 'lora' else '')
    ckpt = (f', {plan.checkpoint_layers} of {layers} layers checkpointed'
            if plan.checkpoint_layers is not None and layers and plan.checkpoint_layers < layers else '')
    lines.append(f'request  : {tuner}, micro-batch {plan.micro_batch}{ckpt}, offload {plan.offload}, quant '
                 f'{plan.quant}, {tok.get("total_tokens", "?")} tokens/sample'
                 + (f', {plan.trainable_params / 1e6:,.1f} M trainable' if plan.trainable_params else ''))
    world = (plan.num_gpus or 1) * (plan.nodes or 1)
    replicas = world > 1 and plan.backend in (Backend.UNSLOTH_SPLIT_LORA, Backend.DDP)
    par = (f' (EP {plan.ep}, TP {plan.tp})' if plan.backend in MEGATRON_BACKENDS else
           f' ({world} replicas, data parallel)' if replicas else '')
    lines.append(f'backend  : {plan.backend}{par}')
    lines.append(f'verdict  : {plan.verdict.upper().replace("_", " ")} (exit {plan.exit_code})')
    if plan.gpu_peak_gib is not None:
        lines.append(f'GPU peak : {plan.gpu_peak_gib:.2f} GiB per GPU of {plan.gpu_capacity_gib:.2f} GiB  [predicted]')
        lim = f' of {plan.host_limit_gib:.2f} GiB' if plan.host_limit_gib is not None else ' (limit unknown)'
        lines.append(f'host peak: {plan.host_peak_gib:.2f} GiB per node{lim}  [predicted]')
        lines.append(_speed_line(plan))
        ph = plan.phases
        if ph:
            lines.append('phases   : ' + ', '.join(f'{k.replace("_", " ")} {v["gpu_gib"]:.1f} GiB GPU / '
                                                    f'{v["host_gib"]:.1f} GiB host' for k, v in ph.items()))
        lines.append('')
        lines.append('per-GPU breakdown (predicted, GiB)')
        lines += _table(plan.breakdown)
        lines += _peak_note(plan)
        lines.append('host breakdown (predicted, GiB per node)')
        lines += _table(plan.host_breakdown)
    if len(plan.options) > 1:  # the plan's own line alone says nothing the lines above do not
        lines.append('')
        samples = f' for {plan.est_samples_per_epoch:,} samples' if plan.est_samples_per_epoch else ''
        lines.append(f'options that fit (fewest estimated hours{samples} first; * planned)')
        lines += _option_lines(plan, layers)
    if plan.alternatives:
        lines.append('')
        lines.append('what fits instead (fewest estimated hours first)')
        lines += _alternative_lines(plan, layers)
    lines.append('')
    lines.append('reasons')
    lines += [f'  - {r}' for r in plan.reasons]
    if plan.assumptions:
        lines.append('assumptions')
        lines += [f'  - {a}' for a in plan.assumptions]
    if explain and plan.explain:
        lines.append('where the numbers come from')
        lines += [f'  - {e}' for e in plan.explain]
    elif plan.explain:
        lines.append('(--explain: where each number comes from)')
    lines.append('')
    if plan.command:
        note = '' if plan.verdict == 'fits' else ' (not run: does not fit)'
        lines.append(f'command{note}')
        lines.append('  ' + command_line(plan.command))
    if plan.alternative and plan.alternative.get('command'):
        lines.append('alternative command')
        lines.append('  ' + command_line(plan.alternative['command']))
    return '\n'.join(lines)


def main(argv=None) -> int:  # pragma: no cover - convenience for `python -m swift_vora.cli.plan`
    parser = argparse.ArgumentParser(prog='swift-vora')
    register_commands(parser.add_subparsers(dest='command'))
    args = parser.parse_args(argv)
    return args.handler(args)
