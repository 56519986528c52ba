"""`swift-vora` command line: parses arguments and hands each command to the module that owns it.

Exit codes (docs/contract.md, docs/errors.md): 0 ok, 1 invalid input found, 2 usage error, 3 does not fit,
4 refused. Command modules import heavy dependencies (torch, ms-swift) inside their handlers only, so
that `swift-vora plan` and `--help` stay fast.

Errors never end in a traceback: `main` turns the expected ones (`CliError`, a file that cannot be
read or written, a closed pipe) into one line on stderr and their exit code; with `--json`, stdout
then holds exactly one object `{"error": ..., "exit_code": ...}`. An unexpected exception is a bug:
it exits 1 with its type and message and asks for a report (`SWIFT_VORA_TRACEBACK=1` shows the
traceback).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import io
import os
import re
import signal
import sys
import traceback
import weakref
from typing import List, Optional

from .. import errors, outputs, switches
from ..errors import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CliError, UsageError

__all__ = ['EXIT_OK', 'EXIT_INVALID', 'EXIT_USAGE', 'EXIT_DOES_NOT_FIT', 'EXIT_REFUSED', 'build_parser', 'main']

# Each module defines `register_commands(subparsers)`; every parser it adds sets `handler=fn(args) -> int`.
COMMAND_MODULES = [
    'swift_vora.cli.doctor',  # doctor
    'swift_vora.cli.plan',  # plan
    'swift_vora.data.cli',  # data check | build | convert
    'swift_vora.cli.train',  # train
    'swift_vora.backends.cli',  # kernel-cache export | import
    'swift_vora.recipe_catalog',  # recipes ls | show | cp
    'swift_vora.eval.cli',  # eval, parse
    'swift_vora.predict.cli',  # predict
    'swift_vora.edit.cli',  # cut
    'swift_vora.guards.cli',  # verify-adapter
    'swift_vora.demo',  # demo
    'swift_vora.switches',  # switches
]
TRACEBACK_ENV = 'SWIFT_VORA_TRACEBACK'


UNDERSCORE_NOTE = ('Every flag may also be written with underscores, as ms-swift spells its arguments '
                   '(--output_dir for --output-dir, --max_new_tokens for --max-new-tokens).')
_PARSERS: 'weakref.WeakValueDictionary[str, _Parser]' = weakref.WeakValueDictionary()  # prog -> its parser


class _Parser(argparse.ArgumentParser):
    """The parser of `swift-vora` and of each of its commands (argparse gives subcommands their parent's class).

    - It raises instead of exiting, so that `--json` gets its error object too.
    - It reads every flag also in ms-swift's spelling: `--output_dir` is `--output-dir` wherever this parser has
      that flag (issue #33: ms-swift users type underscores; one rule instead of an alias per flag).
    - A usage error prints this command's usage (not the top level's) and, for a flag or command it does not
      know, the closest one it does (`did you mean --max-new-tokens?`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault('epilog', UNDERSCORE_NOTE)
        super().__init__(*args, **kwargs)
        _PARSERS[self.prog] = self

    def parse_known_args(self, args=None, namespace=None):
        # argparse hands a subcommand's arguments to the subcommand's parser through this method, so each parser
        # rewrites only the flags it knows (tests/test_cli_spelling.py checks that this still holds)
        return super().parse_known_args(self.with_hyphens(sys.argv[1:] if args is None else list(args)), namespace)

    def with_hyphens(self, args: List[str]) -> List[str]:
        """`args` with `--a_b[=v]` written `--a-b[=v]` where `--a-b` is a flag of this parser; nothing after `--`."""
        known = self._option_string_actions  # argparse's table of every option string (groups included)
        out = []
        for i, token in enumerate(args):
            if token == '--':
                return out + args[i:]
            name, eq, value = token.partition('=')
            if name.startswith('--') and '_' in name and name not in known:
                hyphens = '--' + name[2:].replace('_', '-')
                if hyphens in known:
                    token = hyphens + eq + value
            out.append(token)
        return out

    def error(self, message):
        self.print_usage(sys.stderr)
        raise UsageError(message + self.suggestion(message), command=self.prog)

    def suggestion(self, message: str) -> str:
        """' (did you mean X?)' for an unknown flag or command in argparse's `message`, else ''."""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            close = difflib.get_close_matches(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)), n=1)
            return f' (did you mean {close[0]}?)' if close else ''
        unknown = re.match(r'unrecognized arguments: (.*)', message)
        if not unknown:
            return ''
        flags = {_spelling(o): o for o in self._option_string_actions if o.startswith('--')}
        hints = {}
        tokens = unknown.group(1).split()
        hint_of = getattr(self, 'unknown_flag_hint', None)  # a command's own word on flags it does not take
        said = []
        for i, token in enumerate(tokens):
            if token.startswith('-'):
                close = difflib.get_close_matches(_spelling(token.split('=', 1)[0]), list(flags), n=1, cutoff=0.6)
                if close:
                    hints[token] = flags[close[0]]
                elif hint_of is not None and token.startswith('--'):
                    said.append(hint_of(token, tokens[i + 1] if i + 1 < len(tokens) else ''))
        said = [h for h in said if h]
        if said and not hints:
            return ' (' + '; '.join(said) + ')'
        if len(hints) == 1:
            return f' (did you mean {next(iter(hints.values()))}?)'
        return f' (did you mean {", ".join(f"{v} for {k}" for k, v in hints.items())}?)' if hints else ''


