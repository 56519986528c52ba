"""A Transformer Engine core wheel for ONE GPU architecture: the device code of the others zeroed, so that the wheel
compresses to a size one device call carries.

    python scripts/gpu/slim_te.py IN.whl OUT_DIR [--keep-sm 90] [--keep-ptx 90]

Why: transformer_engine_cu13 2.11.0's wheel is 171 MiB (the GPU machine takes at most 64 MiB of files per call), and
442 of its 445 MiB unpacked are one file, `transformer_engine/wheel_lib/libtransformer_engine.so`, whose `.nv_fatbin`
section (420 MiB) holds every kernel for sm_75, 80, 89, 90, 100, 103 and 120 (SASS) plus PTX for 75-90. A process
on an H200 (sm_90) only ever loads the sm_90 SASS (the driver picks the exact-architecture cubin of each fat binary;
PTX is the fallback for newer GPUs). The other entries' payloads are overwritten with zeros -- their headers, every
offset and the file size stay as they are (nothing the loader or the dynamic linker reads moves) -- and zeros
compress to almost nothing. The wheel keeps its name; its RECORD line for the library gets the new hash and size.
Nothing else changes. Prints the entry counts and the sizes (raw, wheel) before and after.

The fat binary layout read here (CUDA's fatbinary format, stable across CUDA 10-13): a container header (magic
0xBA55ED50, version u16, header size u16, payload size u64), then entries, each with a header (kind u16: 1 PTX, 2
ELF/SASS; version u16; header size u32; payload size u64; ...; the SM architecture as u32 at offset 28) followed by
its payload. A container or entry that does not parse stops the script (exit 1) before anything is written.
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import zipfile
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slim_wheel import repack  # noqa: E402  (one way to rewrite a wheel with a consistent RECORD)

FATBIN_MAGIC = 0xBA55ED50
KIND = {1: 'ptx', 2: 'elf'}
LIBRARY = 'transformer_engine/wheel_lib/libtransformer_engine.so'


def find_section(data, name: str) -> Optional[Tuple[int, int]]:
    """(file offset, size) of ELF64 little-endian section `name`, None if absent."""
    if data[:4] != b'\x7fELF' or data[4] != 2 or data[5] != 1:
        raise ValueError('not an ELF64 little-endian file')
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    str_off, = struct.unpack_from('<Q', data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        base = shoff + i * shentsize
        name_off, = struct.unpack_from('<I', data, base)
        end = data.index(b'\0', str_off + name_off)
        if data[str_off + name_off:end].decode() == name:
            offset, size = struct.unpack_from('<QQ', data, base + 0x18)
            return offset, size
    return None


def walk(data: bytearray, start: int, size: int):
    """Yield (entry offset, header size, payload size, kind, arch) over the fat binaries in data[start:start+size]."""
    pos, end = start, start + size
    while pos + 16 <= end:
        magic, _version, hsize, fsize = struct.unpack_from('<IHHQ', data, pos)
        if magic != FATBIN_MAGIC:
            if any(data[pos:pos + 8]):
                raise ValueError(f'offset {pos:#x}: neither a fat binary header nor alignment padding')
            pos += 8
            continue
        entry, stop = pos + hsize, pos + hsize + fsize
        if stop > end:
            raise ValueError(f'offset {pos:#x}: fat binary of {fsize} bytes runs past the section')
        while entry < stop:
            kind, _ever, ehsize, psize = struct.unpack_from('<HHIQ', data, entry)
            if kind not in KIND or ehsize < 32 or entry + ehsize + psize > stop:
                raise ValueError(f'offset {entry:#x}: not a fat binary entry (kind {kind}, header {ehsize})')
            arch, = struct.unpack_from('<I', data, entry + 28)
            yield entry, ehsize, psize, KIND[kind], arch
            entry += ehsize + psize
        pos = stop


def zero_other_archs(data: bytearray, start: int, size: int, keep: Dict[str, set]) -> Dict[str, Dict[str, int]]:
    """Zero the payload of every entry whose (kind, arch) is not kept; per 'kind_arch': entries and bytes."""
    stats: Dict[str, Dict[str, int]] = {}
    entries = list(walk(data, start, size))  # all parsed before anything is changed
    for entry, ehsize, psize, kind, arch in entries:
        kept = arch in keep.get(kind, set())
        key = f'{kind}_sm{arch}' + ('' if kept else ' (zeroed)')
        row = stats.setdefault(key, {'entries': 0, 'bytes': 0})
        row['entries'] += 1
        row['bytes'] += psize
        if not kept:
            data[entry + ehsize:entry + ehsize + psize] = bytes(psize)
    if not any(not k.endswith('(zeroed)') for k in stats if k.startswith('elf')):
        raise ValueError(f'no SASS entry for the kept architectures {keep}: the library would load no kernel')
    return stats


def slim(src: str, out_dir: str, keep_sm: List[int], keep_ptx: List[int]) -> str:
    keep = {'elf': set(keep_sm), 'ptx': set(keep_ptx)}
    with zipfile.ZipFile(src) as zin:
        lib = bytearray(zin.read(LIBRARY))
    section = find_section(lib, '.nv_fatbin')
    if section is None:
        raise SystemExit(f'slim_te: {LIBRARY} has no .nv_fatbin section')
    stats = zero_other_archs(lib, section[0], section[1], keep)
    dst = repack(src, out_dir, 'slim_te', replace={LIBRARY: bytes(lib)})
    mib = 2 ** 20
    for key, row in sorted(stats.items()):
        print(f'  {key:22s} {row["entries"]:4d} entries {row["bytes"] / mib:8.1f} MiB')
    print(f'{os.path.basename(src)}: .nv_fatbin {section[1] / mib:.1f} MiB; kept SASS sm_{keep_sm} + PTX {keep_ptx}; '
          f'wheel {os.path.getsize(src) / mib:.1f} MiB -> {os.path.getsize(dst) / mib:.1f} MiB')
    return dst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('wheel')
    parser.add_argument('out_dir')
    parser.add_argument('--keep-sm', type=int, action='append', default=None, help='SASS to keep (default 90)')
    parser.add_argument('--keep-ptx', type=int, action='append', default=None, help='PTX to keep (default 90)')
    args = parser.parse_args(argv)
    try:
        slim(args.wheel, args.out_dir, args.keep_sm or [90], args.keep_ptx or [90])
    except ValueError as e:
        print(f'slim_te: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
