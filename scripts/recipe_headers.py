"""The shipped recipes' planned settings and headers, written from the planner: one script for every recipe.

    python scripts/recipe_headers.py            # check: exit 1 when a header or a planned setting is out of date
    python scripts/recipe_headers.py --write    # rewrite them (then review the diff)
    python scripts/recipe_headers.py --show h200x1

For every recipes/*.yaml:
1. **Settings** -- the planner's search (swift_vora/plan/search.py) on the recipe's own hardware, model and video
   budget with the settings it searches left free (backend auto, micro-batch, checkpointed layers, DeepSpeed
   offload): the recipe writes what it chose (`train.backend`, `per_device_train_batch_size`, `checkpoint_layers`,
   `deepspeed.offload`). A recipe for no named hardware profile (cpu-tiny: a stand-in GPU on a CPU) keeps what it
   writes.
2. **Header** -- what `swift-vora train recipes/NAME.yaml --dry-run` plans on a fresh clone (the model configs
   shipped with swift-vora), the other options that fit with their hours, and the first knobs with what each buys.
   The recipe's own `# Notes:` block is kept as written.
tests/test_recipes.py checks both, and parses every header against its dry run.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, 'recipes')
sys.path.insert(0, REPO)

from swift_vora.backends.planning import plan_recipe  # noqa: E402
from swift_vora.backends.recipe import SCHEMA, Recipe, load_recipe  # noqa: E402
from swift_vora.cli.compose import launch_plan  # noqa: E402
from swift_vora.plan import speed  # noqa: E402
from swift_vora.plan.backend import DEEPSPEED  # noqa: E402
from swift_vora.plan.fit import PARTIAL_CHECKPOINT_BACKENDS  # noqa: E402
from swift_vora.plan.memory import MEGATRON_BACKENDS  # noqa: E402
from swift_vora.plan.request import Plan  # noqa: E402
from swift_vora.plan.search import describe_setting  # noqa: E402

REFERENCE_SAMPLES = 10_000  # the headers' hours are for this many windowed samples
NOTES = '# Notes:'
WIDTH = 118  # a header line, '# ' included, at most this wide (the recipes' 120 with room)
# The recipe keys the search decides, as the recipes spell them (ms-swift's names where the schema has an alias)
SEARCHED_KEYS = {'train.backend': ('train', 'backend'),
                 'train.micro_batch': ('train', 'per_device_train_batch_size'),
                 'train.checkpoint_layers': ('train', 'checkpoint_layers'),
                 'deepspeed.offload': ('deepspeed', 'offload'),
                 'megatron.ep': ('megatron', 'ep')}
NULL_KEYS = ('megatron.ep', )  # written as null (the planner's) rather than removed: their comment documents them
COMMENTS = {'train.checkpoint_layers': '# the first N decoder layers checkpointed, the rest keep their activations',
            'deepspeed.offload': '# cpu: optimizer states (and ZeRO-3 parameters) in host RAM; slower'}
# Recipes whose model is built rather than downloaded: the configuration standing in for it when planning
BUILT_MODELS = {'tiny-qwen3-vl': 'tiny_qwen3_vl'}
BACKEND_WORDS = {'ddp': 'plain swift sft (no DeepSpeed)', 'deepspeed_zero2': 'DeepSpeed ZeRO-2',
                 'deepspeed_zero3': 'DeepSpeed ZeRO-3', 'megatron_ep_lora': 'Megatron-SWIFT expert-parallel LoRA',
                 'megatron_ep_full': 'Megatron-SWIFT expert-parallel full SFT',
                 'unsloth_split_lora': "Unsloth's split MoE LoRA"}
TUNER_WORDS = {'lora': 'LoRA SFT', 'full': 'full SFT', 'selective': 'selective SFT (attention + shared experts)'}


# ---- planning a recipe as `train --dry-run` does ---------------------------------------------------------------
def _stand_in(recipe_path: str, tmp: str) -> List[str]:
    """Overrides that plan a recipe whose model is built, not downloaded, from that model's configuration."""
    recipe = load_recipe(recipe_path)
    built = BUILT_MODELS.get(os.path.basename(recipe['model.path'].rstrip('/')))
    if built is None:
        return []
    from swift_vora import tiny_model
    config, _ = getattr(tiny_model, f'{built}_config')()
    folder = os.path.join(tmp, built)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'config.json'), 'w', encoding='utf-8') as f:
        f.write(config.to_json_string())
    return [f'model.path={folder}']


