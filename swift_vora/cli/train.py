"""`swift-vora train RECIPE.yaml [key=value ...] [--dry-run] [--json]`: plan, then launch the chosen backend.

1. Read the recipe (errors name the file and the key; exit 2).
2. Plan it (config.json only, no weights). does_not_fit -> exit 3, refused -> exit 4, with the plan's reasons,
   before anything is launched.
3. Build the launch once (swift sft / megatron sft / the Unsloth runner; swift_vora/cli/compose.py) with the
   plugin, template video_ora, the dataset, the video budget and window settings as SWIFT_VORA_* env, the backend's
   config and the guards' env; the plan's command is that launch's. A MoE model under DeepSpeed ZeRO-3 is refused
   here too (exit 4), whatever asked for it.
4. Before launching: this machine against the recipe's hardware, the model's weights, the rendezvous of several
   nodes and the dataset (`launch_problems`: every problem at once, the exit code of the first).
5. `--dry-run`: print the plan, the exact command and every generated file, and stop, with the exit code the launch
   would have had (0, or that of step 4's problems, which it prints). Otherwise write the files and `launch.json`
   under OUTPUT_DIR/swift-vora-launch/ and run the command (argv list, no shell); the exit code is the child's.
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import sys

from ..backends.base import LaunchUsageError
from ..backends.common import launch_record, missing_rendezvous
from ..backends.deepspeed import launch_dir
from ..backends.planning import plan_recipe
from ..backends.recipe import RecipeError, load_recipe
from ..cli_values import OUTPUT_DIR_FLAGS
from ..errors import CliError
from ..json_output import dumps
from ..plan.model_spec import UnsupportedModel
from .compose import alternative_overrides, launch_plan
from .plan import render_plan

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 1, 2, 3, 4


def register_commands(subparsers) -> None:
    p = subparsers.add_parser('train', help='plan a recipe, then launch the chosen backend',
                              description=__doc__.split('\n\n')[0])
    p.add_argument('recipe', help='recipe YAML, or the name of a shipped recipe (`swift-vora recipes` lists them: '
                   'h200x1, 3060x4, ...); see docs/backends.md')
    p.add_argument('overrides', nargs='*', default=[], metavar='key=value',
                   help='dotted recipe keys, YAML values: video.max_frames=16 model.path=/models/x train.max_steps=10')
    p.add_argument(*OUTPUT_DIR_FLAGS, dest='output_dir', metavar='DIR', default=None,
                   help='where the run writes (the recipe key train.output_dir; --output_dir as in swift sft)')
    p.add_argument('--dry-run', action='store_true', help='print the plan, the exact command and generated files; '
                   'launch nothing')
    p.add_argument('--json', action='store_true', help='with --dry-run: one JSON object (plan, argv, env, files)')
    p.add_argument('--explain', action='store_true',
                   help='also print where every number of the plan comes from (measurements, derivations)')
    p.add_argument('--trust-recipe-hardware', action='store_true',
                   help='launch even where this machine has fewer GPUs, less GPU memory or no bf16 than the recipe '
                        'plans for (recipe key hardware_check: false says the same)')
    p.set_defaults(handler=cmd_train)
    p.unknown_flag_hint = engine_flag_hint


def engine_flag_hint(flag: str, value: str = '') -> str:
    """For a flag `train` does not take (`--learning_rate 1e-5`): where that setting goes -- the recipe key that sets
    it (as an override, `train.learning_rate=1e-5`), else `swift_args:` (any swift sft / megatron sft argument,
    checked by the engine's own parser before launch). '' for what is not an ms-swift spelling."""
    from ..backends.recipe import ALIASES, MODELLED_ARGS, SCHEMA
    name, eq, inline = flag.lstrip('-').partition('=')
    name = name.replace('-', '_')
    if not name or not name.replace('_', '').isalnum():
        return ''
    shown = inline if eq else value if value and not value.startswith('-') else 'VALUE'
    key = MODELLED_ARGS.get(name) or next((k for k in (*SCHEMA, *ALIASES) if k.split('.', 1)[-1] == name), None)
    if key and '.' in key and ' ' not in key:
        return (f'--{name} is an ms-swift argument; `swift-vora train` takes it as the recipe key {key}: '
                f'{shlex.join([f"{key}={shown}"])} after the recipe, or {key.split(".", 1)[1]}: under '
                f'{key.split(".", 1)[0]}: in the file')
    if key and ' ' not in key:  # a top-level recipe key: gpus, hardware, nodes, ...
        return (f'--{name} is the recipe key {key}: {shlex.join([f"{key}={shown}"])} after the recipe, or {key}: in '
                'the file')
    if key:
        return f'--{name} is set by swift-vora itself ({key})'
    return (f'--{name} is not a swift-vora train flag; if it is a swift sft / megatron sft argument, give it as '
            f'{shlex.join([f"swift_args.{name}={shown}"])} (or under swift_args: in the recipe): ms-swift\'s own '
            'parser checks it before launch')


# Lines of each annotation file checked before a launch: enough to catch a wrong file or format in a second.
DATA_CHECK_LINES = 20
# ms-swift's `--dataset` also takes hub ids (`org/name`) and a `#N` sampling suffix; these endings mark a local file.
LOCAL_DATA_SUFFIXES = ('.jsonl', '.json', '.csv', '.txt', '.parquet')


def dataset_problems(recipe, sample_lines: int = DATA_CHECK_LINES):
    """([problem, ...], exit code) for `data.dataset`: each local file exists, and its first `sample_lines`
    annotation lines pass `data check`'s rules (videos exist; not decoded, that is the dataset's job)."""
    from ..data.annotations import AnnotationError, validate_line
    entries = recipe['data.dataset']
    entries = [entries] if isinstance(entries, str) else list(entries)
    problems, code = [], EXIT_OK
    for entry in entries:
        path = entry.split('#', 1)[0]
        looks_local = path.endswith(LOCAL_DATA_SUFFIXES) or os.path.isabs(path) or path.startswith('.')
        if not os.path.exists(path):
            if looks_local:
                problems.append(f'{recipe.path}: data.dataset: {path}: no such file')
                code = code or EXIT_USAGE
            continue
        if not os.path.isfile(path):
            problems.append(f'{recipe.path}: data.dataset: {path}: not a file')
            code = code or EXIT_USAGE
            continue
        bad, seen = [], 0
        with open(path, 'rb') as handle:
            for number, raw in enumerate(handle, 1):
                if seen >= sample_lines:
                    break
                text = raw.decode('utf-8', errors='replace')
                if not text.strip() or '"messages"' in text:  # blank, or an ms-swift row built already
                    continue
                seen += 1
                try:
                    validate_line(text, line=number, source=path, video_root=recipe['data.video_root'],
                                  base_dir=os.path.dirname(os.path.abspath(path)), probe=False)
                except AnnotationError as exc:
                    bad.append(str(exc))
        if bad and (len(bad) == seen or recipe['data.strict']):
            problems += [f'data.dataset: {reason}' for reason in bad[:5]]
            problems.append(f'data.dataset: {path}: {len(bad)} of the first {seen} annotation lines are invalid '
                            '(swift-vora data check lists them all)')
            code = code or EXIT_INVALID
        elif bad:
            _err(f'warning: {len(bad)} of the first {seen} lines of {path} are invalid and will be skipped '
                 f'(first: {bad[0]})')
    return problems, code


def fits_with_overrides(plan, recipe) -> list:
    """The planner's cheapest alternative on the recipe's own hardware, as `key=value` overrides (ms-swift's
    names where the recipe has them), or [] when only more GPUs would do."""
    same = [a for a in (plan.alternatives or []) if a.get('num_gpus') == plan.num_gpus and a.get('nodes') == plan.nodes]
    return alternative_overrides(same[0], recipe) if same else []


def other_machine_problem(recipe, plan):
    """Why this machine (doctor's probe) cannot run what the recipe plans for, or None: a 4-GPU recipe on a machine
    without a GPU would start 4 processes that each die minutes later."""
    from ..plan.hardware import Hardware, local, machine_mismatch
    if recipe['hardware'] == 'local':  # planned on this machine already
        return None
    planned = Hardware(**{k: v for k, v in (plan.hardware or {}).items() if k != 'world'})
    _err('comparing the recipe\'s hardware with this machine (doctor) ...')
    here = local(use_torch=True)
    problems = machine_mismatch(planned, here, needs_bf16=recipe['train.dtype'] == 'bfloat16',
                                host_peak_gib=plan.host_peak_gib)
    if not problems:
        return None
    return (f'{recipe.path}: hardware {planned.name} ({planned.describe()}) is not this machine '
            f'({here.describe()}): ' + '; '.join(problems) + '. Plan for this machine with hardware=local, or '
            'launch anyway with --trust-recipe-hardware (recipe: hardware_check: false)')


def launch_problems(recipe, plan, launch, trust_hardware: bool):
    """([problem, ...], exit code) of everything that stops this launch, in the order a launch meets it: the
    hardware (exit 4), the model's weights (2; not on another machine), the rendezvous of several nodes (2), the
    dataset (2: missing; 1: invalid lines). All of them are said at once -- a machine that is not the recipe's and a
    dataset that is not there are two things to fix -- and the exit code is the first's. `--dry-run` reports the
    same list with the same exit code."""
    problems, code = [], EXIT_OK

    def add(message: str, exit_code: int) -> None:
        nonlocal code
        problems.append(message)
        code = code or exit_code

    if recipe['hardware_check'] and not trust_hardware:
        mismatch = other_machine_problem(recipe, plan)
        if mismatch:
            add(mismatch, EXIT_REFUSED)
    source = plan.config_source or {}
    # planned from a cached / shipped config: the weights are not there. Not said on a machine that is not the
    # recipe's: advising a 70 GB download for a recipe that cannot run here would be the wrong first word
    if not source.get('local_model', True) and not problems:
        add(f'{recipe.path}: model.path {recipe["model.path"]!r} is not a local model directory (planned from '
            f'{source.get("description")}); download the model first, e.g. `huggingface-cli download '
            f'{source.get("model_id") or "ORG/NAME"} --local-dir {recipe["model.path"]}`, and point model.path at '
            'it', EXIT_USAGE)
    from ..switches import shell_conflicts
    for conflict in shell_conflicts(launch.env):
        add(conflict, EXIT_USAGE)
    folder = os.path.expanduser(str(recipe['model.path'] or ''))
    if source.get('kind') == 'path' and os.path.isdir(folder) and not _has_weights(folder) and not problems:
        add(f'{recipe.path}: model.path {recipe["model.path"]!r} holds config.json but no weights (*.safetensors, '
            '*.bin): the launch would stop when it loads the model; download the weights there, or point model.path '
            'at the folder that has them', EXIT_USAGE)
    missing = missing_rendezvous(launch.env)
    if missing:
        add(f'{recipe["nodes"]} nodes: set {", ".join(missing)} in the environment of every node (torchrun '
            'rendezvous), e.g. NODE_RANK=0 MASTER_ADDR=10.0.0.1 on the first node', EXIT_USAGE)
    data, data_code = dataset_problems(recipe, sample_lines=DATA_CHECK_LINES)
    for message in data:
        add(message, data_code)
    return problems, code


def _has_weights(folder: str) -> bool:
    """Whether a model folder holds weights transformers loads: safetensors or PyTorch .bin files (sharded or not)."""
    return any(glob.glob(os.path.join(glob.escape(folder), pattern)) for pattern in ('*.safetensors', '*.bin'))


def _err(msg: str) -> None:
    print(f'swift-vora train: {msg}', file=sys.stderr)


def _load(args):
    from ..recipe_catalog import resolve_recipe
    overrides = list(args.overrides)
    if args.output_dir is not None:  # the flag is the key, applied last; JSON quotes keep the path one YAML string
        overrides.append(f'train.output_dir={json.dumps(args.output_dir)}')
    try:
        return load_recipe(resolve_recipe(args.recipe), overrides)
    except FileNotFoundError as e:  # neither a file nor a shipped recipe's name
        raise CliError(str(e), EXIT_USAGE) from None
    except RecipeError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def cmd_train(args) -> int:
    recipe = _load(args)
    try:
        plan = plan_recipe(recipe)
    except FileNotFoundError as e:
        raise CliError(f'{recipe.path}: model.path: {e}', EXIT_USAGE) from None
    except (KeyError, ValueError) as e:  # unknown hardware profile, bad request values, unusable config.json
        raise CliError(f'{recipe.path}: {e.args[0] if e.args else e}',
                       EXIT_INVALID if isinstance(e, UnsupportedModel) else EXIT_USAGE) from None
    try:  # does_not_fit: the launch is still built, to show the exact command that was not run
        plan, launch = launch_plan(plan, recipe)
    except LaunchUsageError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    problems, problems_code = [], EXIT_OK
    if plan.verdict == 'fits' and launch is not None:
        # What stops a launch is checked before anything is printed: with --json, stdout then holds the error only.
        problems, problems_code = launch_problems(recipe, plan, launch, args.trust_recipe_hardware)
        if problems and not args.dry_run:
            raise CliError('not launched: ' + '\n  '.join(problems), problems_code)
    if args.json:
        out = {'plan': plan.to_dict(), 'exit_code': problems_code or plan.exit_code}
        if problems:  # --dry-run: what a launch would stop at
            out['not_launched'] = problems
        if plan.verdict == 'does_not_fit':
            out['fits_with_overrides'] = fits_with_overrides(plan, recipe)  # [] when only more GPUs would do
        if launch is not None:
            out['launch'] = {'backend': launch.backend, 'argv': launch.argv, 'env': launch.env, 'files': launch.files,
                             'notes': launch.notes, 'shell': launch.shell()}
        print(dumps(out, indent=2))
    else:
        print(render_plan(plan, explain=args.explain))
    if plan.verdict != 'fits' or launch is None:
        _err(f'not launched: {plan.verdict.replace("_", " ")} (exit {plan.exit_code})')  # stderr: JSON stays clean
        overrides = [] if args.json else fits_with_overrides(plan, recipe)  # --json: `fits_with_overrides`
        if overrides:
            _err('what fits on this hardware, as recipe overrides: '
                 + shlex.join(['swift-vora', 'train', args.recipe, *overrides]))
        return plan.exit_code
    if not args.json:
        print('\nlaunch (exact command)')
        print(launch.shell())
        for note in launch.notes:
            print(f'note: {note}')
        for path, text in launch.files.items():
            print(f'\n--- {path}')
            print(text.rstrip('\n'))
    if args.dry_run:
        if problems:
            _err(f'a launch would stop here (exit {problems_code}), not launched: ' + '\n  '.join(problems))
        return problems_code
    launch.files[os.path.join(launch_dir(recipe), 'launch.json')] = launch_record(launch, plan.to_dict(), recipe)
    sys.stdout.flush()
    rc = launch.run(stdout=sys.stderr.fileno() if args.json else None)
    if rc != 0:
        _err(f'{launch.argv[0]} exited with {rc}')
    return rc
