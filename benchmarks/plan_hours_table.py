"""The plan's hours against what was measured: the shipped recipes and the held-in scenarios, in one table.

    python benchmarks/plan_hours_table.py             # markdown (docs/planner.md carries it between its markers)
    python benchmarks/plan_hours_table.py --check     # exit 1 when docs/planner.md's copy is not what this prints

Hours are for 10,000 windowed samples. A recipe's row is what `swift-vora train recipes/NAME.yaml --dry-run` plans
on a fresh clone, and what was measured at its settings where a run measured them (else "not measured"). The held-in
scenarios are the runs the planner's efficiencies were fitted to (benchmarks/speed_table.py's rows marked `fit`):
their estimate matches by construction, which is what they show -- that the plan's hours are the measured speed
carried through the same FLOPs; the out-of-sample accuracy is speed_table.py's.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DOC = os.path.join(REPO, 'docs', 'planner.md')
BEGIN, END = '<!-- plan-hours-table: benchmarks/plan_hours_table.py -->', '<!-- /plan-hours-table -->'
SAMPLES = 10_000
sys.path.insert(0, HERE)
import speed_table  # noqa: E402

# A recipe measured at its own settings: the speed_table row of that run, and how the run differed from the recipe
MEASURED_RECIPES = {
    'h200x1': ('35B-A3B MoE, 40 layers, Unsloth, mb 4, rank-scale lever, first 32 of 40 layers checkpointed (call m)',
               'the same settings on clips that encode 220 tokens a frame pair, not the cap of 256'),
}


def _headers_script():
    spec = importlib.util.spec_from_file_location('recipe_headers', os.path.join(REPO, 'scripts', 'recipe_headers.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hours(tokens_per_s: Optional[float], tokens_per_sample: float) -> Optional[float]:
    if not tokens_per_s:
        return None
    return SAMPLES * tokens_per_sample / tokens_per_s / 3600


def rows() -> List[Dict[str, Any]]:
    import tempfile

    from swift_vora.backends.recipe import load_recipe
    headers = _headers_script()
    speeds = {r['what']: r for r in speed_table.table()}
    out = []
    for path in headers.recipe_paths():
        name = os.path.splitext(os.path.basename(path))[0]
        with tempfile.TemporaryDirectory() as tmp:
            plan = headers.dry_run(load_recipe(path, headers._stand_in(path, tmp)))
        if not plan.hardware.get('gpu_name'):
            continue  # planned against a stand-in GPU (cpu-tiny): no hours to state
        per_sample = plan.tokens['total_tokens']
        measured, note = MEASURED_RECIPES.get(name, (None, ''))
        run = speeds.get(measured) if measured else None
        out.append({'what': f'recipe {name}: {plan.backend}, micro-batch {plan.micro_batch}'
                            + (f', {plan.checkpoint_layers} of {plan.model["num_layers"]} layers checkpointed'
                               if plan.checkpoint_layers is not None else ''),
                    'hardware': plan.hardware['name'], 'plan_tokens_per_s': plan.est_tokens_per_s,
                    'plan_hours': _hours(plan.est_tokens_per_s, per_sample),
                    'measured_tokens_per_s': run['measured_tokens_per_s'] if run else None,
                    'measured_hours': _hours(run['measured_tokens_per_s'], per_sample) if run else None,
                    'note': note if run else 'not measured on this hardware'})
    from swift_vora.plan import speed
    described = {m.runs: (m.describe(key[0]), m.gpu) for key, m in speed.EFFICIENCY.items()}
    for row in speed_table.ROWS:
        if not row.get('fit'):
            continue
        r = speeds[row['what']]
        tokens = speed_table.tokens_per_sample(row['source'])
        what, gpu = described[f'benchmarks/results/{row["source"][0]} ({row["source"][1]})']
        out.append({'what': f'held in: {what}', 'hardware': f'1 x {gpu}',
                    'plan_tokens_per_s': r['est_tokens_per_s'], 'plan_hours': _hours(r['est_tokens_per_s'], tokens),
                    'measured_tokens_per_s': r['measured_tokens_per_s'],
                    'measured_hours': _hours(r['measured_tokens_per_s'], tokens),
                    'note': f'{r["source"]} ({r["variant"]})'})
    return out


def _cell(value: Optional[float], unit: str = '') -> str:
    if value is None:
        return '-'
    return f'{value:,.0f}' if unit == 'tokens' else f'{value:.2f}'


def render(table: List[Dict[str, Any]]) -> str:
    lines = [BEGIN, '', f'| scenario | hardware | plan tokens/s | plan h per {SAMPLES:,} samples | measured tokens/s | '
             f'measured h per {SAMPLES:,} samples | measured h / plan h | note |', '|---|---|---|---|---|---|---|---|']
    for r in table:
        ratio = (f'{r["measured_hours"] / r["plan_hours"]:.3f}' if r['plan_hours'] and r['measured_hours']
                 else '-')  # hours ratio: the measured speed over the planned
        lines.append(f'| {r["what"]} | {r["hardware"]} | {_cell(r["plan_tokens_per_s"], "tokens")} | '
                     f'{_cell(r["plan_hours"])} | {_cell(r["measured_tokens_per_s"], "tokens")} | '
                     f'{_cell(r["measured_hours"])} | {ratio} | {r["note"]} |')
    lines += ['', END]
    return '\n'.join(lines)


def documented() -> Optional[str]:
    with open(DOC, encoding='utf-8') as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        return None
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true', help="exit 1 when docs/planner.md's table is out of date")
    args = ap.parse_args(argv)
    table = render(rows())
    if args.check:
        ok = documented() == table
        print('docs/planner.md: the table is current' if ok else 'docs/planner.md: the table is out of date')
        return 0 if ok else 1
    print(table)
    return 0


if __name__ == '__main__':
    sys.exit(main())
