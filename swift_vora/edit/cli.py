"""`swift-vora cut`: prediction lines -> timelines (OpenTimelineIO, Final Cut Pro XML, CMX 3600 EDL) and a render.

Exit codes: 0 written; 1 a line that cannot be cut (not a prediction line, a video that is missing or not a video,
windows past the duration or reversed, a format that cannot hold a video's rate) or nothing kept at all -- no file
is written then; 2 usage (a file that cannot be read, an output path that cannot be written).
"""
from __future__ import annotations

import sys

from ..cli_values import OUTPUT_DIR_FLAGS, number
from ..errors import EXIT_OK
from ..json_output import dumps


def register_commands(subparsers) -> None:
    from .formats import FORMATS, format_name
    from .timeline import CutRules
    defaults = CutRules()
    p = subparsers.add_parser(
        'cut', help='prediction lines -> an edit: .otio, Final Cut Pro XML, CMX 3600 EDL, a rendered video',
        description='Turn the windows of `swift-vora predict` into the clips an editor keeps (padded, short gaps '
                    'joined, short clips dropped, cut on the nearest frame of each video\'s own rate) and write '
                    'them with OpenTimelineIO\'s adapters, and/or render them into one video file.')
    p.add_argument('predictions', metavar='PREDICTIONS', help='the JSONL file written by `swift-vora predict`')
    p.add_argument('--to', action='append', type=format_name, choices=sorted(FORMATS), metavar='FORMAT',
                   help='a timeline format, repeatable: ' + ', '.join(f'{n} ({f.title}, {f.suffix})' for n, f in
                                                                     sorted(FORMATS.items())) +
                        ' (default: otio; fcpxml is read as fcp_xml)')
    p.add_argument(*OUTPUT_DIR_FLAGS, dest='output_dir', metavar='DIR',
                   help='where the timelines go (default: cut/ beside PREDICTIONS)')
    p.add_argument('--name', default='highlights', help='the timeline\'s name and file name (default: highlights)')
    p.add_argument('--per-video', action='store_true',
                   help='one timeline per video (files named after its id) instead of one for the whole file')
    p.add_argument('--render', metavar='FILE', help='also render the kept clips into one video (.mp4, .mov, .mkv)')
    p.add_argument('--pad', type=number(0, 3600), default=defaults.pad, metavar='S',
                   help=f'seconds added before and after each window (default {defaults.pad:g})')
    p.add_argument('--merge-gap', type=number(0, 3600), default=defaults.merge_gap, metavar='S',
                   help=f'windows at most this far apart once padded (--pad on each side) become one clip (default '
                        f'{defaults.merge_gap:g})')
    p.add_argument('--min-clip', type=number(0, 3600), default=defaults.min_clip, metavar='S',
                   help=f'clips shorter than this are dropped, and counted (default {defaults.min_clip:g}; 0: '
                        'keep all)')
    p.add_argument('--json', action='store_true', help='print what was cut and written as one JSON object')
    p.set_defaults(handler=run_cut)


def run_cut(args) -> int:
    from ..outputs import flush_stdout
    from .cut import cut
    from .timeline import CutRules

    def report(result) -> None:  # printed before the files are renamed into place: a failing stdout leaves none
        print_result(result, args.json)
        flush_stdout()

    cut(args.predictions, formats=args.to or ['otio'], output_dir=args.output_dir, name=args.name,
        per_video=args.per_video, render_to=args.render,
        rules=CutRules(pad=args.pad, merge_gap=args.merge_gap, min_clip=args.min_clip), before_commit=report)
    return EXIT_OK


def print_result(result, as_json: bool = False, stream=None) -> None:
    from .cut import summary
    stream = stream or sys.stdout
    done = summary(result)
    if as_json:
        print(dumps(done), file=stream)
        return
    for v in done['videos']:
        extra = []
        if v['joined']:
            extra.append(f"{v['joined']} window(s) joined")
        if v['dropped_short']:
            extra.append(f"{v['dropped_short']} shorter than {result.rules.min_clip:g} s dropped")
        print(f"{v['id']}: {v['clips']} clip(s), {v['kept_seconds']:.2f} s at {v['fps']:g} fps"
              + (f" ({', '.join(extra)})" if extra else '') + ('' if v['clips'] else ' -- nothing kept'), file=stream)
        for note in v['notes']:
            print(f'  note: {note}', file=stream)
    print(f"kept: {sum(v['clips'] for v in done['videos'])} clip(s), "
          f"{sum(v['kept_seconds'] for v in done['videos']):.2f} s from {len(done['videos'])} video(s)", file=stream)
    for path in done['files']:
        print(f'wrote {path}', file=stream)
    r = done['render']
    if r is not None:
        print(f"rendered {r['file']}: {r['frames']} frames, {r['seconds']:.2f} s at {r['fps']:g} fps, "
              f"{r['width']}x{r['height']}, {'with' if r['audio'] else 'no'} audio", file=stream)
