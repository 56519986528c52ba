"""Every wheel set a GPU call needs, in ONE file that a bare machine unpacks: so that a call that needs Megatron does
not depend on earlier calls having left wheels on a warm machine.

    python scripts/gpu/wheel_pack.py pack [--sets swift,moe,megatron] [--exclude py_spy,torchao,...] [--out FILE]
    python scripts/gpu/wheel_pack.py unpack .wpk/wheels.tar.xz [--root .]   # on the GPU machine (run_all.sh does)

Why: a device call carries at most 64 MiB with the repository, and wheels are zip files whose members are already
deflated, so they do not compress further: the swift set (33 MiB), the MoE set (20), the Megatron set (5) and
Transformer Engine's slim core wheel (28) never travelled together, and a Megatron call had to follow a call that
carried the rest, on the same machine -- which the lent machines do not promise (two of three chained calls lost
it on 2026-12-03). Re-stored without compression (the same members, bytes and RECORD: pip installs it as it installs
the original) and put into one xz-compressed tar, swift + moe + Megatron + the TE core take 55.7 MiB (86 as carried
before), swift + moe 33.7 (53): xz finds the redundancy that per-member deflate cannot.

`pack` reads `.whl/<set>/**/*.whl` (the build/ folder of the swift set included) and, for `megatron`, the TE core
wheel reassembled from the `.teN` parts and checked against `.whl/megatron/SHA256SUMS`, as
scripts/gpu/setup_megatron.sh would. The archive holds them at the same paths (`.whl/<set>/...`), the TE core at
`.whl/megatron-te/<name>` with a SHA256SUMS of its own and the sha256 of the wheel it came from (setup_megatron.sh
installs it from there when that is the core `.whl/megatron/SHA256SUMS` names), and
a MANIFEST.json first: every member's sha256 and size and the sha256 of the wheel it came from.
`unpack` extracts into --root (the repository root: the scripts then find `.whl/` as if it had been carried),
checks every member against the manifest, refuses a member outside the manifest or a path that leaves --root, and
skips a file already there with the right hash. Exit 0, 1 on a failed check or missing input, 2 on usage errors.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import sys
import tarfile
import time
import zipfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from swift_vora import outputs  # noqa: E402  (the standard library only: runs before anything is installed)

SETS = ('swift', 'moe', 'megatron', 'unsloth')
MANIFEST = 'MANIFEST.json'
TE_READY_DIR = '.whl/megatron-te'
DEFAULT_OUT = '.wpk/wheels.tar.xz'
XZ_PRESET = 9 | lzma.PRESET_EXTREME
# What a device call carries next to the repository (the device tool's limit), for pack's size line.
CARRY_LIMIT_MIB = 64


class PackError(Exception):
    """A missing input or a failed check: the message says which file and what."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored_copy(wheel: bytes) -> bytes:
    """The wheel with every member stored instead of deflated: the same names, order, bytes, times and permissions
    (RECORD hashes file contents, so it stays valid)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(wheel)) as zin, zipfile.ZipFile(out, 'w', zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            copy.external_attr = info.external_attr
            copy.create_system = info.create_system
            zout.writestr(copy, zin.read(info), compress_type=zipfile.ZIP_STORED)
    return out.getvalue()


def read_sums(path: str) -> List[Tuple[str, str]]:
    """(sha256, name) lines of a sha256sum file."""
    pairs = []
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise PackError(f'{path}:{n}: expected "<sha256>  <name>", got {line.rstrip()!r}')
            pairs.append((parts[0], parts[1]))
    return pairs


def te_core(root: str) -> Tuple[str, bytes]:
    """(name, bytes) of the TE core wheel, reassembled from the parts SHA256SUMS names, each part and the whole
    checked (the rule of setup_megatron.sh)."""
    sums_path = os.path.join(root, '.whl', 'megatron', 'SHA256SUMS')
    if not os.path.isfile(sums_path):
        raise PackError(f'{sums_path}: missing (bash scripts/gpu/fetch_wheels.sh megatron writes it)')
    core: Optional[Tuple[str, str]] = None
    parts: List[Tuple[str, str]] = []
    for sha, name in read_sums(sums_path):
        if name.endswith('.whl'):
            core = (sha, name)
        elif '.part' in name:
            parts.append((sha, name))
        else:
            raise PackError(f'{sums_path}: unexpected entry {name!r}')
    if core is None or not parts:
        raise PackError(f'{sums_path}: names no TE core wheel or no parts')
    data = bytearray()
    for sha, name in parts:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            raise PackError(f'{path}: TE part missing (bash scripts/gpu/fetch_wheels.sh megatron)')
        with open(path, 'rb') as f:
            chunk = f.read()
        if sha256_bytes(chunk) != sha:
            raise PackError(f'{path}: sha256 {sha256_bytes(chunk)}, {sums_path} says {sha}')
        data += chunk
    if sha256_bytes(bytes(data)) != core[0]:
        raise PackError(f'the TE core wheel reassembled from {len(parts)} part(s) has sha256 '
                        f'{sha256_bytes(bytes(data))}, {sums_path} says {core[0]}')
    return core[1], bytes(data)


def set_wheels(root: str, name: str, exclude: Sequence[str]) -> Iterator[str]:
    """Paths (relative to root) of the set's wheels, sorted, its sub-folders included, `exclude` prefixes left out."""
    base = os.path.join(root, '.whl', name)
    if not os.path.isdir(base):
        raise PackError(f'{base}: no such wheel set (bash scripts/gpu/fetch_wheels.sh {name})')
    found = []
    for folder, _, files in os.walk(base):
        for f in files:
            if f.endswith('.whl') and not any(f.startswith(p) for p in exclude):
                found.append(os.path.relpath(os.path.join(folder, f), root))
    if not found:
        raise PackError(f'{base}: holds no wheels')
    return iter(sorted(found))


