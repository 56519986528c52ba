"""Repack a wheel without some of its files, keeping its name and a consistent RECORD.

    python scripts/gpu/slim_wheel.py IN.whl OUT_DIR --drop 'studio/frontend/**' [--keep PATTERN ...]

A file is dropped when it matches a --drop pattern and no --keep pattern (fnmatch-style; `**/` also
matches no folder at all). Its RECORD line goes too, so `pip install` checks the rest as usual. Nothing
else in the wheel changes; the output has the input's file name (pip reads name and tags from it).
Prints what was dropped (count, bytes) and the sizes before and after.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import zipfile


def _match(path: str, patterns) -> bool:
    for pat in patterns:
        if fnmatch.fnmatchcase(path, pat):
            return True
        if pat.startswith('**/') and fnmatch.fnmatchcase(path, pat[3:]):
            return True
    return False


def slim(src: str, out_dir: str, drop, keep) -> str:
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, os.path.basename(src))
    if os.path.abspath(dst) == os.path.abspath(src):
        raise SystemExit('slim_wheel: OUT_DIR must differ from the input wheel\'s folder')
    dropped, dropped_bytes = [], 0
    tmp = dst + '.tmp'
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, 'w', zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        infos = zin.infolist()
        removed = set()
        for info in infos:
            name = info.filename
            if not name.endswith('/') and _match(name, drop) and not _match(name, keep):
                removed.add(name)
                dropped_bytes += info.compress_size
        record = next((i.filename for i in infos if i.filename.endswith('.dist-info/RECORD')), None)
        if record is None:
            raise SystemExit(f'slim_wheel: {src} has no RECORD')
        for info in infos:
            if info.filename in removed:
                continue
            data = zin.read(info.filename)
            if info.filename == record:
                lines = data.decode('utf-8').splitlines(keepends=True)
                kept = [ln for ln in lines if ln.split(',', 1)[0] not in removed]
                data = ''.join(kept).encode('utf-8')
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        dropped = sorted(removed)
    os.replace(tmp, dst)
    mib = 1024 * 1024
    print(f'{os.path.basename(src)}: dropped {len(dropped)} files ({dropped_bytes / mib:.1f} MiB compressed); '
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
