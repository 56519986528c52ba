"""`swift-vora predict`: new videos -> one prediction line per video (docs/contract.md, docs/eval.md).

Exit codes: 0 every video predicted (answers that did not parse are counted and shown, not an error); 1 a video
that cannot be read, one `swift infer` returned no answer for, an output file that holds lines that are not
prediction lines, or `swift infer` failing (the videos it finished are kept); 2 usage (a path that does not
exist, a folder without videos, two videos with one id, a checkpoint that is not one).
"""
from __future__ import annotations

import sys

from ..cli_values import positive_int
from ..errors import EXIT_INVALID, EXIT_OK, InvalidInput, UsageError
from ..json_output import dumps


def register_commands(subparsers) -> None:
    p = subparsers.add_parser(
        'predict', help='new videos through a trained checkpoint: the windows to keep, one JSON line per video',
        description='Cut every video into the checkpoint\'s windows, answer each with ms-swift\'s engine (as `eval '
                    '--adapters` does), map the answers back to the video\'s time and write one JSON line per '
                    'video. Videos already in the output are skipped (resuming a stopped run).')
    p.add_argument('inputs', nargs='+', metavar='VIDEO_OR_FOLDER',
                   help='video files, or folders searched recursively for them')
    p.add_argument('--adapters', metavar='CKPT', help='a LoRA checkpoint of a video_ora training')
    p.add_argument('--model', metavar='DIR', help='a merged model (swift export --merge_lora, merge_for_vllm.sh), or '
                                                 'the base model with --adapters')
    p.add_argument('--output', '-o', default='predictions.jsonl', metavar='FILE',
                   help='the prediction lines (default: ./predictions.jsonl); FILE.videos.jsonl, '
                        'FILE.swift_infer.jsonl and FILE.infer.log are written beside it')
    p.add_argument('--query', metavar='TEXT',
                   help='what to keep (default: the query the checkpoint was trained with)')
    p.add_argument('--overwrite', action='store_true',
                   help='predict videos already in the output again (the output starts afresh)')
    p.add_argument('--model-type', metavar='TYPE', help='ms-swift model_type for a local model dir (e.g. qwen3_vl)')
    p.add_argument('--infer-backend', choices=['auto', 'transformers', 'vllm'], default='auto')
    p.add_argument('--max-new-tokens', type=positive_int(1_000_000), default=None, metavar='N',
                   help='answer tokens per clip (default: the checkpoint\'s, from its longest trained answer, else 64)')
    p.add_argument('--json', action='store_true', help='print a summary of the run as one JSON object')
    p.set_defaults(handler=run_predict)


def run_predict(args) -> int:
    from ..eval.cli import check_weights
    from ..eval.inference import InferenceError
    from .run import predict, summary
    if not (args.model or args.adapters):
        raise UsageError('give --adapters CKPT (a trained checkpoint) or --model DIR (a merged model)')
    check_weights(args.model, args.adapters)
    try:
        report = predict(args.inputs, args.output, model=args.model, adapters=args.adapters, query=args.query,
                         overwrite=args.overwrite, backend=None if args.infer_backend == 'auto' else args.infer_backend,
                         max_new_tokens=args.max_new_tokens, model_type=args.model_type)
    except InferenceError as exc:
        raise InvalidInput(f'{exc}\n(the videos answered completely before it stopped are in {args.output}; '
                           'run the same command again to predict the rest)') from None
    summary(report, lambda text: print(text, file=sys.stderr, flush=True))
    if args.json:
        print(dumps(report.to_json()))
    return EXIT_INVALID if report.unreadable or report.unanswered else EXIT_OK