def members(root: str, sets: Sequence[str], exclude: Sequence[str]) -> Iterator[Tuple[str, bytes, str]]:
    """(archive path, bytes, sha256 of the source) of everything the archive holds but its manifest."""
    for name in sets:
        for rel in set_wheels(root, name, exclude):
            with open(os.path.join(root, rel), 'rb') as f:
                original = f.read()
            yield rel.replace(os.sep, '/'), stored_copy(original), sha256_bytes(original)
        if name == 'megatron':
            sums = os.path.join(root, '.whl', 'megatron', 'SHA256SUMS')
            with open(sums, 'rb') as f:
                text = f.read()
            yield '.whl/megatron/SHA256SUMS', text, sha256_bytes(text)
            core_name, core = te_core(root)
            stored = stored_copy(core)
            yield f'{TE_READY_DIR}/{core_name}', stored, sha256_bytes(core)
            line = f'{sha256_bytes(stored)}  {core_name}\n'.encode()
            yield f'{TE_READY_DIR}/SHA256SUMS', line, sha256_bytes(line)
            # the wheel it was stored from, as .whl/megatron/SHA256SUMS names it: setup_megatron.sh refuses a ready
            # core that a later fetch_wheels.sh has replaced (a warm machine keeps .whl/ between calls)
            source = f'{sha256_bytes(core)}  {core_name}\n'.encode()
            yield f'{TE_READY_DIR}/SOURCE_SHA256', source, sha256_bytes(source)


def _add(tar: tarfile.TarFile, path: str, data: bytes) -> None:
    info = tarfile.TarInfo(path)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # the same inputs make the same archive
    tar.addfile(info, io.BytesIO(data))


def pack(root: str, sets: Sequence[str], exclude: Sequence[str], out: str) -> Dict[str, object]:
    t0 = time.time()
    items = list(members(root, sets, exclude))
    manifest = {'sets': list(sets), 'excluded_prefixes': list(exclude),
                'members': {path: {'sha256': sha256_bytes(data), 'bytes': len(data), 'source_sha256': source}
                            for path, data, source in items}}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + '.tmp'
    with lzma.open(tmp, 'wb', preset=XZ_PRESET) as xz, tarfile.open(fileobj=xz, mode='w') as tar:
        _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for path, data, _ in items:
            _add(tar, path, data)
    os.replace(tmp, out)
    size = os.path.getsize(out)
    return {'out': out, 'members': len(items), 'stored_bytes': sum(len(d) for _, d, _ in items),
            'archive_bytes': size, 'seconds': round(time.time() - t0, 1)}


def _read_checked(archive: str, root: str) -> Tuple[Dict[str, Any], Dict[str, bytes]]:
    """(manifest, {target path: bytes}) of the whole archive, every member checked -- before anything is written, so
    that a truncated or altered archive leaves the machine as it was."""
    try:
        with tarfile.open(archive, mode='r:xz') as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST:
                raise PackError(f'{archive}: its first member is not {MANIFEST}')
            manifest = json.loads(tar.extractfile(first).read())
            expected: Dict[str, Dict[str, Any]] = manifest['members']
            found: Dict[str, bytes] = {}
            # tar.next(), not `for info in tar`: iterating starts again from the first member (the manifest)
            for info in iter(tar.next, None):
                if not info.isfile():
                    raise PackError(f'{archive}: member {info.name!r} is not a plain file')
                if info.name not in expected:
                    raise PackError(f'{archive}: member {info.name!r} is not in its manifest')
                data = tar.extractfile(info).read()
                want = expected[info.name]['sha256']
                if sha256_bytes(data) != want:
                    raise PackError(f'{archive}: member {info.name} has sha256 {sha256_bytes(data)}, the manifest '
                                    f'says {want}')
                target = outputs.inside(root, info.name)
                if target is None:
                    raise PackError(f'{archive}: member {info.name!r} leaves the unpack root {root}')
                found[target] = data
    except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError, KeyError, TypeError) as e:
        raise PackError(f'{archive}: not a complete wheel pack ({type(e).__name__}: {e})') from e
    missing = sorted(set(expected) - {os.path.relpath(t, root).replace(os.sep, '/') for t in found})
    if missing:
        raise PackError(f'{archive}: {len(missing)} member(s) of the manifest missing, first {missing[0]}')
    return manifest, found


