"""`swift-vora eval` and `swift-vora parse`.

Exit codes (docs/contract.md): 0 ok; 1 invalid input found (an annotation line or a prediction line that
cannot be used; with `--strict` also missing predictions or unknown ids; for `parse --strict`, any
response that did not parse); 2 usage error (a file that cannot be opened).
"""
from __future__ import annotations

import os
import sys
from collections import Counter

from .. import jsonl
from ..cli_values import OUTPUT_DIR_FLAGS, nonnegative_int, number, positive_int
from ..errors import InvalidInput, UsageError
from ..json_output import dumps

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def register_commands(subparsers) -> None:
    p = subparsers.add_parser(
        'eval', help='score predictions against annotations (QVHighlights metrics, kept seconds)',
        description='Score predictions (JSONL; `pred_relevant_windows` or raw model text in `response`) '
                    'against annotations (QVHighlights or swift-vora JSONL). Row format: docs/eval.md.')
    p.add_argument('--annotations', required=True, metavar='FILE', help='annotation JSONL (QVHighlights or swift-vora)')
    p.add_argument('--predictions', metavar='FILE',
                   help='prediction JSONL; with --model/--adapters, where the inferred predictions are written')
    p.add_argument('--model', metavar='DIR', help='run inference with this model first (swift infer, video_ora)')
    p.add_argument('--adapters', metavar='CKPT', help='run inference with this adapter checkpoint first')
    p.add_argument('--model-type', metavar='TYPE', help='ms-swift model_type for a local model dir (e.g. qwen3_vl)')
    p.add_argument('--infer-backend', choices=['auto', 'transformers', 'vllm'], default='auto')
    p.add_argument('--max-new-tokens', type=positive_int(1_000_000), default=None, metavar='N',
                   help='answer tokens per clip (default: the checkpoint\'s, from its longest trained answer, else 64)')
    p.add_argument('--json', action='store_true', help='print the metrics as one JSON object')
    p.add_argument(*OUTPUT_DIR_FLAGS, dest='out_dir', metavar='DIR',
                   help='write metrics.json, report.md, overview.png and plots/*.png here, when the evaluation '
                        'succeeds (ms-swift\'s name; --out-dir and --out are the older ones)')
    p.add_argument('--max-plots', type=nonnegative_int(100_000), default=20, metavar='N',
                   help='at most N timeline plots in --output_dir, worst videos first (default 20; 0: none)')
    p.add_argument('--strict', action='store_true', help='exit 1 also on missing predictions or unknown ids')
    p.set_defaults(handler=run_eval)

    q = subparsers.add_parser(
        'parse', help='read model responses back into [start, end] windows',
        description='Read model responses (one JSON string per line on stdin, or --text) and print one JSON '
                    'array of [start, end] per line. Junk prints [] and is counted on stderr.')
    q.add_argument('--text', action='append', metavar='TEXT',
                   help='a response to parse (repeatable); stdin is not read')
    q.add_argument('--duration', type=number(0, above=True), metavar='S',
                   help='clip length in seconds: clamp to [0, S]')
    q.add_argument('--details', action='store_true',
                   help='print the full parse result (windows, ok, failure, format, repairs, flags) per line')
    q.add_argument('--strict', action='store_true', help='exit 1 when any response did not parse')
    q.set_defaults(handler=run_parse)


