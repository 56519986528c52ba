"""`swift-vora train RECIPE.yaml [key=value ...] [--dry-run] [--json]`: plan, then launch the chosen backend.

1. Read the recipe (errors name the file and the key; exit 2).
2. Plan it (config.json only, no weights). does_not_fit -> exit 3, refused -> exit 4, with the plan's reasons,
   before anything is launched.
3. Build the launch (swift sft / megatron sft / the Unsloth runner) with the plugin, template video_ora, the
   dataset, the video budget and window settings as SWIFT_VORA_* env, the backend's config and the guards' env.
   A MoE model under DeepSpeed ZeRO-3 is refused here too (exit 4), whatever asked for it.
4. `--dry-run`: print the plan, the exact command and every generated file, and stop (exit 0). Otherwise write
   the files and `launch.json` under OUTPUT_DIR/swift-vora-launch/ and run the command (argv list, no shell);
   the exit code is the child's.
"""
from __future__ import annotations

import json
import os
import sys

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 1, 2, 3, 4


def register_commands(subparsers) -> None:
    from .planning import register_plan_command_builders
    register_plan_command_builders()  # `swift-vora plan` prints the command `train` would run
    p = subparsers.add_parser('train', help='plan a recipe, then launch the chosen backend',
                              description=__doc__.split('\n\n')[0])
    p.add_argument('recipe', help='recipe YAML, or the name of a shipped recipe (`swift-vora recipes` lists them: '
                   'h200x1, 3060x4, ...); see docs/backends.md')
    p.add_argument('overrides', nargs='*', metavar='key=value',
                   help='dotted recipe keys, YAML values: video.max_frames=16 model.path=/models/x train.max_steps=10')
    p.add_argument('--dry-run', action='store_true', help='print the plan, the exact command and generated files; '
                   'launch nothing')
    p.add_argument('--json', action='store_true', help='with --dry-run: one JSON object (plan, argv, env, files)')
    p.set_defaults(handler=cmd_train)


def alternative_overrides(plan, recipe) -> list:
    """The planner's cheapest alternative on the recipe's own hardware, as `key=value` overrides (ms-swift's
    names where the recipe has them), or [] when only more GPUs would do."""
    same = [a for a in (getattr(plan, 'alternatives', None) or [])
            if a.get('num_gpus') == plan.num_gpus and a.get('nodes') == plan.nodes]
    if not same:
        return []
    alt = same[0]
    wanted = {'train.backend': alt['backend'], 'train.tuner_type': alt['tuner'], 'train.quantization': alt['quant'],
              'deepspeed.offload': alt['offload'], 'train.per_device_train_batch_size': alt['micro_batch']}
    if alt['backend'] == 'megatron_ep_lora':
        wanted.update({'megatron.ep': alt['ep'], 'megatron.tp': alt['tp']})
    current = {'deepspeed.offload': recipe['deepspeed.offload'] or 'none'}
    return [f'{key}={value}' for key, value in wanted.items()
            if value is not None and str(current.get(key, recipe[key])) != str(value)]


def _err(msg: str) -> None:
    print(f'swift-vora train: {msg}', file=sys.stderr)


def cmd_train(args) -> int:
    from .launch import LaunchRefused, LaunchUsageError, build_launch, launch_record, missing_rendezvous
    from .planning import command_argv, plan_recipe
    from ..recipe_catalog import resolve_recipe
    from .recipe import RecipeError, load_recipe
    try:
        recipe = load_recipe(resolve_recipe(args.recipe), args.overrides)
    except FileNotFoundError as e:
        _err(str(e))
        return EXIT_USAGE
    except RecipeError as e:
        _err(str(e))
        return EXIT_USAGE
    try:
        plan = plan_recipe(recipe)
    except FileNotFoundError as e:
        _err(f'{recipe.path}: model.path: {e}')
        return EXIT_USAGE
    except (KeyError, ValueError) as e:  # unknown hardware profile, bad request values, unsupported model
        _err(f'{recipe.path}: {e.args[0] if e.args else e}')
        return EXIT_INVALID if e.__class__.__name__ == 'UnsupportedModel' else EXIT_USAGE
    launch, refusal = None, None
    if plan.verdict != 'refused':  # does_not_fit: still show the exact command that was not run
        try:
            launch = build_launch(plan, recipe)
        except LaunchRefused as e:
            refusal = e.reasons
        except LaunchUsageError as e:
            _err(str(e))
            return EXIT_USAGE
        if launch is not None:
            plan.command = command_argv(launch)
    if refusal:
        plan.verdict = 'refused'
        plan.reasons = list(plan.reasons) + refusal
        plan.command = []
    if args.json:
        out = {'plan': plan.to_dict(), 'exit_code': plan.exit_code}
        if plan.verdict == 'does_not_fit':
            out['fits_with_overrides'] = alternative_overrides(plan, recipe)  # [] when only more GPUs would do
        if launch is not None:
            out['launch'] = {'backend': launch.backend, 'argv': launch.argv, 'env': launch.env, 'files': launch.files,
                             'notes': launch.notes, 'shell': launch.shell()}
        print(json.dumps(out, indent=2, default=str))
    else:
        from ..plan.cli import render_plan
        print(render_plan(plan))
    if plan.verdict != 'fits' or launch is None:
        if not args.json:
            _err(f'not launched: {plan.verdict.replace("_", " ")} (exit {plan.exit_code})')
            overrides = alternative_overrides(plan, recipe)
            if overrides:
                _err(f'what fits on this hardware, as recipe overrides: swift-vora train {args.recipe} '
                     f'{" ".join(overrides)}')
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
        return EXIT_OK
    missing = missing_rendezvous(launch.env)
    if missing:
        _err(f'{recipe["nodes"]} nodes: set {", ".join(missing)} in the environment of every node (torchrun '
             'rendezvous), e.g. NODE_RANK=0 MASTER_ADDR=10.0.0.1 on the first node')
        return EXIT_USAGE
    from .deepspeed import launch_dir
    launch.files[os.path.join(launch_dir(recipe), 'launch.json')] = launch_record(launch, plan.to_dict(), recipe)
    sys.stdout.flush()
    rc = launch.run()
    if rc != 0:
        _err(f'{launch.argv[0]} exited with {rc}')
    return rc