def dry_run(recipe: Recipe) -> Plan:
    """The plan `swift-vora train RECIPE --dry-run` prints: planned, then launched (its command) in no environment."""
    return launch_plan(plan_recipe(recipe), recipe, environ={})[0]


def free(recipe: Recipe) -> Recipe:
    """The recipe with the settings the search decides left to it (as if the recipe did not write them)."""
    values = dict(recipe.values)
    for key in SEARCHED_KEYS:
        values[key] = SCHEMA[key][1]
    return dataclasses.replace(recipe, values=values, given=recipe.given - set(SEARCHED_KEYS))


def searched(recipe: Recipe) -> bool:
    """Whether the recipe's settings come out of the search: it plans for a named hardware profile."""
    return bool(recipe['hardware']) and recipe['hardware'] != 'local'


def derived_settings(plan: Plan) -> Dict[str, Any]:
    """The recipe values a plan of the free search stands for (None: the key is not written)."""
    layers = int(plan.model.get('num_layers') or 0)
    k = plan.checkpoint_layers
    partial = plan.backend in PARTIAL_CHECKPOINT_BACKENDS and k is not None and k < layers
    return {'train.backend': str(plan.backend), 'train.micro_batch': plan.micro_batch,
            'train.checkpoint_layers': k if partial else None,
            'deepspeed.offload': plan.offload if plan.backend in DEEPSPEED else None,
            'megatron.ep': plan.ep if plan.backend in MEGATRON_BACKENDS else None}


# ---- the header ---------------------------------------------------------------------------------------------
def _wrap(text: str, first: str = '# ', rest: str = '#   ') -> List[str]:
    words, lines, line = text.split(' '), [], first
    for word in words:
        if len(line) + len(word) + 1 > WIDTH and line.strip('# '):
            lines.append(line.rstrip())
            line = rest
        line += word + ' '
    lines.append(line.rstrip())
    return lines


def _hours(samples_per_s: Optional[float]) -> str:
    if not samples_per_s:
        return 'no estimate'
    return speed.format_hours(REFERENCE_SAMPLES / samples_per_s / 3600) + f' per {REFERENCE_SAMPLES:,} samples'


def _peak(plan: Plan) -> str:
    return f'{plan.gpu_peak_gib:.2f} GiB per GPU of {plan.gpu_capacity_gib:.2f}'


def _setting(plan: Plan) -> str:
    layers = int(plan.model.get('num_layers') or 0)
    o = {'backend': str(plan.backend), 'num_gpus': plan.num_gpus, 'nodes': plan.nodes, 'ep': plan.ep, 'tp': plan.tp,
         'micro_batch': plan.micro_batch, 'gradient_checkpointing': 'gradient checkpointing off' not in
         ' '.join(plan.assumptions), 'checkpoint_layers': plan.checkpoint_layers, 'offload': plan.offload,
         'quant': plan.quant, 'budget_lowered': False}
    return describe_setting(o, layers)


def _speed(plan: Plan) -> str:
    if not plan.hardware.get('gpu_name'):
        return 'not estimated: the recipe plans for a stand-in GPU of no known kind'
    if not plan.est_measured:
        return f'{plan.est_basis}; no estimate'
    return f'{plan.est_tokens_per_s:,.0f} tokens/s, {_hours(plan.est_samples_per_s)} ({plan.est_basis})'


