"""`--out-dir` output of `swift-vora eval`: metrics.json, report.md and one PNG timeline per video.

Plots are drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global backend
switch). Which videos get a plot: worst first (parse failures and missing predictions, then lowest
IoU), at most `max_plots`.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional

from ..json_output import dumps
from ..outputs import check_output_dir, write_text_atomic
from .evaluate import COUNT_KEYS, SUMMARY_KEYS, EvalResult

DEFAULT_MAX_PLOTS = 20


def write_outputs(result: EvalResult, out_dir: str, max_plots: int = DEFAULT_MAX_PLOTS,
                  inputs: Optional[dict] = None) -> dict:
    """Write metrics.json, report.md and plots/*.png; return {'metrics': path, 'report': path, 'plots': [...]}.

    `inputs` ({'annotations': path, ...}) are named in the report and never overwritten."""
    sources = inputs or {}
    protected = [path for path in sources.values() if path]
    check_output_dir(out_dir, protected, what='--out-dir')
    os.makedirs(out_dir, exist_ok=True)
    metrics_path = os.path.join(out_dir, 'metrics.json')
    write_text_atomic(metrics_path, dumps(result.metrics, indent=2) + '\n', protected)
    chosen = _worst(result)[:max(0, max_plots)]
    plots = []
    if chosen:
        plot_dir = os.path.join(out_dir, 'plots')
        os.makedirs(plot_dir, exist_ok=True)
        for i, key in enumerate(chosen):
            path = os.path.join(plot_dir, f'{i:03d}_{_safe(key)}.png')
            plot_timeline(result, key, path)
            plots.append(path)
    report_path = os.path.join(out_dir, 'report.md')
    write_text_atomic(report_path, render_markdown(result, [os.path.relpath(p, out_dir) for p in plots], chosen,
                                                   sources), protected)
    return {'metrics': metrics_path, 'report': report_path, 'plots': plots}


def _safe(key: str) -> str:
    return re.sub(r'[^A-Za-z0-9._-]+', '_', key)[:60] or 'video'


def _badness(result: EvalResult, key: str):
    pv = result.per_video[key]
    broken = pv['missing'] or pv['failures'] > 0
    iou = pv.get('top1_iou', pv['iou'])
    return (0 if broken else 1, iou)


def _worst(result: EvalResult) -> List[str]:
    return sorted(result.annotations, key=lambda k: _badness(result, k))


def _fmt(v) -> str:
    if v is None:
        return 'n/a'
    if isinstance(v, float):
        return f'{v:.2f}'
    return str(v)


def render_markdown(result: EvalResult, plot_paths: List[str], plotted: List[str], inputs: dict) -> str:
    m = result.metrics
    lines = ['# swift-vora eval report', '']
    for name, value in inputs.items():
        lines.append(f'- {name}: `{value}`')
    lines += [f'- annotation format: {result.format}', '', '## Metrics', '',
              '| metric | value |', '| --- | --- |']
    unit = ' (%)'
    for k in SUMMARY_KEYS[result.format]:
        if k in m:
            lines.append(f'| {k}{unit} | {_fmt(m[k])} |')
    lines += ['', 'Percentages, two decimals. QVHighlights keys follow the official Moment-DETR evaluator '
              '(see docs/eval.md for the few deliberate differences: missing or unparseable predictions score 0).',
              '', '## Counts', '', '| count | value |', '| --- | --- |']
    for k in COUNT_KEYS:
        lines.append(f'| {k} | {m.get(k, 0)} |')
    if m.get('parse_failure_kinds'):
        lines.append(f"| parse failures by kind | {', '.join(f'{k}: {v}' for k, v in m['parse_failure_kinds'].items())} |")
    repairs = {k: v for k, v in (m.get('repairs') or {}).items() if v}
    if repairs:
        lines.append(f"| repairs in parsed answers | {', '.join(f'{k}: {v}' for k, v in repairs.items())} |")
    if m.get('parse_formats'):
        lines.append(f"| parsed answer formats | {', '.join(f'{k}: {v}' for k, v in m['parse_formats'].items())} |")
    probs = m.get('problems', {})
    if probs.get('parse_failures'):
        lines += ['', '## Parse failures', '', '| id | line | failure | flags |', '| --- | --- | --- | --- |']
        for p in probs['parse_failures']:
            lines.append(f"| {p['id']} | {p['line']} | {p['failure']} | {', '.join(p.get('flags') or [])} |")
    for title, key in (('Missing predictions', 'missing'), ('Unknown prediction ids', 'unknown')):
        if probs.get(key):
            lines += ['', f'## {title}', '', ', '.join(f'`{x}`' for x in probs[key])]
    if probs.get('invalid_lines'):
        lines += ['', '## Invalid prediction lines', '', '| line | reason |', '| --- | --- |']
        for p in probs['invalid_lines']:
            lines.append(f"| {p['line']} | {p['reason']} |")
    if plotted:
        lines += ['', '## Timelines (worst first)', '']
        iou_name = 'top-1 IoU' if result.format == 'qvhighlights' else 'IoU'
        lines += [f'| id | video | {iou_name} | kept F1 | failures |', '| --- | --- | --- | --- | --- |']
        for key in plotted:
            pv = result.per_video[key]
            lines.append(f"| {key} | {result.annotations[key].title} | {100 * pv.get('top1_iou', pv['iou']):.2f} | "
                         f"{100 * pv['f1']:.2f} | {'missing' if pv['missing'] else pv['failures']} |")
        lines.append('')
        for key, path in zip(plotted, plot_paths):
            lines += [f'### {key}', '', f'![{key}]({path})', '']
    return '\n'.join(lines) + '\n'


def plot_timeline(result: EvalResult, key: str, path: str) -> None:
    """Ground truth vs prediction on one time axis; clips the model saw as thin bars; parse failures
    hatched red over the clip they belong to (or a red label when the clip is unknown)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    ann = result.annotations[key]
    pred = result.predictions.get(key)
    pv = result.per_video[key]
    windows = [(s, e) for s, e, _ in (pred.windows if pred else [])]
    ends = [e for _, e in ann.windows] + [e for _, e in windows] + \
           [c[1] for c in (pred.clips if pred else []) if c[1] is not None]
    xmax = ann.duration or max(ends + [1.0])
    fig = Figure(figsize=(10, 2.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.broken_barh([(s, e - s) for s, e in ann.windows], (1.1, 0.7), facecolors='tab:green')
    handles = [Patch(color='tab:green', label='ground truth')]
    if result.format == 'qvhighlights' and len(windows) > 1:
        # ranked windows: all of them light, the first (what R1 scores) dark
        ax.broken_barh([(s, e - s) for s, e in windows[1:]], (0.1, 0.7), facecolors='tab:blue', alpha=0.3)
        ax.broken_barh([(windows[0][0], windows[0][1] - windows[0][0])], (0.1, 0.7), facecolors='tab:blue',
                       edgecolors='navy')
        handles += [Patch(color='tab:blue', label='prediction (top-1)'),
                    Patch(color='tab:blue', alpha=0.3, label='other predicted windows')]
    else:
        ax.broken_barh([(s, e - s) for s, e in windows], (0.1, 0.7), facecolors='tab:blue')
        handles.append(Patch(color='tab:blue', label='prediction'))
    if pred and pred.clips:
        for i, (s, e) in enumerate(sorted(pred.clips)):  # alternate two lanes so overlapping clips show
            ax.broken_barh([(s, (e if e is not None else xmax) - s)], (-0.12 - 0.14 * (i % 2), 0.1),
                           facecolors='0.6', edgecolors='0.3', linewidth=0.5)
        handles.append(Patch(color='0.6', label='clips seen'))
    label = None
    if pred is None:
        label = 'no prediction'
    elif pred.failures:
        spans = [(f['clip_start'], f['clip_end']) for f in pred.failures if f.get('clip_start') is not None]
        for s, e in spans:
            ax.broken_barh([(s, (e if e is not None else xmax) - s)], (0.1, 0.7), facecolors='none',
                           edgecolors='tab:red', hatch='///', linewidth=1.0)
        handles.append(Patch(facecolor='none', edgecolor='tab:red', hatch='///', label='parse failure'))
        if len(spans) < len(pred.failures):
            label = 'parse failure: ' + ', '.join(sorted({f['failure'] for f in pred.failures}))
    if label:
        ax.text(xmax / 2, 0.45, label, color='tab:red', ha='center', va='center', fontsize=10, fontweight='bold')
    ax.set_xlim(0, xmax)
    ax.set_ylim(-0.35, 1.9)
    ax.set_yticks([0.45, 1.45])
    ax.set_yticklabels(['prediction', 'ground truth'])
    ax.set_xlabel('seconds')
    iou = pv.get('top1_iou', pv['iou'])
    title = f'{key} ({ann.title})' if ann.title != key else key
    if ann.query:
        q = ann.query if len(ann.query) <= 70 else ann.query[:67] + '...'
        title += f' | {q}'
    ax.set_title(f"{title}\nIoU {100 * iou:.1f}  kept-F1 {100 * pv['f1']:.1f}", fontsize=9)
    ax.legend(handles=handles, loc='upper center', bbox_to_anchor=(0.5, -0.3), fontsize=7, ncol=len(handles),
              frameon=False)
    fig.savefig(path, bbox_inches='tight')
