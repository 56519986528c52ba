"""Where commands write (and what they read): one check and one atomic writer shared by every command.

Rules (issue #19, docs/errors.md):
- an output never aliases an input: the same file under another spelling (`./a.jsonl`, an absolute
  path, a symlink or a hard link) is found by comparing real paths and `os.path.samefile`;
- an output never replaces something that is not a regular file: a device (`/dev/full`), a FIFO, a
  directory or a symlink is refused rather than swapped for a regular file by the rename;
- a file is written to a temporary file in the same directory and renamed over the target, so a
  failed run leaves the old file (or nothing), never half an output; the files of one command are staged
  together (`staged()`) and renamed only when it succeeds, and SIGTERM removes the temporary files
  (`enable_signal_cleanup`, issue #33).
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import stat
import tempfile
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, TextIO, Tuple

from .errors import OutputPathError, Terminated, UsageError


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): they cannot be one file
        return False


def check_input_file(path: str, what: str = 'input') -> str:
    """Return `path` if it can be read as a file; raise `UsageError` naming it otherwise.

    A pipe is fine (it ends); a device such as /dev/zero or /dev/urandom is refused, because it never
    ends and one endless line would grow without bound."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise UsageError(f'{what} {path}: a device, not a file')
        open(path, 'rb').close()
    except OSError as exc:
        raise UsageError(f'{what} {path}: {exc.strerror or exc}') from None
    return path


def check_output_file(path: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> str:
    """Return `path` if a regular file may be (re)written there; raise `OutputPathError` otherwise."""
    path = os.fspath(path)
    if not path.strip():
        raise OutputPathError(f'{what}: empty path')
    for source in inputs:
        if source is not None and _same_file(path, os.fspath(source)):
            raise OutputPathError(f'{what} {path} is the input {source}; writing it would destroy the input '
                                  '(choose another output path)')
    if os.path.islink(path):
        raise OutputPathError(f'{what} {path} is a symbolic link; refusing to replace it (write to its target '
                              'or another path)')
    if os.path.lexists(path):
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            raise OutputPathError(f'{what} {path} is a directory, not a file')
        if not stat.S_ISREG(mode):
            raise OutputPathError(f'{what} {path} exists and is not a regular file (a device, FIFO or socket); '
                                  'refusing to replace it')
    parent = os.path.dirname(os.path.abspath(path))
    _check_parent(parent, what, path)
    return path


def check_output_dir(path: str, inputs: Iterable[Optional[str]] = (), what: str = 'output directory') -> str:
    """Return `path` if it is a directory or can become one; raise `OutputPathError` otherwise.

    Nothing is created here, so a command that fails a later check leaves no directory behind."""
    path = os.fspath(path)
    if not path.strip():
        raise OutputPathError(f'{what}: empty path')
    for source in inputs:
        if source is not None and _same_file(path, os.fspath(source)):
            raise OutputPathError(f'{what} {path} is the input {source}')
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputPathError(f'{what} {path} exists and is not a directory')
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputPathError(f'{what} {path} is not writable')
        return path
    _check_parent(os.path.dirname(os.path.abspath(path)), what, path)
    return path


def inside(folder: str, member: str) -> Optional[str]:
    """`folder/member` normalized, or None when `member` is absolute or climbs out of `folder`: where an archive's
    member may be written (a name like `../x` or `/etc/x` must not be)."""
    if os.path.isabs(member) or member.startswith(('/', '\\')):
        return None
    target = os.path.normpath(os.path.join(folder, member))
    if os.path.commonpath([os.path.abspath(folder), os.path.abspath(target)]) != os.path.abspath(folder):
        return None
    return target


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, 'wb') as handle:
        handle.write(data)


def _check_parent(parent: str, what: str, path: str) -> None:
    """The nearest existing ancestor must be a writable directory (missing levels are created later)."""
    probe = parent
    while not os.path.lexists(probe):
        up = os.path.dirname(probe)
        if up == probe:
            break
        probe = up
    if not os.path.isdir(probe):
        raise OutputPathError(f'{what} {path}: {probe} is not a directory')
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputPathError(f'{what} {path}: directory {probe} is not writable')