# ---- eval ---------------------------------------------------------------------------------------
def run_eval(args) -> int:
    from ..outputs import check_output_dir, check_output_file
    from .evaluate import COUNT_KEYS, SUMMARY_KEYS, InputError, evaluate
    _check_readable(args.annotations, '--annotations')
    # Every path is checked before anything is created or launched: a typo must leave no directory behind.
    if args.out_dir is not None:  # '' included: an empty path is an error, not "no --output_dir"
        check_output_dir(args.out_dir, [args.annotations], what='--output_dir')
    if args.model or args.adapters:
        from .inference import InferenceError, run_inference
        check_weights(args.model, args.adapters)
        if not args.predictions:
            base = args.out_dir or os.path.dirname(os.path.abspath(args.adapters or args.model))
            args.predictions = os.path.join(base, 'predictions.jsonl')
        check_output_file(args.predictions, [args.annotations], what='--predictions')
        try:
            run_inference(args.annotations, args.predictions, model=args.model, adapters=args.adapters,
                          backend=None if args.infer_backend == 'auto' else args.infer_backend,
                          max_new_tokens=args.max_new_tokens, model_type=args.model_type)
        except InferenceError as exc:
            raise InvalidInput(str(exc)) from None
    elif not args.predictions:
        raise UsageError('give --predictions FILE, or --model/--adapters to run inference')
    _check_readable(args.predictions, '--predictions')
    try:
        result, invalid = evaluate(args.annotations, args.predictions)
    except InputError as exc:
        if args.json:
            print(dumps({'error': str(exc), 'exit_code': EXIT_INVALID, 'invalid_annotation_lines': exc.problems}))
        print(f'swift-vora eval: {exc}', file=sys.stderr)
        for p in exc.problems[:20]:
            print(f"  {args.annotations}:{p['line']}: {p['reason']}", file=sys.stderr)
        return EXIT_INVALID
    m = result.metrics
    if args.json:
        print(dumps(m))
    else:
        print(f'format: {result.format}')
        for k in SUMMARY_KEYS[result.format]:
            if k in m:
                v = m[k]
                print(f"{k:24s} {'n/a' if v is None else f'{v:6.2f}'}")
        for k in COUNT_KEYS:
            print(f'{k:24s} {m[k]}')
    problems = []
    if m['parse_failures']:
        problems.append(f"{m['parse_failures']} parse failure(s) ({_kinds(m['parse_failure_kinds'])}); they score 0")
    if m['missing_predictions']:
        problems.append(f"{m['missing_predictions']} annotation(s) without a prediction; they score 0")
    if m['unknown_ids']:
        problems.append(f"{m['unknown_ids']} prediction id(s) not in the annotations, ignored (first: "
                        + ', '.join(f"{args.predictions}:{u['line']} id {u['id']!r}"
                                    for u in m['problems']['unknown_lines'][:5]) + ')')
    if m['zero_length_windows']:
        first = m['problems']['zero_length_windows'][0]
        problems.append(f"{m['zero_length_windows']} zero-length window(s) in pred_relevant_windows scored IoU 0 "
                        f"in place, as the official evaluator scores them (first: {args.predictions}:{first['line']}: "
                        f"field 'pred_relevant_windows'[{first['index']}])")
    if m['windows_past_duration']:
        first = m['problems']['windows_past_duration'][0]
        problems.append(f"{m['windows_past_duration']} predicted window(s) end past their video's duration: the kept "
                        "seconds count them up to the end, moment retrieval scores them as submitted (first: id "
                        f"{first['id']!r}, window {first['window']})")
    if invalid:
        problems.append(f'{len(invalid)} invalid prediction line(s) in {args.predictions}, ignored (their queries '
                        'score 0):')
    for line in problems:
        print(f'swift-vora eval: {line}', file=sys.stderr)
    for p in invalid[:20]:
        print(f"  {args.predictions}:{p['line']}: {p['reason']}", file=sys.stderr)
    if len(invalid) > 20:
        print(f'  ... and {len(invalid) - 20} more (all of them: --json, problems.invalid_lines)', file=sys.stderr)
    code = EXIT_INVALID if invalid or (args.strict and (m['missing_predictions'] or m['unknown_ids'])) else EXIT_OK
    if args.out_dir:
        # Written last and only on success: an evaluation that exits 1 (invalid lines, --strict) or whose stdout
        # cannot be written leaves an earlier --output_dir exactly as it was.
        if code != EXIT_OK:
            print(f'swift-vora eval: --output_dir {args.out_dir} not written (exit {code}: fix the lines above; any '
                  'earlier report there is left as it was)', file=sys.stderr)
            return code
        from ..outputs import flush_stdout
        from .report import write_outputs
        flush_stdout()
        written = write_outputs(result, args.out_dir, max_plots=args.max_plots,
                                inputs={'annotations': args.annotations, 'predictions': args.predictions})
        print(f"swift-vora eval: wrote {written['metrics']}, {written['report']}, {written['overview']} and "
              f"{len(written['plots'])} timeline(s)", file=sys.stderr)
    return code