def _spelling(flag: str) -> str:
    """A flag compared by its words: `--Output_Dir`, `--output-dir` and `--outputdir` differ only in spelling."""
    return flag.lstrip('-').lower().replace('_', '-')


def parser_of(prog: str, default: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser of command `prog` (`swift-vora data build`) from the last `build_parser()`, else `default`."""
    return _PARSERS.get(prog, default)


# what `swift-vora --help` says above and below the commands
DESCRIPTION = ('Fine-tune video-language and MoE models with ms-swift to answer with the time intervals worth keeping: '
               'plan the run before anything loads, build the windowed data, train, then predict and cut.')
EPILOG = ('exit codes: 0 ok, 1 invalid input found, 2 usage error, 3 does not fit, 4 refused. '
          '`swift-vora COMMAND --help` for each command.')


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog='swift-vora', description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument('--version', action='store_true', help='print the version and exit')
    subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_commands(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    stdout = sys.stdout
    outputs.occupy_closed_stdio()  # started with `>&-`: no file opened later may become stdout
    # every write reaches stdout or names it (a full disk, a closed stdout), never a bare [Errno 28] or a short write
    sys.stdout = outputs.CheckedStdout(stdout)
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout


def _main(argv: List[str]) -> int:
    want_json = '--json' in argv
    command = 'swift-vora'
    outputs.enable_signal_cleanup()  # SIGTERM while writing removes the temporary files (docs/errors.md)
    try:
        parser = build_parser()
        try:
            args, rest = parser.parse_known_args(argv)
        except SystemExit as exc:  # --help: argparse printed it and exits; a stdout that took none of it fails
            outputs.flush_stdout()
            return int(exc.code or 0)
        if rest:
            # `key=value` overrides may come after the flags (`train RECIPE --dry-run video.max_frames=4`):
            # argparse stops filling a positional list at the first flag, so the leftovers are appended in order.
            if isinstance(getattr(args, 'overrides', None), list) and all('=' in a and not a.startswith('-')
                                                                             for a in rest):
                args.overrides.extend(rest)
            else:  # argparse hands the leftovers up to the top parser: the command's own parser says what it knows
                parser_of(_command_name(args), parser).error(f'unrecognized arguments: {" ".join(rest)}')
        command = _command_name(args)
        if args.version:
            from .. import __version__
            print(__version__)
            return EXIT_OK
        if args.command != 'switches':  # `swift-vora switches` is where such a name is looked into
            _check_switch_names()
        handler = getattr(args, 'handler', None)
        if handler is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        code = int(handler(args) or 0)
        outputs.flush_stdout()  # a stdout that cannot be written is a failure, never exit 0 with half an output
        return code
    except BrokenPipeError:  # `| head` closed stdout: the reader has what it wanted
        _detach_stdout()
        return EXIT_OK
    except errors.Terminated as exc:
        name = signal.Signals(exc.signum).name
        print(f'{command}: stopped by {name}; its temporary files were removed and earlier outputs left as they were',
              file=sys.stderr)
        return 128 + exc.signum
    except CliError as exc:
        return _fail(exc.command or command, str(exc), exc.exit_code, want_json)
    except outputs.StdoutError as exc:
        _detach_stdout()  # the interpreter's last flush would fail again
        print(f'{command}: stdout: {exc.strerror}', file=sys.stderr)
        return EXIT_USAGE
    except (OSError, UnicodeError) as exc:  # a path the user named cannot be read or written
        where = getattr(exc, 'filename', None)
        text = f'{where}: {exc.strerror or exc}' if where else str(exc)
        return _fail(command, text, EXIT_USAGE, want_json)
    except RecursionError:
        return _fail(command, 'input nested too deeply to read', EXIT_INVALID, want_json)
    except MemoryError:
        return _fail(command, 'out of memory while reading the input', EXIT_INVALID, want_json)
    except KeyboardInterrupt:
        print(f'{command}: interrupted', file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so plainly, never pretend it was the user's input
        if _wants_traceback():
            traceback.print_exc()
        message = (f'internal error: {type(exc).__name__}: {exc} (this is a bug in swift-vora; please report it '
                   f'with the command line; {TRACEBACK_ENV}=1 prints the traceback)')
        return _fail(command, message, EXIT_INVALID, want_json)


def _wants_traceback() -> bool:
    """`SWIFT_VORA_TRACEBACK`, read as the flag it is (`0` keeps the one line); a value it cannot read is said."""
    try:
        return switches.read(TRACEBACK_ENV)
    except switches.SwitchError as exc:
        print(f'swift-vora: {exc}', file=sys.stderr)
        return False


def _check_switch_names() -> None:
    """A `SWIFT_VORA_*` name that is not a switch, or a switch holding a value it refuses (`SWIFT_VORA_FPS=inf`,
    `SWIFT_VORA_PAIR_TOKENS=0`), is a usage error naming the variable, before the command runs: values are
    validated where they enter, not deep inside a plan (a misspelt switch would otherwise be ignored here and
    refused later by the plugin inside `swift sft`)."""
    try:
        switches.check_environment()
    except switches.SwitchError as exc:
        raise UsageError(f'{exc}; `swift-vora switches` lists them') from None


def _command_name(args) -> str:
    parts = ['swift-vora']
    if getattr(args, 'command', None):
        parts.append(args.command)
    if getattr(args, 'data_command', None):
        parts.append(args.data_command)
    if getattr(args, 'recipes_command', None):
        parts.append(args.recipes_command)
    return ' '.join(parts)


def _fail(command: str, message: str, code: int, want_json: bool) -> int:
    print(f'{command}: {message}', file=sys.stderr)
    try:
        if want_json:
            from ..json_output import print_json
            print_json({'error': message, 'exit_code': code})
        sys.stdout.flush()
    except BrokenPipeError:
        _detach_stdout()
    except OSError as exc:  # stdout itself cannot be written: stderr says so too
        _detach_stdout()
        print(f'{command}: stdout: {exc.strerror}', file=sys.stderr)
    return code


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not raise again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # captured, replaced or closed stdout
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == '__main__':
    sys.exit(main())