# ---- staged writes: every file a command writes, renamed over its target only when the command succeeds ---------
class Staging:
    """The files of one command: each is written to a temporary file next to its target (`.NAME.XXXX.tmp`), and
    `commit` renames them over their targets, `discard` removes them. A command that fails half-way (an exception,
    a full disk, SIGTERM with `enable_signal_cleanup`) therefore leaves every earlier output exactly as it was,
    and no temporary file. Folders made for the files are removed again on discard when they stay empty.

    Use `staged()`, which commits when its block ends normally and discards when it raises."""

    def __init__(self) -> None:
        self._files: List[Tuple[str, str, str]] = []  # (temporary, target, what)
        self._made_dirs: List[str] = []
        self._stale: List[str] = []  # earlier outputs this command replaces by nothing: removed on commit

    def remove_on_commit(self, path: str) -> None:
        """Remove `path` (an earlier output of the same command) when the others are renamed into place."""
        self._stale.append(path)

    def temp_path(self, path: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> str:
        """A temporary file (created, empty) that `commit` renames to `path`; for writers that take a path."""
        path = check_output_file(os.fspath(path), inputs, what)
        if any(os.path.abspath(target) == os.path.abspath(path) for _, target, _ in self._files):
            raise OutputPathError(f'{what} {path} is written twice by one command')
        directory = os.path.dirname(os.path.abspath(path))
        self._makedirs(directory, what, path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f'.{os.path.basename(path)}.', suffix='.tmp', dir=directory)
        except OSError as exc:
            raise _named(exc, path, what) from None
        os.close(fd)
        _track(tmp)
        self._files.append((tmp, path, what))
        return tmp

    @contextlib.contextmanager
    def open(self, path: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> Iterator[TextIO]:
        """A text handle on a new temporary file for `path` (UTF-8); flushed and synced when the block ends. An
        OSError while writing (a full disk) names `path`."""
        tmp = self.temp_path(path, inputs, what)
        try:
            with open(tmp, 'w', encoding='utf-8') as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise _named(exc, path, what) from None

    def write_with(self, path: str, writer: Callable[[str], Any], inputs: Iterable[Optional[str]] = (),
                   what: str = 'output') -> str:
        """`writer(temporary_path)` writes the file (matplotlib's savefig, a copy); an OSError names `path`."""
        tmp = self.temp_path(path, inputs, what)
        try:
            writer(tmp)
        except OSError as exc:
            raise _named(exc, path, what) from None
        return path

    def write_text(self, path: str, text: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> str:
        with self.open(path, inputs, what) as handle:
            handle.write(text)
        return path

    def write_bytes(self, path: str, data: bytes, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> str:
        """`data` as the file (an archive's member, a part of one); an OSError names `path`."""
        return self.write_with(path, lambda tmp: _write_bytes(tmp, data), inputs, what)

    def commit(self) -> None:
        """Rename every temporary file over its target (in the order written), with the umask's permissions."""
        mode = 0o666 & ~_umask()
        targets = {target for _, target, _ in self._files}
        try:
            while self._files:
                tmp, target, what = self._files[0]
                try:
                    os.chmod(tmp, mode)
                    os.replace(tmp, target)
                except OSError as exc:
                    raise _named(exc, target, what) from None
                _untrack(tmp)
                self._files.pop(0)
        except BaseException:
            self.discard()  # the files not renamed yet
            raise
        self._made_dirs.clear()  # they hold the outputs now
        for path in self._stale:
            if path not in targets:
                _remove(path)
        self._stale.clear()

    def discard(self) -> None:
        """Remove every temporary file not yet renamed, and the folders made for them when they are empty."""
        for tmp, _, _ in self._files:
            _remove(tmp)
        self._files.clear()
        for directory in reversed(self._made_dirs):
            try:
                os.rmdir(directory)
            except OSError:  # not empty (something else was written there) or already gone
                pass
        self._made_dirs.clear()

    def _makedirs(self, directory: str, what: str, path: str) -> None:
        missing = []
        probe = directory
        while not os.path.isdir(probe):
            missing.append(probe)
            up = os.path.dirname(probe)
            if up == probe:
                break
            probe = up
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:
                continue
            except OSError as exc:
                raise _named(exc, path, what) from None
            self._made_dirs.append(folder)


@contextlib.contextmanager
def staged() -> Iterator[Staging]:
    """A `Staging` committed when the block ends normally and discarded when it raises (SIGTERM included)."""
    stage = Staging()
    try:
        yield stage
    except BaseException:
        stage.discard()
        raise
    stage.commit()


@contextlib.contextmanager
def atomic_text_writer(path: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> Iterator[TextIO]:
    """Open a temporary file next to `path` for writing text; on success rename it over `path`.

    `path` is checked with `check_output_file` first. On any exception the temporary file is removed
    and `path` is left as it was (a staging of one file)."""
    with staged() as stage, stage.open(path, inputs, what) as handle:
        yield handle


def write_text_atomic(path: str, text: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> str:
    """Write `text` to `path` atomically (see `atomic_text_writer`); return `path`."""
    with staged() as stage:
        stage.write_text(path, text, inputs, what)
    return path


def _named(exc: OSError, path: str, what: str) -> OSError:
    """`exc` naming the output it failed on: a write to a full disk raises `[Errno 28]` with no file name."""
    named = OSError(exc.errno, f'{exc.strerror or exc}; {what} not written', path)
    return named


# ---- stdout: a write that fails names it ---------------------------------------------------------------------------
class StdoutError(OSError):
    """Writing stdout failed (`> /dev/full`, a full disk): the printed output is incomplete."""


class CheckedStdout:
    """`sys.stdout` whose every write reaches stdout or raises `StdoutError` naming stdout; a closed pipe stays a
    BrokenPipeError, which the CLI ends quietly. Everything else is delegated.

    Where stdout is a file descriptor, text is encoded and written with `os.write` until every byte is taken: the
    interpreter's buffered stdout accepted a write that a full disk or a file-size limit cut short, and reported
    nothing, so `recipes show NAME > file` on a full disk exited 0 with a truncated file. A stdout that was closed
    (`>&-`; the interpreter then has `sys.stdout = None`) is one that cannot be written: the first write says so."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failed: Optional[StdoutError] = None  # sticky: argparse's help swallows an OSError from write()
        self._fd = _descriptor(stream)
        self._flushed = False  # what was printed before the wrapping goes out first

    def write(self, text: str) -> int:
        if self._stream is None:
            self.failed = StdoutError(errno.EBADF, 'closed (the command was started with stdout closed); the output '
                                                   'printed there is lost', 'stdout')
            raise self.failed
        try:
            if self._fd is None:
                return self._stream.write(text)
            if not self._flushed:
                self._stream.flush()
                self._flushed = True
            data = text.encode(self._stream.encoding or 'utf-8', self._stream.errors or 'strict')
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]  # a short write is retried; the retry raises the errno
            return len(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = _stdout_error(exc)
            raise self.failed from None

    def flush(self) -> None:
        if self._stream is not None:
            try:
                self._stream.flush()
            except BrokenPipeError:
                raise
            except OSError as exc:
                self.failed = _stdout_error(exc)
        if self.failed is not None:
            raise self.failed

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError(errno.EBADF, 'stdout is closed')
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def occupy_closed_stdio() -> None:
    """Put /dev/null on a standard descriptor (0, 1, 2) the command was started without (`>&-`, `2>&-`): a file it
    opens would otherwise get that number, and the output of the process `train` launches, or a traceback, would be
    written into it. A closed stderr is replaced by /dev/null for this process too (print(file=None) writes to
    stdout)."""
    import sys
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, 'w')  # noqa: SIM115 - the process's stderr, for its lifetime


def _descriptor(stream) -> Optional[int]:
    """The file descriptor under the interpreter's own text stdout (None for a replaced one: a StringIO in tests)."""
    if not isinstance(stream, io.TextIOWrapper):
        return None
    try:
        return stream.fileno()
    except (OSError, ValueError):
        return None


def flush_stdout() -> None:
    """Push what was printed out now, so that a command whose stdout cannot be written fails before it commits
    its files (and never exits 0 with a truncated output)."""
    import sys
    stream = sys.stdout
    (stream if isinstance(stream, CheckedStdout) else CheckedStdout(stream)).flush()


def _stdout_error(exc: OSError) -> StdoutError:
    return StdoutError(exc.errno, f'{exc.strerror or exc}; the output printed there is incomplete', 'stdout')


# ---- SIGTERM: temporary files are removed, not left behind --------------------------------------------------------
CLEANUP_SIGNALS = tuple(getattr(signal, name) for name in ('SIGTERM', 'SIGHUP') if hasattr(signal, name))
_live: Dict[str, None] = {}  # temporary files being written, in order
_previous: Dict[int, Any] = {}  # signal -> the handler ours replaced, while ours is installed
_cleanup_enabled = False


def enable_signal_cleanup() -> None:
    """From now on, SIGTERM or SIGHUP while a staged file is written removes every temporary file and raises
    `Terminated` (the `swift-vora` entry point turns it into exit 128 + signal). Only the process's main thread
    can install a handler; library use inside another program (ms-swift) leaves that program's handlers alone."""
    global _cleanup_enabled
    _cleanup_enabled = True


def live_temporaries() -> List[str]:
    return list(_live)


def _track(tmp: str) -> None:
    _live[tmp] = None
    if _cleanup_enabled and not _previous and threading.current_thread() is threading.main_thread():
        for signum in CLEANUP_SIGNALS:
            _previous[signum] = signal.signal(signum, _on_signal)


def _untrack(tmp: str) -> None:
    _live.pop(tmp, None)
    if not _live and _previous and threading.current_thread() is threading.main_thread():
        for signum, handler in _previous.items():
            signal.signal(signum, handler)
        _previous.clear()


def _remove(tmp: str) -> None:
    try:
        os.remove(tmp)
    except FileNotFoundError:
        pass
    _untrack(tmp)


def _on_signal(signum, frame) -> None:
    for tmp in list(_live):  # here first: the exception below may land where no block discards
        try:
            os.remove(tmp)
        except OSError:
            pass
    raise Terminated(signum)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
