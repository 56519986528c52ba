"""The kernel cache as one file that travels: so that a fresh machine (a rented GPU, a new container, CI with a GPU)
starts its first optimizer step in seconds instead of recompiling and re-autotuning for minutes.

    swift-vora kernel-cache export FILE [--part-mib N]   # Triton's and inductor's caches -> FILE (xz), or parts
    swift-vora kernel-cache import FILE                  # FILE, or FILE.part0 FILE.part1 ... found beside it

What travels: Triton's cache (compiled kernels, their launchers, autotuning timings) and inductor's (torch.compile's
generated code and FX graphs), the folders `kernel_cache.cache_dirs()` names on each machine. Not Unsloth's
generated modules: Unsloth writes them at import for the packages installed there. Both caches key every entry on the
source, the versions (torch, Triton, CUDA) and the GPU architecture, so an entry made elsewhere is used only where it
is valid; the archive records where it came from (`kernel-cache.json`: GPU, versions, folders) and `import` says when
this machine differs (the entries then miss; nothing breaks). Triton's group files (`__grp__*.json`) name their
members by absolute path: `import` rewrites the exporting folder to this machine's.

`--part-mib` splits the archive into FILE.part0, .part1, ... (a transfer that limits file sizes); `import` takes
them in order. xz checks its own integrity, so a truncated or altered archive fails to decompress and nothing of it
is written. Files already in the cache are kept (never overwritten).
"""
from __future__ import annotations

import contextlib
import io
import json
import lzma
import os
import re
import tarfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from .. import outputs
from ..errors import EXIT_INVALID, EXIT_USAGE, CliError
from . import kernel_cache

# The caches that travel (variable -> what it holds): see the module docstring for why not Unsloth's.
TRAVELLING = ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR')
INFO = 'kernel-cache.json'
XZ_PRESET = 6  # compiled kernels compress about as well at 6 as at 9, in a third of the time
TRITON_GROUP_PREFIX = '__grp__'
EXPORT = 'swift-vora kernel-cache export'
IMPORT = 'swift-vora kernel-cache import'


