"""`swift-vora` command line: parses arguments and hands each command to the module that owns it.

Exit codes (CONTRACT.md): 0 ok, 1 invalid input found, 2 usage error, 3 does not fit, 4 refused.
Command modules import heavy dependencies (torch, ms-swift) inside their handlers only, so that
`swift-vora plan` and `--help` stay fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 1, 2, 3, 4

# Each module defines `register_commands(subparsers)`; every parser it adds sets `handler=fn(args) -> int`.
COMMAND_MODULES = [
    'swift_vora.plan.cli',  # doctor, plan
    'swift_vora.data.cli',  # data check | build | convert
    'swift_vora.backends.cli',  # train
    'swift_vora.recipe_catalog',  # recipes ls | show | cp
    'swift_vora.eval.cli',  # eval, parse
    'swift_vora.guards.cli',  # verify-adapter
    'swift_vora.demo',  # demo
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='swift-vora', description=__doc__.splitlines()[0])
    parser.add_argument('--version', action='store_true', help='print the version and exit')
    subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_commands(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        # `key=value` overrides may come after the flags (`train RECIPE --dry-run video.max_frames=4`): argparse
        # stops filling a positional list at the first flag, so the leftovers are appended in order here.
        if isinstance(getattr(args, 'overrides', None), list) and all('=' in a and not a.startswith('-')
                                                                         for a in rest):
            args.overrides.extend(rest)
        else:
            parser.error(f'unrecognized arguments: {" ".join(rest)}')
    if args.version:
        from . import __version__
        print(__version__)
        return EXIT_OK
    from .env_names import unknown_name_warnings
    for warning in unknown_name_warnings():
        print(f'swift-vora: warning: {warning}', file=sys.stderr)
    handler = getattr(args, 'handler', None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(handler(args) or 0)


if __name__ == '__main__':
    sys.exit(main())