def knobs(recipe: Recipe, plan: Plan) -> List[str]:
    """The first settings to turn when the plan does not fit your machine, each with its planned peak and hours."""
    layers = int(plan.model.get('num_layers') or 0)
    tries: List[Tuple[str, List[str]]] = []
    if plan.checkpoint_layers is not None and plan.checkpoint_layers < layers:
        tries.append((f'checkpoint every layer (train.checkpoint_layers={layers})', [
            f'train.checkpoint_layers={layers}']))
    if plan.micro_batch > 1:
        half = plan.micro_batch // 2
        tries.append((f'a smaller micro-batch (train.per_device_train_batch_size={half})',
                      [f'train.micro_batch={half}']))
    frames = max(recipe['video.min_frames'], recipe['video.max_frames'] // 2)
    pair = max(recipe['video.min_pair_tokens'], recipe['video.pair_tokens'] // 2)
    if frames < recipe['video.max_frames']:
        tries.append((f'fewer frames (video.max_frames={frames})', [f'video.max_frames={frames}']))
    if pair < recipe['video.pair_tokens']:
        tries.append((f'fewer tokens a frame pair (video.pair_tokens={pair})', [f'video.pair_tokens={pair}']))
    out = []
    for words, overrides in tries:
        p = dry_run(recipe.with_overrides(overrides))
        hours = f', {_hours(p.est_samples_per_s)}' if p.est_measured and plan.hardware.get('gpu_name') else ''
        out.append(f'{words}: {p.gpu_peak_gib:.2f} GiB{hours}')
    return out


def render(name: str, recipe: Recipe, plan: Plan, options: Optional[Plan], model_path: str) -> List[str]:
    """The generated header lines of one recipe (without its notes); `model_path` as the recipe writes it."""
    m, hw = plan.model, plan.hardware
    source = plan.config_source or {}
    model_id = source.get('model_id') or os.path.basename(model_path.rstrip('/'))
    kind = 'MoE' if m.get('kind') == 'moe' else 'dense'
    gpus = hw.get('num_gpus') or 1
    gpu = hw.get('gpu_name')
    where = (f'{"one" if gpus == 1 else gpus} {gpu}{"s" if gpus > 1 else ""}' if gpu else
             f'a stand-in {hw.get("gpu_mem_gib", 0):g} GiB GPU')
    lines = _wrap(f'{name}: {TUNER_WORDS[plan.tuner]} of {model_id} ({kind}) on {where}, '
                  f'{BACKEND_WORDS.get(str(plan.backend), plan.backend)}.')
    lines.append('#')
    host = f'{hw["host_ram_gib"]:.1f} GiB host RAM; {hw.get("host_ram_source")}' if hw.get('host_ram_gib') else ''
    if gpu:
        lines += _wrap(f'Hardware: {gpus} x {gpu} ({hw.get("gpu_mem_gib", 0):.2f} GiB each as torch reports)'
                       + (f', {host}' if host else '') + '.')
    else:
        lines += _wrap(f'Hardware: no profile -- {gpus} x {hw.get("gpu_mem_gib", 0):g} GiB as the recipe\'s gpus and '
                       f'gpu_mem_gib say, {hw.get("host_ram_gib", 0):g} GiB host RAM (host_ram_gib).')
    params = f'{m.get("total_params", 0) / 1e9:.2f} B parameters' + (
        f', {m.get("active_params", 0) / 1e9:.2f} B active' if kind == 'MoE' else '')
    lines += _wrap(f'Model: {model_id} ({kind}, {params}, {m.get("num_layers")} layers).')
    if source.get('model_id'):
        lines.append(f'#   huggingface-cli download {source["model_id"]} --local-dir {model_path}')
    lines += ['# Command:', f'#   swift-vora train recipes/{name}.yaml --dry-run',
              f'#   swift-vora train recipes/{name}.yaml']
    tok = plan.tokens or {}
    lines += _wrap(f'Plan (swift-vora train --dry-run, predicted): {_setting(plan)}; {_peak(plan)}, host '
                   f'{plan.host_peak_gib:.2f} GiB; {tok.get("total_tokens")} tokens a sample ({tok.get("frames")} '
                   f'frames x {tok.get("tokens_per_group")} tokens a pair).')
    lines += _wrap(f'Speed: {_speed(plan)}.')
    if options is not None and searched(recipe):
        lines += _wrap('Settings: the planner\'s search on this hardware (scripts/recipe_headers.py) -- the fewest '
                       'estimated hours that fit, with 5 % of the GPU kept free. Options that fit:')
        for o in options.options:
            pace = (f'{o["est_tokens_per_s"]:,.0f} tokens/s, {_hours(o["est_samples_per_s"])}' if o['est_measured']
                    else speed.NO_MEASUREMENT)
            mark = '*' if o['chosen'] else '-'
            lines += _wrap(f'{mark} {describe_setting(o, int(m.get("num_layers") or 0))}: {o["gpu_peak_gib"]:.2f} '
                           f'GiB, {pace}', first='#   ', rest='#       ')
    else:
        lines += _wrap('Settings: as written (the planner searches nothing this recipe sets).')
    lines += _wrap('When it does not fit, each alone: ' + '; '.join(knobs(recipe, plan)) + '.')
    return lines


# ---- reading and writing a recipe file ------------------------------------------------------------------------
def split(text: str) -> Tuple[List[str], List[str], str]:
    """(generated header lines, notes lines, body) of a recipe file."""
    lines = text.split('\n')
    end = next((i for i, line in enumerate(lines) if not line.startswith('#')), len(lines))
    header, body = lines[:end], '\n'.join(lines[end:])
    at = next((i for i, line in enumerate(header) if line.startswith(NOTES)), len(header))
    generated = header[:at]
    while generated and generated[-1] == '#':
        generated.pop()
    return generated, header[at:], body


def write_value(body: str, key: str, value: Any) -> str:
    """`body` with the recipe key set to `value`: the line replaced, its comment kept; added under its section
    (the section added at the end) when absent; removed when `value` is None (`null` for NULL_KEYS)."""
    section, name = SEARCHED_KEYS[key]
    names = {name, key.split('.', 1)[1]}
    if value is None and key in NULL_KEYS:
        value = 'null'
    lines = body.split('\n')
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f'{section}:'), None)
    if start is None:
        if value is None:
            return body
        return body.rstrip('\n') + f'\n\n{section}:\n  {name}: {value}\n'
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((' ', '#'))),
               len(lines))
    pattern = re.compile(r'^(\s+)(' + '|'.join(map(re.escape, names)) + r'):(\s*)([^#\n]*?)(\s*#.*)?$')
    for i in range(start + 1, end):
        found = pattern.match(lines[i])
        if not found:
            continue
        if value is None:
            j = i + 1
            while j < end and re.match(r'^\s+#\s{10,}', lines[j]):  # the comment's continuation lines
                j += 1
            del lines[i:j]
            return '\n'.join(lines)
        text = f'{found.group(1)}{found.group(2)}:{found.group(3) or " "}{value}'
        comment = (found.group(5) or '').strip()
        lines[i] = text + (' ' * max(1, 29 - len(text)) + comment if comment else '')
        return '\n'.join(lines)
    if value is None:
        return body
    after = next((i for i in range(start + 1, end) if lines[i].strip().startswith('gradient_checkpointing:')),
                 start)
    new = f'  {name}: {value}'
    lines.insert(after + 1, new + (' ' * max(1, 29 - len(new)) + COMMENTS[key] if key in COMMENTS else ''))
    return '\n'.join(lines)