def check_weights(model, adapters) -> None:
    """`--model DIR` / `--adapters CKPT` name a model directory / a LoRA checkpoint (eval and predict), else a usage
    error naming the flag."""
    for flag, path, marker in (('--model', model, 'config.json'), ('--adapters', adapters, 'adapter_config.json')):
        if path and not os.path.isdir(path):
            raise UsageError(f'{flag} {path}: not a directory (a local model or adapter checkpoint)')
        if path and not os.path.isfile(os.path.join(path, marker)):
            raise UsageError(f'{flag} {path}: no {marker} in it (not a '
                             f'{"model directory" if flag == "--model" else "LoRA adapter checkpoint"})')
    if adapters:
        # what `swift infer --adapters` reads besides the config, checked before it starts (it would load the base
        # model first, then fail with a traceback that names neither file)
        from ..guards.verify_adapter import ADAPTER_FILE
        if not os.path.isfile(os.path.join(adapters, ADAPTER_FILE)):
            raise UsageError(f'--adapters {adapters}: no {ADAPTER_FILE} in it (the trained weights; a checkpoint '
                             'folder written by training holds them)')
        if not os.path.isfile(os.path.join(adapters, 'args.json')):
            raise UsageError(f'--adapters {adapters}: no args.json in it (ms-swift\'s record of the training: the base '
                             'model, the video_ora template and the plugin come from it); give a checkpoint-N folder '
                             'that `swift-vora train` wrote')


def _check_readable(path: str, flag: str) -> None:
    from ..outputs import check_input_file
    check_input_file(path, what=flag)


def _kinds(kinds: dict) -> str:
    return ', '.join(f'{k}: {v}' for k, v in kinds.items())


# ---- parse --------------------------------------------------------------------------------------
# A stdin line longer than this is not read into memory: it is a `too_long` failure either way (parse_answer refuses
# more than MAX_TEXT_CHARS characters; a JSON string may escape each one in up to 12 bytes).
MAX_STDIN_LINE_BYTES = 12 * 1_000_000 + 64


def _decode_line(line: str):
    """A line is a JSON string; be kind to a JSON object with `response`/`text`, or raw text."""
    stripped = line.strip()
    try:
        value = jsonl.loads(stripped)
    except (ValueError, RecursionError):  # not JSON (or absurdly nested): parse the raw text
        return line.rstrip('\r\n')
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for k in ('response', 'text', 'output', 'answer'):
            if isinstance(value.get(k), str):
                return value[k]
    return stripped  # a bare JSON array/number: parse its text


def _too_long():
    from ..answer_parser import ParseResult
    return ParseResult(windows=[], ok=False, failure='too_long', flags=['input_capped'])


def run_parse(args) -> int:
    from ..answer_parser import parse_answer
    if args.text is not None:
        texts = args.text
    elif hasattr(sys.stdin, 'buffer'):  # bytes that are not UTF-8 must not stop the stream: replacement characters
        texts = (_decode_line(line.text) if line.text is not None else None
                 for line in jsonl.read_stream(sys.stdin.buffer, MAX_STDIN_LINE_BYTES, errors='replace'))
    else:  # a replaced stdin (tests): text already
        texts = (_decode_line(line) for line in sys.stdin)
    n = ok = 0
    failures: Counter = Counter()
    repairs: Counter = Counter()
    for text in texts:
        n += 1
        # None: a line too long to read, refused as parse_answer refuses any answer past MAX_TEXT_CHARS
        res = parse_answer(text, duration=args.duration) if text is not None else _too_long()
        if res.ok:
            ok += 1
        else:
            failures[res.failure] += 1
        repairs.update({k: v for k, v in res.repairs.items() if v})
        if args.details:
            print(dumps(res.to_dict()))
        else:
            print(dumps([[s, e] for s, e in res.windows]))
        sys.stdout.flush()
    summary = f'swift-vora parse: {n} response(s), {ok} parsed, {n - ok} failed'
    if failures:
        summary += f' ({_kinds(dict(failures))})'
    if repairs:
        summary += f'; repairs: {_kinds(dict(repairs))}'
    print(summary, file=sys.stderr)
    return EXIT_INVALID if args.strict and n - ok else EXIT_OK