def unpack(archive: str, root: str) -> Dict[str, object]:
    """Write the archive's files under `root` (kept where the same bytes are there) and remove the wheels of its sets
    that it does not hold: a warm machine keeps `.whl/` between calls, and two versions of one package in a set stop
    its `pip install *.whl`."""
    t0 = time.time()
    if not os.path.isfile(archive):
        raise PackError(f'{archive}: no such archive (python scripts/gpu/wheel_pack.py pack writes it)')
    manifest, found = _read_checked(archive, root)
    written = skipped = 0
    with outputs.staged() as stage:  # every file renamed into place together, or none
        for target, data in found.items():
            if os.path.isfile(target):
                with open(target, 'rb') as f:
                    if f.read() == data:  # the same bytes as the checked member
                        skipped += 1
                        continue
            stage.write_bytes(target, data, what='wheel')
            written += 1
    folders = [os.path.join(root, '.whl', name) for name in manifest['sets']]
    if 'megatron' in manifest['sets']:
        folders.append(os.path.join(root, *TE_READY_DIR.split('/')))
    removed = []
    for folder in folders:
        for d, _, files in os.walk(folder):
            for f in files:
                path = os.path.normpath(os.path.join(d, f))  # as `found` names it (`--root .` included)
                if f.endswith('.whl') and path not in found:
                    os.remove(path)
                    removed.append(os.path.relpath(path, root))
    return {'archive': archive, 'sets': manifest['sets'], 'written': written, 'already_there': skipped,
            'removed': removed, 'seconds': round(time.time() - t0, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='verb', required=True)
    p = sub.add_parser('pack', help='the wheel sets -> one xz-compressed tar of stored wheels')
    p.add_argument('--sets', default='swift,moe,megatron', help=f'comma-separated, of {", ".join(SETS)}')
    p.add_argument('--exclude', default='', help='comma-separated wheel-name prefixes to leave out (py_spy,torchao,'
                   'deepspeed,liger_kernel: what the MoE and Megatron phases never import)')
    p.add_argument('--out', default=os.path.join(REPO, DEFAULT_OUT))
    p.add_argument('--root', default=REPO, help='where .whl/ and .teN/ are (the repository root)')
    u = sub.add_parser('unpack', help='extract and check an archive pack wrote')
    u.add_argument('archive')
    u.add_argument('--root', default=REPO, help='where .whl/ goes (the repository root)')
    args = parser.parse_args(argv)
    try:
        if args.verb == 'pack':
            sets = [s for s in args.sets.split(',') if s]
            unknown = [s for s in sets if s not in SETS]
            if unknown or not sets:
                parser.error(f'--sets: unknown set(s) {unknown} (known: {", ".join(SETS)})')
            exclude = [e for e in args.exclude.split(',') if e]
            r = pack(args.root, sets, exclude, args.out)
            mib = r['archive_bytes'] / 2 ** 20
            print(f'wheel_pack: {r["members"]} files of the sets {",".join(sets)} -> {r["out"]}: '
                  f'{r["stored_bytes"] / 2 ** 20:.1f} MiB stored, {mib:.1f} MiB compressed, in {r["seconds"]} s '
                  f'(a device call carries {CARRY_LIMIT_MIB} MiB with the repository: carry '
                  f'["{os.path.relpath(r["out"], args.root)}"] alone, not the whole .wpk folder)')
        else:
            r = unpack(args.archive, args.root)
            gone = f', {len(r["removed"])} wheels not in it removed ({", ".join(r["removed"])})' if r['removed'] else ''
            print(f'wheel_pack: unpacked {r["archive"]} (sets {",".join(r["sets"])}): {r["written"]} files written, '
                  f'{r["already_there"]} already there, checked{gone}, in {r["seconds"]} s')
    except PackError as e:
        print(f'wheel_pack: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