def _travelling(environ: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """variable -> folder in effect on this machine, for the caches that travel."""
    return {var: d for var, d in kernel_cache.cache_dirs(environ).items() if var in TRAVELLING}


def _versions() -> Dict[str, Any]:
    """torch / Triton versions and the GPU, where importable: what decides whether entries made here are valid there."""
    found: Dict[str, Any] = {}
    try:
        import torch
        found['torch'] = torch.__version__
        found['cuda'] = torch.version.cuda
        if torch.cuda.is_available():
            found['gpu'] = torch.cuda.get_device_name()
            found['capability'] = list(torch.cuda.get_device_capability())
    except ImportError:
        pass
    try:
        import triton
        found['triton'] = triton.__version__
    except ImportError:
        pass
    return found


def _files(folder: str) -> List[str]:
    out = []
    for d, _, files in os.walk(folder):
        out.extend(os.path.relpath(os.path.join(d, f), folder) for f in files)
    return sorted(out)


def export(path: str, part_mib: Optional[float] = None, environ: Optional[Mapping[str, str]] = None,
           versions: Optional[Callable[[], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Write the travelling caches to `path` (or `path.partN`, each at most `part_mib` MiB). Returns what it wrote."""
    t0 = time.time()
    folders = _travelling(environ)
    files = {var: _files(d) if os.path.isdir(d) else [] for var, d in folders.items()}
    if not any(files.values()):
        raise CliError(f'the caches are empty ({", ".join(folders.values())}): run a training '
                       'step first', EXIT_INVALID, command=EXPORT)
    info = {'folders': folders, 'files': {var: len(f) for var, f in files.items()},
            'made_on': (versions or _versions)(), 'created': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}
    buffer = io.BytesIO()
    with lzma.open(buffer, 'wb', preset=XZ_PRESET) as xz, tarfile.open(fileobj=xz, mode='w') as tar:
        data = json.dumps(info, indent=1, sort_keys=True).encode()
        member = tarfile.TarInfo(INFO)
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
        for var, names in files.items():
            for name in names:
                try:
                    tar.add(os.path.join(folders[var], name), arcname=f'{var}/{name}', recursive=False)
                except FileNotFoundError:  # a cache entry replaced while we read (a training running beside)
                    info['files'][var] -= 1
    blob = buffer.getvalue()
    size = max(1, int(part_mib * 2 ** 20)) if part_mib else len(blob)
    pieces = {f'{path}.part{i // size}' if part_mib else path: blob[i:i + size] for i in range(0, len(blob), size)}
    # an earlier export, whole or in parts, would be read instead of (or with) this one
    stale = [p for p in _parts(path) + ([path] if os.path.isfile(path) else []) if p not in pieces]
    with outputs.staged() as stage:  # every file renamed into place together, or none
        for target, data in pieces.items():
            stage.write_bytes(target, data, what='kernel-cache archive')
    for old in stale:
        os.remove(old)
    written = list(pieces)
    return {'files': written, 'bytes': len(blob), 'entries': info['files'], 'folders': folders,
            'made_on': info['made_on'], 'seconds': round(time.time() - t0, 1)}


def _parts(path: str) -> List[str]:
    """path.part0, path.part1, ... that exist, in order (stops at the first gap)."""
    found, i = [], 0
    while os.path.isfile(f'{path}.part{i}'):
        found.append(f'{path}.part{i}')
        i += 1
    return found


def _read(path: str) -> bytes:
    """The archive's bytes: `path` itself, else its parts concatenated (`path` may name a part)."""
    part = re.search(r'\.part\d+$', path)
    base = path[:part.start()] if part else path
    if os.path.isfile(base):
        with open(base, 'rb') as f:
            return f.read()
    parts = _parts(base)
    if not parts:
        raise CliError(f'{base}: no such file, nor {base}.part0', EXIT_USAGE, command=IMPORT)
    chunks = []
    for part in parts:
        with open(part, 'rb') as f:
            chunks.append(f.read())
    return b''.join(chunks)


def import_(path: str, environ: Optional[Mapping[str, str]] = None,
            versions: Optional[Callable[[], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Unpack an exported archive into this machine's cache folders. Returns counts and the differences found."""
    t0 = time.time()
    command = IMPORT
    blob = _read(path)
    folders = _travelling(environ)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob)), mode='r:')
    except (lzma.LZMAError, EOFError, tarfile.TarError) as e:
        raise CliError(f'{path}: not a complete kernel-cache archive ({e}); a part missing or cut short?',
                       EXIT_INVALID, command=command) from e
    with contextlib.ExitStack() as stack:
        stack.enter_context(tar)
        first = tar.next()
        if first is None or first.name != INFO:
            raise CliError(f'{path}: its first member is not {INFO}', EXIT_INVALID, command=command)
        try:
            info = json.loads(tar.extractfile(first).read())
            if not (isinstance(info.get('made_on'), dict) and isinstance(info.get('folders'), dict)):
                raise ValueError('"made_on" and "folders" must be objects')
        except (ValueError, AttributeError) as e:
            raise CliError(f'{path}: {INFO} is not what export writes ({e})', EXIT_INVALID, command=command) from e
        here = (versions or _versions)()
        differs = {k: {'archive': info['made_on'].get(k), 'here': here.get(k)}
                   for k in ('torch', 'triton', 'cuda', 'capability')
                   if k in here and info['made_on'].get(k) != here.get(k)}
        written = kept = 0
        stage = stack.enter_context(outputs.staged())  # the files appear together once all were read, or none
        for member in iter(tar.next, None):
            var, _, rel = member.name.partition('/')
            if var not in folders or not rel:
                raise CliError(f'{path}: member {member.name!r} is in no cache this archive may fill', EXIT_INVALID,
                               command=command)
            if not member.isfile():
                raise CliError(f'{path}: member {member.name!r} is not a plain file', EXIT_INVALID, command=command)
            target = outputs.inside(folders[var], rel)
            if target is None:
                raise CliError(f'{path}: member {member.name!r} leaves its cache folder', EXIT_INVALID,
                               command=command)
            if os.path.exists(target):
                kept += 1
                continue
            data = tar.extractfile(member).read()
            if var == 'TRITON_CACHE_DIR' and os.path.basename(rel).startswith(TRITON_GROUP_PREFIX):
                data = _group_here(data, target, path)
            stage.write_bytes(target, data, what='kernel cache entry')
            written += 1
    return {'written': written, 'kept': kept, 'folders': folders, 'made_on': info['made_on'],
            'differs': differs, 'seconds': round(time.time() - t0, 1)}


def _group_here(data: bytes, target: str, source: str) -> bytes:
    """A Triton group file pointed at this machine: it lists its members by absolute path, and Triton writes them
    into the group file's own folder (FileCacheManager.put_group), which is where they are unpacked here."""
    try:
        group = json.loads(data)
        paths = group['child_paths']
        group['child_paths'] = {name: os.path.join(os.path.dirname(target), os.path.basename(p))
                                for name, p in paths.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CliError(f'{source}: Triton group file {os.path.basename(target)} is not one Triton writes ({e})',
                       EXIT_INVALID, command=IMPORT) from e
    return json.dumps(group).encode()


def describe_export(r: Mapping[str, Any]) -> str:
    entries = ', '.join(f'{n} {kernel_cache.CACHE_FOLDERS[v]}' for v, n in r['entries'].items())
    return (f'kernel cache exported: {entries} entries, {r["bytes"] / 2 ** 20:.1f} MiB in {len(r["files"])} '
            f'file(s) ({", ".join(r["files"])}) in {r["seconds"]} s')


def describe_import(r: Mapping[str, Any]) -> str:
    text = (f'kernel cache imported: {r["written"]} files written, {r["kept"]} already there (kept) in '
            f'{r["seconds"]} s into {", ".join(r["folders"].values())}')
    if r['differs']:
        text += ('; made with ' + ', '.join(f'{k} {v["archive"]} (here {v["here"]})' for k, v in r['differs'].items())
                 + ': its entries will not match here, and the first step compiles as on an empty cache')
    return text
