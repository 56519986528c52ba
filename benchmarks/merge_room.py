"""Room for the merged 16-bit copy the MoE benchmark's flagship writes and scripts/merge_for_vllm.sh checks.

The flagship's runner writes `checkpoint-N-merged` (Unsloth's merged_16bit export) beside its adapter, and
merge_for_vllm.sh hard-links that export's weight files into its own folder: one merged copy, on the filesystem the
flagship writes to. At full depth on the lent H200 that copy had no room anywhere (issue #30): the 35B-A3B's 65.4 GiB
of base weights fill a RAM-backed tmpfs (the 64 GiB disk is smaller than the checkpoint) and the disk has 63.6 GiB
free, less than one copy. The disk and the RAM together hold both, though: `make_room` moves base shards from the
checkpoint's filesystem to a folder on another one (the disk) and leaves a symbolic link in each one's place --
safetensors, transformers, Unsloth, ms-swift and vLLM open a shard through its link as they open a file -- until the
checkpoint's filesystem has room for the merged copy; the flagship then writes its export there.

`room` is the one check of "a merged copy fits here": free space on the folder's filesystem for 1.08 x the base
weights and, where that filesystem is RAM-backed (tmpfs, ramfs), the host's available RAM for it as well, above
`HOST_RESERVE_GIB` for the runner's own host memory (its plan says 7.7 GiB at full depth; twice that is kept).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Tuple

GiB = 2 ** 30
# free space asked for the merged export: Unsloth's merged_16bit save refuses unless 95 % of the folder's free space
# holds the weights (unsloth_zoo saving_utils: `free*0.95 < save_size`), i.e. 1.053x; index, config and processor
# files on top
MERGED_OVER_BASE = 1.08
HOST_RESERVE_GIB = 16.0  # host RAM left to the runner that writes the export, on a RAM-backed filesystem
SPILL_KEEP_FREE_GIB = 4.0  # left free on the spill folder's filesystem: logs, profiles, the kernel cache
RAM_FILESYSTEMS = ('tmpfs', 'ramfs')


def shards(model_dir: str) -> List[str]:
    """The checkpoint's safetensors files, by name."""
    return sorted(f for f in os.listdir(model_dir) if f.endswith('.safetensors'))


def weights_bytes(model_dir: str) -> int:
    """Bytes of the base weights (a moved shard counts through its link)."""
    return sum(os.path.getsize(os.path.join(model_dir, f)) for f in shards(model_dir))


def filesystem_type(path: str, mounts: str = '/proc/mounts') -> Optional[str]:
    """The type of the filesystem holding `path` (the longest mount point above it), or None when unreadable."""
    target = os.path.realpath(path)
    best: Tuple[int, Optional[str]] = (-1, None)
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace('\\040', ' ')
        inside = target == point or target.startswith(point.rstrip('/') + '/')
        if inside and len(point) > best[0]:
            best = (len(point), parts[2])
    return best[1]


