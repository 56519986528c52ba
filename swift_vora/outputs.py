"""Where commands write (and what they read): one check and one atomic writer shared by every command.

Rules (issue #19, docs/errors.md):
- an output never aliases an input: the same file under another spelling (`./a.jsonl`, an absolute
  path, a symlink or a hard link) is found by comparing real paths and `os.path.samefile`;
- an output never replaces something that is not a regular file: a device (`/dev/full`), a FIFO, a
  directory or a symlink is refused rather than swapped for a regular file by the rename;
- a file is written to a temporary file in the same directory and renamed over the target, so a
  failed run leaves the old file (or nothing), never half an output.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import Iterable, Iterator, Optional, TextIO

from .errors import OutputPathError, UsageError


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


@contextlib.contextmanager
def atomic_text_writer(path: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> Iterator[TextIO]:
    """Open a temporary file next to `path` for writing text; on success rename it over `path`.

    `path` is checked with `check_output_file` first. On any exception the temporary file is removed
    and `path` is left as it was."""
    check_output_file(path, inputs, what)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=f'.{os.path.basename(path)}.', suffix='.tmp', dir=directory)
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):  # only when writing or renaming failed
            os.remove(tmp_path)


def write_text_atomic(path: str, text: str, inputs: Iterable[Optional[str]] = (), what: str = 'output') -> str:
    """Write `text` to `path` atomically (see `atomic_text_writer`); return `path`."""
    with atomic_text_writer(path, inputs, what) as handle:
        handle.write(text)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
