"""`--output_dir` output of `swift-vora eval`: metrics.json, report.md, overview.png and one PNG timeline per video.

Plots are drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global backend
switch). `overview.png` is the whole set in one figure: the per-video IoU distribution and how far predicted
starts and ends land from the ground truth. Which videos get a timeline: those the model answered (at least one
clip parsed), lowest IoU first; when there are more than `max_plots`, the worst half and the best half, so the
report shows both what goes wrong and what good looks like. Videos without an answer (missing, or every clip
unparseable) are listed in the report and plotted only when room is left.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

from ..intervals import iou
from ..json_output import dumps
from ..outputs import Staging, check_output_dir, staged
from .evaluate import COUNT_KEYS, SUMMARY_KEYS, EvalResult

DEFAULT_MAX_PLOTS = 20


def write_outputs(result: EvalResult, out_dir: str, max_plots: int = DEFAULT_MAX_PLOTS,
                  inputs: Optional[dict] = None, stage: Optional[Staging] = None) -> dict:
    """Write metrics.json, report.md and plots/*.png; return {'metrics': path, 'report': path, 'plots': [...]}.

    `inputs` ({'annotations': path, ...}) are named in the report and never overwritten. The files are staged
    (swift_vora.outputs): with `stage` they are renamed into `out_dir` when the caller commits, else together at
    the end, so a failure half-way (a full disk, a plot that cannot be drawn) leaves the folder as it was."""
    if stage is None:
        with staged() as own:
            return write_outputs(result, out_dir, max_plots, inputs, own)
    sources = inputs or {}
    protected = [path for path in sources.values() if path]
    check_output_dir(out_dir, protected, what='--output_dir')
    metrics_path = os.path.join(out_dir, 'metrics.json')
    stage.write_text(metrics_path, dumps(result.metrics, indent=2) + '\n', protected, '--output_dir file')
    chosen = choose_timelines(result, max(0, max_plots))
    overview_path = os.path.join(out_dir, 'overview.png')
    overview = overall_summary(result)
    stage.write_with(overview_path, lambda tmp: plot_overview(result, overview, tmp), protected, '--output_dir file')
    plots = []
    folder = os.path.join(out_dir, 'plots')
    if os.path.isdir(folder):  # an earlier report's timelines: the new report's replace them, the rest go
        for name in os.listdir(folder):
            if PLOT_NAME.match(name):
                stage.remove_on_commit(os.path.join(folder, name))
    for i, key in enumerate(chosen):
        path = os.path.join(out_dir, 'plots', f'{i:03d}_{_safe(key)}.png')
        stage.write_with(path, lambda tmp, key=key: plot_timeline(result, key, tmp), protected, '--output_dir file')
        plots.append(path)
    report_path = os.path.join(out_dir, 'report.md')
    stage.write_text(report_path, render_markdown(result, [os.path.relpath(p, out_dir) for p in plots], chosen,
                                                  sources, overview, os.path.relpath(overview_path, out_dir)),
                     protected, '--output_dir file')
    return {'metrics': metrics_path, 'report': report_path, 'plots': plots, 'overview': overview_path}


PLOT_NAME = re.compile(r'^\d{3}_[A-Za-z0-9._-]+\.png$')  # the timelines write_outputs names (NNN_ID.png)


def _safe(key: str) -> str:
    return re.sub(r'[^A-Za-z0-9._-]+', '_', key)[:60] or 'video'


def _badness(result: EvalResult, key: str):
    pv = result.per_video[key]
    broken = pv['missing'] or pv['failures'] > 0
    iou = pv.get('top1_iou', pv['iou'])
    return (0 if broken else 1, iou)


def _worst(result: EvalResult) -> List[str]:
    return sorted(result.annotations, key=lambda k: _badness(result, k))


def answered(result: EvalResult, key: str) -> bool:
    """The model answered this video: a prediction exists and at least one of its clips parsed."""
    pred = result.predictions.get(key)
    return pred is not None and pred.rows > len(pred.failures)


def _iou_of(result: EvalResult, key: str) -> float:
    pv = result.per_video[key]
    return pv.get('top1_iou', pv['iou'])


def choose_timelines(result: EvalResult, max_plots: int) -> List[str]:
    """Answered videos, lowest IoU first (the worst and the best halves when they do not all fit), then the
    unanswered ones if plots are left."""
    if max_plots <= 0:
        return []
    with_answer = sorted((k for k in result.annotations if answered(result, k)), key=lambda k: _iou_of(result, k))
    if len(with_answer) > max_plots:
        worst = (max_plots + 1) // 2
        with_answer = with_answer[:worst] + with_answer[len(with_answer) - (max_plots - worst):]
    without = [k for k in _worst(result) if not answered(result, k)]
    return (with_answer + without)[:max_plots]


def _scored_windows(result: EvalResult, key: str) -> List[Tuple[float, float]]:
    """The predicted windows a metric scores: the top-1 for ranked QVHighlights answers, all of them otherwise."""
    pred = result.predictions.get(key)
    windows = [(s, e) for s, e, _ in (pred.windows if pred else [])]
    return windows[:1] if result.format == 'qvhighlights' else windows


def overall_summary(result: EvalResult) -> dict:
    """The set at a glance: IoU per answered video, and for each scored predicted window that overlaps a ground
    truth window, the start and end offsets (prediction - truth, seconds) to the best-overlapping one."""
    ious, starts, ends, unmatched = [], [], [], 0
    keys = [k for k in result.annotations if answered(result, k)]
    for key in keys:
        ious.append(_iou_of(result, key))
        truth = result.annotations[key].windows
        for window in _scored_windows(result, key):
            best = max(truth, key=lambda t: iou(t, window), default=None)
            if best is None or iou(best, window) <= 0:
                unmatched += 1
                continue
            starts.append(window[0] - best[0])
            ends.append(window[1] - best[1])
    return {'videos': len(result.annotations), 'answered': len(keys), 'ious': ious, 'start_offsets': starts,
            'end_offsets': ends, 'unmatched_windows': unmatched}


def _median(values: List[float]) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def plot_overview(result: EvalResult, summary: dict, path: str) -> None:
    """One figure for the whole set: IoU per answered video, start offsets, end offsets."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    iou_name = 'top-1 IoU' if result.format == 'qvhighlights' else 'IoU'
    panels = ((summary['ious'], f'{iou_name} per answered video', [i / 10 for i in range(11)], 'tab:blue'),
              (summary['start_offsets'], 'start offset, s (prediction - truth)', 20, 'tab:green'),
              (summary['end_offsets'], 'end offset, s (prediction - truth)', 20, 'tab:orange'))
    for i, (values, label, bins, color) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        if values:
            ax.hist(values, bins=bins, color=color, edgecolor='white')
            med = _median(values)
            ax.axvline(med, color='black', linestyle='--', linewidth=1)
            ax.set_title(f'median {med:.2f}  (n={len(values)})', fontsize=9)
        else:
            ax.text(0.5, 0.5, 'nothing to show', ha='center', va='center', transform=ax.transAxes, color='tab:red')
        if i > 0:
            ax.axvline(0, color='0.5', linewidth=0.8)
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel('videos' if i == 0 else 'windows', fontsize=8)
    m = result.metrics
    fig.suptitle(f"{summary['answered']} of {summary['videos']} videos answered ({m.get('parse_failures', 0)} parse "
                 f"failures, {m.get('missing_predictions', 0)} missing); mIoU {_fmt(m.get('mIoU'))} %", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, bbox_inches='tight', format='png')  # format: `path` may be a staged .tmp file


def _fmt(v) -> str:
    if v is None:
        return 'n/a'
    if isinstance(v, float):
        return f'{v:.2f}'
    return str(v)


def render_markdown(result: EvalResult, plot_paths: List[str], plotted: List[str], inputs: dict,
                    overview: Optional[dict] = None, overview_path: Optional[str] = None) -> str:
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
        kinds = ', '.join(f'{k}: {v}' for k, v in m['parse_failure_kinds'].items())
        lines.append(f'| parse failures by kind | {kinds} |')
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
    if overview is not None:
        lines += ['', '## Overall', '', f"{overview['answered']} of {overview['videos']} videos answered (at least "
                  'one clip parsed).', '']
        ious, starts, ends = overview['ious'], overview['start_offsets'], overview['end_offsets']
        if ious:
            lines.append(f"- IoU per answered video: median {_median(ious):.2f}; {sum(v >= 0.5 for v in ious)} of "
                         f'{len(ious)} at 0.5 or more')
        if starts:
            lines.append(f'- offsets of {len(starts)} predicted windows to the truth they overlap most: start median '
                         f'{_median(starts):+.2f} s (|median| {_median([abs(v) for v in starts]):.2f} s), end median '
                         f'{_median(ends):+.2f} s (|median| {_median([abs(v) for v in ends]):.2f} s)')
        if overview['unmatched_windows']:
            lines.append(f"- {overview['unmatched_windows']} predicted windows overlap no ground truth window")
        if overview_path:
            lines += ['', f'![overview]({overview_path})']
    if plotted:
        lines += ['', '## Timelines (answered videos, lowest IoU first; then unanswered ones)', '']
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
    fig.savefig(path, bbox_inches='tight', format='png')  # format: `path` may be a staged .tmp file