def differs(key: str, have: Any, want: Any) -> bool:
    """Whether the recipe's value is not the search's: a backend that takes no CPU offload leaves deepspeed.offload
    alone; every layer checkpointed is the key unset."""
    if key == 'deepspeed.offload':
        return want is not None and (have or 'none') != want
    return have != want


def regenerate(path: str) -> Tuple[str, List[str]]:
    """(the recipe file as the planner writes it, what differs from the file as it is)."""
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding='utf-8') as f:
        text = f.read()
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        overrides = _stand_in(path, tmp)
        recipe = load_recipe(path, overrides)
        options = None
        if searched(recipe):
            options = plan_recipe(free(recipe))
            generated, notes, body = split(text)
            for key, want in derived_settings(options).items():
                if differs(key, recipe[key], want):
                    problems.append(f'{name}: {key} is {recipe[key]!r}, the search chooses {want!r}')
                    body = write_value(body, key, want)
            text = '\n'.join([*generated, *notes, body])
            recipe = load_recipe(_write_tmp(tmp, text), overrides)
        plan = dry_run(recipe)
        generated, notes, body = split(text)
        if plan.gpu_peak_gib is None or plan.verdict == 'refused':  # nothing to state: say why, leave it as it is
            problems.append(f'{name}: train --dry-run does not plan it ({plan.verdict}): ' + ' '.join(plan.reasons))
            return text, problems
        header = render(name, recipe, plan, options, load_recipe(path)['model.path'])
        if header != generated:
            problems.append(f'{name}: the header is not what the planner says now')
        out = '\n'.join([*header, *(['#', *notes] if notes else []), body])
    return out, problems


def _write_tmp(tmp: str, text: str) -> str:
    path = os.path.join(tmp, 'recipe.yaml')
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)
    return path


def recipe_paths() -> List[str]:
    return sorted(glob.glob(os.path.join(RECIPES, '*.yaml')))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--write', action='store_true', help='rewrite the headers and the searched settings')
    ap.add_argument('--show', metavar='NAME', help='print one recipe as the planner writes it')
    args = ap.parse_args(argv)
    failed = False
    for path in recipe_paths():
        name = os.path.splitext(os.path.basename(path))[0]
        if args.show and name != args.show:
            continue
        text, problems = regenerate(path)
        if args.show:
            print(text, end='')
            continue
        if problems and args.write:
            with open(path, 'w', encoding='utf-8') as f:
                f.write(text)
            print(f'{name}: rewritten ({"; ".join(problems)})')
        elif problems:
            failed = True
            print('\n'.join(problems))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