def available_ram_bytes(meminfo: str = '/proc/meminfo') -> Optional[int]:
    """MemAvailable: what the host can give without swapping (a tmpfs's own pages are not in it)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def room(model_dir: str, where: str, free: Optional[Callable[[str], int]] = None, mounts: str = '/proc/mounts',
         meminfo: str = '/proc/meminfo') -> Dict[str, Any]:
    """Whether one merged 16-bit copy of `model_dir` fits in `where` (a folder that exists or will: its nearest
    existing parent is asked)."""
    free = free or (lambda path: shutil.disk_usage(path).free)
    probe = _existing(where)
    need = weights_bytes(model_dir) * MERGED_OVER_BASE
    free_bytes = free(probe)
    report: Dict[str, Any] = {'needs_gib': round(need / GiB, 1), 'free_gib': round(free_bytes / GiB, 1),
                              'fits': free_bytes >= need, 'where': where,
                              'filesystem': filesystem_type(probe, mounts)}
    if report['filesystem'] in RAM_FILESYSTEMS:
        ram = available_ram_bytes(meminfo)
        report['ram_available_gib'] = round(ram / GiB, 1) if ram is not None else None
        report['ram_reserve_gib'] = HOST_RESERVE_GIB
        if ram is None or ram - HOST_RESERVE_GIB * GiB < need:
            report['fits'] = False
            report['why_not'] = (f'{where} is RAM-backed ({report["filesystem"]}): the merged copy needs '
                                 f'{report["needs_gib"]} GiB of RAM above {HOST_RESERVE_GIB:g} GiB for the runner, '
                                 f'the host has {report["ram_available_gib"]} GiB available')
    if free_bytes < need:
        report['why_not'] = f'{where} has {report["free_gib"]} GiB free, the merged copy needs {report["needs_gib"]}'
    return report


def make_room(model_dir: str, where: str, spill_dir: str, free: Optional[Callable[[str], int]] = None,
              device: Optional[Callable[[str], int]] = None, mounts: str = '/proc/mounts',
              meminfo: str = '/proc/meminfo', keep_free_gib: float = SPILL_KEEP_FREE_GIB) -> Dict[str, Any]:
    """Move base shards of `model_dir` into `spill_dir` (a symbolic link left in each one's place), the last shard
    first, until `where` has room for a merged copy (`room`); nothing is moved unless the moves reach that, and
    `spill_dir`'s filesystem keeps `keep_free_gib` free. Returns {'moved': [...], 'moved_gib', 'spill_dir',
    'room': room(...) after the moves, 'why_not' when no move could make room}."""
    free = free or (lambda path: shutil.disk_usage(path).free)
    device = device or (lambda path: os.stat(path).st_dev)
    os.makedirs(spill_dir, exist_ok=True)
    removed = _remove_stale(model_dir, spill_dir)
    report: Dict[str, Any] = {'spill_dir': spill_dir, 'moved': [], 'moved_gib': 0.0, 'stale_removed': removed}
    before = room(model_dir, where, free, mounts, meminfo)
    if before['fits']:
        report['room'] = before
        return report
    if device(_existing(where)) != device(model_dir):
        report['why_not'] = f'{where} is not on the checkpoint\'s filesystem: moving shards frees nothing there'
    elif device(spill_dir) == device(model_dir):
        report['why_not'] = f'{spill_dir} is on the checkpoint\'s filesystem: moving shards there frees nothing'
    else:
        need = weights_bytes(model_dir) * MERGED_OVER_BASE
        to_free = need - free(_existing(where))
        if before['filesystem'] in RAM_FILESYSTEMS:  # a shard moved off it frees its RAM too
            ram = available_ram_bytes(meminfo)
            to_free = max(to_free, need + HOST_RESERVE_GIB * GiB - (ram or 0))
        spill_room = free(spill_dir) - keep_free_gib * GiB
        chosen = _choose(model_dir, to_free, spill_room)
        if chosen is None:
            report['why_not'] = (f'{spill_dir} has {free(spill_dir) / GiB:.1f} GiB free ({keep_free_gib:g} kept): '
                                 f'the shards that fit there free less than the {to_free / GiB:.1f} GiB {where} '
                                 'needs for a merged copy')
        for name in chosen or []:
            report['moved_gib'] += _move(os.path.join(model_dir, name), os.path.join(spill_dir, name)) / GiB
            report['moved'].append(name)
    report['moved_gib'] = round(report['moved_gib'], 2)
    report['room'] = room(model_dir, where, free, mounts, meminfo)
    return report


def _choose(model_dir: str, to_free: float, spill_room: float) -> Optional[List[str]]:
    """The shards to move, the last first (real files only), that free `to_free` bytes within `spill_room` bytes;
    None when even every movable shard that fits does not."""
    chosen, freed = [], 0
    for name in reversed(shards(model_dir)):
        if freed >= to_free:
            break
        path = os.path.join(model_dir, name)
        if os.path.islink(path):
            continue
        size = os.path.getsize(path)
        if freed + size > spill_room:
            return None
        chosen.append(name)
        freed += size
    return chosen if freed >= to_free else None


def _move(source: str, target: str) -> int:
    """Copy `source` to `target` on the other filesystem, then put a link to it in `source`'s place in one rename:
    the checkpoint never misses a shard, and a failed copy leaves the original where it was."""
    partial = target + '.partial'
    shutil.copyfile(source, partial)
    os.replace(partial, target)
    size = os.path.getsize(target)
    link = os.path.join(os.path.dirname(source), '.' + os.path.basename(source) + '.link')
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(target), link)
    os.replace(link, source)
    return size


def _remove_stale(model_dir: str, spill_dir: str) -> List[str]:
    """Shards in `spill_dir` that no link of `model_dir` points at (a checkpoint rebuilt since): removed."""
    linked = {os.path.realpath(os.path.join(model_dir, f)) for f in shards(model_dir)
              if os.path.islink(os.path.join(model_dir, f))}
    stale = []
    for name in sorted(os.listdir(spill_dir)):
        path = os.path.join(spill_dir, name)
        if (name.endswith('.safetensors') or name.endswith('.partial')) and os.path.realpath(path) not in linked:
            os.remove(path)
            stale.append(name)
    return stale


def _existing(path: str) -> str:
    """`path`, or its nearest parent that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
