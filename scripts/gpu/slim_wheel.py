"""Repack a wheel without some of its files, keeping its name and a consistent RECORD.

    python scripts/gpu/slim_wheel.py IN.whl OUT_DIR --drop 'studio/frontend/**' [--keep PATTERN ...]

A file is dropped when it matches a --drop pattern and no --keep pattern (fnmatch-style; `**/` also
matches no folder at all). Its RECORD line goes too, so `pip install` checks the rest as usual. Nothing
else in the wheel changes; the output has the input's file name (pip reads name and tags from it).
Prints what was dropped (count, bytes) and the sizes before and after.
"""
from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import os
import sys
import zipfile
from typing import Dict, Optional


def _match(path: str, patterns) -> bool:
    for pat in patterns:
        if fnmatch.fnmatchcase(path, pat):
            return True
        if pat.startswith('**/') and fnmatch.fnmatchcase(path, pat[3:]):
            return True
    return False


def record_line(name: str, data: bytes) -> str:
    """A RECORD line for a file's new content (sha256, urlsafe base64 without padding, and size, as pip checks)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
    return f'{name},sha256={digest},{len(data)}'


def _record(text: str, remove, replace: Dict[str, bytes]) -> str:
    """RECORD without the lines of removed files, with new lines for replaced ones."""
    out = []
    for line in text.splitlines(keepends=True):
        name = line.split(',', 1)[0]
        if name in replace:
            out.append(record_line(name, replace[name]) + '\n')
        elif name not in remove:
            out.append(line)
    return ''.join(out)


def repack(src: str, out_dir: str, who: str, remove=frozenset(), replace: Optional[Dict[str, bytes]] = None) -> str:
    """OUT_DIR/<the input's file name>: the wheel without the files in `remove` and with the content of the files in
    `replace`, its RECORD kept consistent (their lines dropped / rehashed). Written to a temporary file and renamed
    at the end; `who` names the script in its errors."""
    replace = replace or {}
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, os.path.basename(src))
    if os.path.abspath(dst) == os.path.abspath(src):
        raise SystemExit(f'{who}: OUT_DIR must differ from the input wheel\'s folder')
    tmp = dst + '.tmp'
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, 'w', zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        infos = zin.infolist()
        record = next((i.filename for i in infos if i.filename.endswith('.dist-info/RECORD')), None)
        if record is None:
            raise SystemExit(f'{who}: {src} has no RECORD')
        for info in infos:
            if info.filename in remove:
                continue
            if info.filename == record:
                data = _record(zin.read(info.filename).decode('utf-8'), remove, replace).encode('utf-8')
            else:
                data = replace[info.filename] if info.filename in replace else zin.read(info.filename)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, dst)
    return dst


def slim(src: str, out_dir: str, drop, keep) -> str:
    with zipfile.ZipFile(src) as zin:
        removed = {i.filename: i.compress_size for i in zin.infolist()
                   if not i.filename.endswith('/') and _match(i.filename, drop) and not _match(i.filename, keep)}
    dst = repack(src, out_dir, 'slim_wheel', remove=set(removed))
    mib = 1024 * 1024
    print(f'{os.path.basename(src)}: dropped {len(removed)} files ({sum(removed.values()) / mib:.1f} MiB compressed); '
          f'{os.path.getsize(src) / mib:.1f} MiB -> {os.path.getsize(dst) / mib:.1f} MiB')
    return dst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('wheel')
    parser.add_argument('out_dir')
    parser.add_argument('--drop', action='append', default=[], help='pattern of files to remove (repeatable)')
    parser.add_argument('--keep', action='append', default=[], help='pattern that overrides --drop (repeatable)')
    args = parser.parse_args(argv)
    if not args.drop:
        parser.error('name at least one --drop pattern')
    slim(args.wheel, args.out_dir, args.drop, args.keep)
    return 0


if __name__ == '__main__':
    sys.exit(main())
