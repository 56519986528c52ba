"""`swift-vora verify-adapter CKPT [--base MODEL] [--json]`.

Reloads base + adapter in this (fresh) process with transformers + PEFT and compares every saved tensor
element-wise. Exit 0 only if all match; 1 when any tensor is different, missing or not in the file; 2 when the
checkpoint or base model cannot be found or loaded.
"""
from __future__ import annotations

from ..errors import UsageError
from ..json_output import dumps

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def register_commands(subparsers) -> None:
    p = subparsers.add_parser('verify-adapter', help='reload base + LoRA adapter and compare every saved tensor',
                              description=__doc__.splitlines()[0])
    p.add_argument('checkpoint', metavar='CKPT', help='adapter checkpoint directory (adapter_model.safetensors)')
    p.add_argument('--base', default=None, help='base model directory (default: from adapter_config.json / '
                                                'args.json)')
    p.add_argument('--json', action='store_true', help='print the report as one JSON line')
    p.set_defaults(handler=run_verify_adapter)


def run_verify_adapter(args) -> int:
    from .verify_adapter import VerifyError, summary_line, verify_adapter
    try:
        report = verify_adapter(args.checkpoint, base=args.base)
    except VerifyError as error:
        raise UsageError(str(error)) from None
    except (OSError, ValueError) as error:
        raise UsageError(f'cannot load {args.checkpoint} on {args.base or "its base"}: {error}') from None
    if args.json:
        print(dumps(report))
    else:
        print(('OK: ' if report['ok'] else 'FAILED: ') + summary_line(report))
        for item in report['mismatched']:
            print(f'  mismatched: {item}')
        for key in report['missing']:
            print(f'  missing (saved, not in the loaded model): {key}')
        for key in report['not_in_file']:
            print(f'  not in file (loaded model adapter tensor left at init): {key}')
    return EXIT_OK if report['ok'] else EXIT_INVALID
