"""`swift-vora data check | build | convert-qvhighlights`: thin wrappers over the data modules.

Exit codes (docs/contract.md): 0 ok; 1 invalid input found (`check` with any bad line, `build --strict` at the
first bad line, or nothing valid at all); 2 usage error (bad option values, unreadable input file).
Without `--strict`, `build` and `convert-qvhighlights` write the valid rows, list every rejected line
and exit 0. The data modules are imported inside handlers so `swift-vora --help` stays fast.
"""
from __future__ import annotations

import argparse
import sys

from ..cli_values import number
from ..errors import InvalidInput, UsageError
from ..json_output import dumps

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
# = windowing.MIN_CLIP_SECONDS / MIN_STRIDE_SECONDS (WindowConfig checks them again with its own message)
MIN_CLIP_SECONDS, MIN_STRIDE_SECONDS = 1.0, 0.1


def register_commands(subparsers) -> None:
    data = subparsers.add_parser('data',
                                 help='validate annotations, build windowed training rows, convert QVHighlights',
                                 description='Annotations -> validated, windowed ms-swift training rows.')
    data.set_defaults(handler=lambda args: _usage(data))
    commands = data.add_subparsers(dest='data_command', metavar='SUBCOMMAND')

    check = commands.add_parser('check', help='validate every annotation line (exit 1 if any is invalid)',
                                description='Validate every line of an annotation JSONL file and list each bad '
                                            'line with its file, line number and field.')
    check.add_argument('annotations', metavar='ANNOTATIONS', help='JSONL, one video per line (ours or QVHighlights)')
    _video_options(check)
    check.add_argument('--json', action='store_true',
                       help='print {"rows", "valid", "invalid": [{"line", "id", "reason"}], ...} as JSON')
    check.set_defaults(handler=_check)

    build = commands.add_parser('build', help='window the videos and write ms-swift training rows',
                                description='Validate, window, rebase and clip; write one ms-swift row per clip.')
    build.add_argument('annotations', metavar='ANNOTATIONS')
    build.add_argument('out', metavar='OUT.jsonl')
    build.add_argument('--window', type=number(MIN_CLIP_SECONDS, allow_zero=True), metavar='S', default=60.0,
                       help='clip length in seconds, at least 1; 0 = whole video '
                            '(default 60; longer clips cost more tokens)')
    build.add_argument('--stride', type=number(MIN_STRIDE_SECONDS), metavar='S', default=None,
                       help='seconds between clip starts (default: the window, no overlap; at most the window)')
    build.add_argument('--min-event', type=number(0), metavar='S', default=0.5,
                       help='drop event pieces shorter than this after clipping, counted (default 0.5 s)')
    build.add_argument('--min-window', type=number(0), metavar='S', default=2.0,
                       help='a trailing clip shorter than this becomes a full-length clip ending at the duration '
                            '(default 2 s)')
    _video_options(build)
    build.add_argument('--strict', action='store_true', help='stop at the first invalid line with exit 1')
    build.add_argument('--json', action='store_true', help='print the build report as JSON')
    build.set_defaults(handler=_build)

    convert = commands.add_parser('convert-qvhighlights', help='QVHighlights JSONL -> our annotation format',
                                  description='Convert QVHighlights lines (qid, vid, relevant_windows) to our format; '
                                              'every input line is converted or rejected with its reason. Videos '
                                              'are not opened (run `data check` once they are downloaded).')
    convert.add_argument('input', metavar='IN.jsonl')
    convert.add_argument('out', metavar='OUT.jsonl')
    convert.add_argument('--video-root', metavar='DIR', default=None,
                         help='write video paths as DIR/<vid>.mp4 (absolute); default: <vid>.mp4, resolved later')
    convert.add_argument('--json', action='store_true', help='print the conversion report as JSON')
    convert.set_defaults(handler=_convert)


def _video_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--video-root', metavar='DIR', default=None,
                        help='resolve relative video paths against DIR (default: the annotation file\'s directory)')
    parser.add_argument('--no-probe', action='store_true',
                        help='do not open the videos (only check they exist and are not empty); lines without '
                             'a duration are then invalid')


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _check(args) -> int:
    from .annotations import load_annotations

    report = load_annotations(_readable(args.annotations), video_root=args.video_root, probe=not args.no_probe)
    _emit(report.to_json() if args.json else report.summary(), args.json)
    if report.invalid:
        print(f'swift-vora data check: {len(report.invalid)} of {report.total} line(s) invalid', file=sys.stderr)
        return EXIT_INVALID
    if not report.total:  # nothing to train on is not a pass
        print(f'swift-vora data check: {args.annotations} holds no annotation line (empty, or blank lines only)',
              file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _build(args) -> int:
    from ..outputs import check_output_file, flush_stdout, staged
    from .annotations import AnnotationError
    from .rows import build_rows
    from .windowing import WindowConfig

    try:
        config = WindowConfig(window=args.window, stride=args.stride, min_event=args.min_event,
                              min_window=args.min_window)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_output_file(args.out, [_readable(args.annotations)], what='OUT.jsonl')
    # OUT is renamed into place last, after the report reached stdout: a failure anywhere before (no valid row, a
    # full disk, SIGTERM, stdout that cannot be written) leaves an existing OUT exactly as it was.
    with staged() as stage:
        try:
            report = build_rows(args.annotations, args.out, config, video_root=args.video_root, strict=args.strict,
                                probe=not args.no_probe, stage=stage)
        except AnnotationError as exc:
            raise InvalidInput(f'stopped (--strict) at {exc}; nothing written') from None
        failed = not report.valid  # an empty input too: a training file of no rows is no success
        if failed:
            stage.discard()
            report.written = False
        _emit(report.to_json() if args.json else report.summary(), args.json)
        if failed:
            why = ('no valid rows' if report.rows_in else
                   f'{args.annotations} holds no annotation line (empty, or blank lines only)')
            print(f'swift-vora data build: {why}; nothing written ({args.out} left as it was)', file=sys.stderr)
            return EXIT_INVALID
        flush_stdout()
    return EXIT_OK


def _convert(args) -> int:
    from ..outputs import check_output_file, flush_stdout, staged
    from .convert import convert_file

    check_output_file(args.out, [_readable(args.input)], what='OUT.jsonl')
    with staged() as stage:  # as in `data build`: OUT is replaced last, and only by something
        report = convert_file(args.input, args.out, video_root=args.video_root, stage=stage)
        failed = bool(report.lines - report.blank_lines and not report.converted)
        if failed:
            stage.discard()
            report.written = False
        _emit(report.to_json() if args.json else report.summary(), args.json)
        if failed:
            print(f'swift-vora data convert-qvhighlights: no line could be converted; nothing written ({args.out} '
                  'left as it was)', file=sys.stderr)
            return EXIT_INVALID
        flush_stdout()
    return EXIT_OK


def _emit(payload, as_json: bool) -> None:
    print(dumps(payload, indent=2) if as_json else payload)


def _readable(path: str) -> str:
    """`path` if it is a file that can be read; a usage error (exit 2) naming it otherwise."""
    from ..outputs import check_input_file
    return check_input_file(path, what='input')
