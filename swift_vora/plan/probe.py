"""What this machine has: GPUs, the container's memory limit, host RAM, CPUs, interpreter, package versions.

Used by `swift-vora doctor` and by `--hardware local`. Nothing here imports torch at module level; the GPU probe
imports it only when asked (doctor), and falls back to `nvidia-smi`, then to "no GPU".

The cgroup root is injectable (argument, or env SWIFT_VORA_CGROUP_ROOT) so tests can point it at a fake
/sys/fs/cgroup tree; /proc/meminfo likewise (argument, or env SWIFT_VORA_MEMINFO).
"""
from __future__ import annotations

import math
import os
import platform
import shutil
import stat
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import constants as C

DEFAULT_CGROUP_ROOT = '/sys/fs/cgroup'
# A limit at or above this means "no limit": cgroup v1 reports PAGE_COUNTER_MAX * PAGE_SIZE
# (9223372036854771712) for an unlimited group; v2 writes the word "max".
UNLIMITED_THRESHOLD = 1 << 60
PACKAGES = ('torch', 'transformers', 'peft', 'ms-swift', 'deepspeed', 'megatron-core', 'mcore-bridge',
            'transformer-engine', 'unsloth', 'unsloth_zoo', 'bitsandbytes', 'decord', 'av', 'qwen-vl-utils',
            'accelerate', 'flash-attn')


def cgroup_root(root: Optional[str] = None) -> str:
    from .. import switches
    return root or switches.read('SWIFT_VORA_CGROUP_ROOT') or DEFAULT_CGROUP_ROOT


# The files probed are a few kilobytes (/proc/meminfo ~1.5 kB); a path switch may name anything, /dev/zero
# included, so at most this much is read.
MAX_PROBE_BYTES = 1024 * 1024


def _read(path: str) -> Optional[str]:
    """The text of a small kernel file, or None when it cannot be read; never more than MAX_PROBE_BYTES (a device
    such as /dev/zero given as SWIFT_VORA_MEMINFO or cgroup file is read that far, found not to be one, and
    ignored); only regular files (what /proc and /sys files are) are opened."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a device or a FIFO (whose open() would wait for a writer)
            return None
        with open(path, 'rb') as f:
            data = f.read(MAX_PROBE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_PROBE_BYTES:
        return None
    try:
        return data.decode('utf-8').strip()
    except UnicodeDecodeError:
        return None


def _count(text: Optional[str]) -> Optional[int]:
    """A byte or event count a kernel file holds, or None (absent, not ASCII digits, more than 20 digits)."""
    return int(text) if text and text.isascii() and text.isdigit() and len(text) <= 20 else None


def _parse_limit(text: Optional[str]) -> Tuple[bool, Optional[int]]:
    """(readable, bytes or None for unlimited)."""
    if text is None:
        return False, None
    if text == 'max':
        return True, None
    try:
        v = int(text)
    except ValueError:
        return False, None
    if v < 0:
        return False, None
    if v >= UNLIMITED_THRESHOLD:
        return True, None
    return True, v


def _parse_kv(text: Optional[str]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for line in (text or '').splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def _own_cgroup_paths(proc_self_cgroup: str = '/proc/self/cgroup') -> Dict[str, str]:
    """{'v2': '/path', 'memory': '/path', 'cpu': '/path'} from /proc/self/cgroup."""
    out: Dict[str, str] = {}
    for line in (_read(proc_self_cgroup) or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == '':
            out['v2'] = path
        for c in controllers.split(','):
            if c in ('memory', 'cpu'):
                out[c] = path
    return out


def _candidate_dirs(base: str, own: Optional[str]) -> List[str]:
    """The process's own cgroup directory under `base` and its ancestors up to `base` (deepest first)."""
    dirs = []
    if own and own not in ('/', ''):
        parts = [p for p in own.split('/') if p]
        for i in range(len(parts), 0, -1):
            d = os.path.join(base, *parts[:i])
            if os.path.isdir(d):
                dirs.append(d)
    dirs.append(base)
    return dirs


# The same readings under each cgroup version's file names ('events': memory.events / memory.oom_control, both
# key-value lines with oom_kill)
CGROUP_V2_FILES = {'limit': 'memory.max', 'usage': 'memory.current', 'peak': 'memory.peak', 'events': 'memory.events'}
CGROUP_V1_FILES = {'limit': 'memory.limit_in_bytes', 'usage': 'memory.usage_in_bytes',
                   'peak': 'memory.max_usage_in_bytes', 'events': 'memory.oom_control'}


def probe_memory(root: Optional[str] = None, proc_self_cgroup: str = '/proc/self/cgroup') -> Dict[str, Any]:
    """The container memory limit and usage from cgroup v2 or v1, or 'none found'.

    Walks from the process's own cgroup up to the root and takes the tightest limit found."""
    base = cgroup_root(root)
    own = _own_cgroup_paths(proc_self_cgroup)
    res: Dict[str, Any] = {'cgroup_root': base, 'cgroup_version': None, 'limit_bytes': None, 'limit_gib': None,
                           'limit_file': None, 'usage_bytes': None, 'usage_gib': None, 'peak_bytes': None,
                           'oom_kill': None, 'oom': None, 'status': 'none found'}
    for version, root, own_path, files in (('v2', base, own.get('v2'), CGROUP_V2_FILES),
                                           ('v1', os.path.join(base, 'memory'), own.get('memory'), CGROUP_V1_FILES)):
        dirs = [d for d in _candidate_dirs(root, own_path) if os.path.exists(os.path.join(d, files['limit']))]
        if dirs:  # v2 first: a host with both mounted is read as v2, as before
            break
    else:
        return res
    res['cgroup_version'] = version
    best = None  # the tightest limit of the candidate folders: (bytes, file)
    unreadable = []  # limit files that hold something else than a number or "max": never taken for "no limit"
    for d in dirs:
        path = os.path.join(d, files['limit'])
        text = _read(path)
        ok, lim = _parse_limit(text)
        if not ok:
            unreadable.append({'file': path, 'text': None if text is None else text[:40]})
        elif lim is not None and (best is None or lim < best[0]):
            best = (lim, path)
    res['unreadable'] = unreadable
    d0 = dirs[0]
    res['usage_bytes'] = _count(_read(os.path.join(d0, files['usage'])))
    res['peak_bytes'] = _count(_read(os.path.join(d0, files['peak'])))
    events = _parse_kv(_read(os.path.join(d0, files['events'])))
    res['oom_kill'] = events.get('oom_kill')
    if version == 'v2':
        res['oom'] = events.get('oom')
    else:
        res['failcnt'] = _count(_read(os.path.join(d0, 'memory.failcnt')))
    if best is not None:
        res['limit_bytes'], res['limit_file'] = best
        res['limit_gib'] = round(best[0] / C.GiB, 2)
        res['status'] = 'limited'
    else:  # "max" everywhere is no limit; a file that could not be read says nothing either way
        res['status'] = 'unreadable' if unreadable else 'unlimited'
    if res['usage_bytes'] is not None:
        res['usage_gib'] = round(res['usage_bytes'] / C.GiB, 2)
    return res


def probe_meminfo(path: Optional[str] = None) -> Dict[str, Any]:
    """Host RAM as the kernel reports it (not the container's limit)."""
    from .. import switches
    path = path or switches.read('SWIFT_VORA_MEMINFO') or '/proc/meminfo'
    vals: Dict[str, int] = {}
    for line in (_read(path) or '').splitlines():
        parts = line.replace(':', ' ').split()
        # isascii: '²'.isdigit() is true; 20 digits: an int() of a 5000-digit field would raise
        if len(parts) >= 2 and parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= 20:
            vals[parts[0]] = int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == 'kB' else 1)
    total, avail = vals.get('MemTotal'), vals.get('MemAvailable')
    return {'source': path, 'mem_total_bytes': total, 'mem_available_bytes': avail,
            'mem_total_gib': round(total / C.GiB, 2) if total else None,
            'mem_available_gib': round(avail / C.GiB, 2) if avail else None}


def probe_cpus(root: Optional[str] = None) -> Dict[str, Any]:
    """CPU count respecting the affinity mask and the cgroup CPU quota (cpu.max / cfs_quota_us)."""
    base = cgroup_root(root)
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = None
    q = _read(os.path.join(base, 'cpu.max'))
    if q:
        parts = q.split()
        if len(parts) == 2 and parts[0] != 'max':
            try:
                quota = int(parts[0]) / int(parts[1])
            except (ValueError, ZeroDivisionError, OverflowError):  # OverflowError: 400-digit numbers
                quota = None
    else:
        for d in ('cpu', 'cpu,cpuacct'):
            qs = _read(os.path.join(base, d, 'cpu.cfs_quota_us'))
            ps = _read(os.path.join(base, d, 'cpu.cfs_period_us'))
            if qs and ps:
                try:
                    qv, pv = int(qs), int(ps)
                    if qv > 0 and pv > 0:
                        quota = qv / pv
                except (ValueError, OverflowError):
                    pass
                break
    count = affinity
    if quota is not None:
        count = max(1, min(affinity, math.ceil(quota)))
    return {'count': count, 'affinity': affinity, 'cgroup_quota': round(quota, 2) if quota else None,
            'os_cpu_count': os.cpu_count()}


def probe_gpus(use_torch: bool = True, use_nvidia_smi: bool = True,
               progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """GPUs via torch.cuda (if importable and available), else nvidia-smi (if on PATH), else none. `progress`
    hears what is being probed (importing torch and initialising CUDA can take many seconds)."""
    from .. import switches
    progress = progress or (lambda message: None)
    if use_torch and switches.read('SWIFT_VORA_PROBE_TORCH'):
        try:
            progress('importing torch to probe the GPUs through torch.cuda (--no-torch skips it) ...')
            import torch  # noqa: WPS433 (imported only when probing)
            progress(f'torch {torch.__version__} imported; asking torch.cuda for devices ...')
            if torch.cuda.is_available():
                gpus = []
                for i in range(torch.cuda.device_count()):
                    p = torch.cuda.get_device_properties(i)
                    try:
                        free, total = torch.cuda.mem_get_info(i)
                    except Exception:  # noqa: BLE001
                        free, total = None, p.total_memory
                    gpus.append({'index': i, 'name': p.name, 'total_bytes': int(total),
                                 'total_gib': round(total / C.GiB, 2),
                                 'free_gib': round(free / C.GiB, 2) if free is not None else None,
                                 'compute_capability': f'{p.major}.{p.minor}'})
                return {'source': 'torch', 'gpus': gpus}
            progress('torch.cuda sees no GPU')
        except Exception as error:  # noqa: BLE001 - a broken torch install must not break doctor
            progress(f'torch could not probe the GPUs ({error.__class__.__name__}: {error})')
    smi = shutil.which('nvidia-smi') if use_nvidia_smi else None
    if smi:
        progress('asking nvidia-smi ...')
        # compute_cap needs a driver from 2022 on; an older one refuses the whole query: ask again without it
        for fields in ('index,name,memory.total,memory.free,compute_cap', 'index,name,memory.total,memory.free'):
            try:
                out = subprocess.run([smi, f'--query-gpu={fields}', '--format=csv,noheader,nounits'],
                                     capture_output=True, text=True, timeout=20)
                gpus = []
                for line in out.stdout.splitlines():
                    parts = [p.strip() for p in line.split(',')]
                    if len(parts) == fields.count(',') + 1:
                        total = int(float(parts[2])) * 1024 ** 2
                        free = int(float(parts[3])) * 1024 ** 2
                        gpus.append({'index': int(parts[0]), 'name': parts[1], 'total_bytes': total,
                                     'total_gib': round(total / C.GiB, 2), 'free_gib': round(free / C.GiB, 2),
                                     'compute_capability': parts[4] if len(parts) > 4 else None})
                if gpus:
                    return {'source': 'nvidia-smi', 'gpus': gpus}
            except (OSError, subprocess.SubprocessError, ValueError):
                continue
    return {'source': 'none', 'gpus': []}


def package_versions(names=PACKAGES) -> Dict[str, Optional[str]]:
    """Installed versions from package metadata (nothing is imported)."""
    from importlib import metadata
    out: Dict[str, Optional[str]] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def host_limit(mem: Dict[str, Any], meminfo: Dict[str, Any]) -> Tuple[Optional[float], str]:
    """(GiB a training job may use on this host, where that number comes from)."""
    total = meminfo.get('mem_total_bytes')
    lim = mem.get('limit_bytes')
    if lim is not None and (total is None or lim < total):
        return lim / C.GiB, f'cgroup {mem["cgroup_version"]} {os.path.basename(mem["limit_file"] or "")}'
    if total is not None:
        if mem.get('status') == 'unreadable':
            return total / C.GiB, '/proc/meminfo MemTotal (the container limit file is unreadable: a limit there, ' \
                                  'if any, is not known)'
        return total / C.GiB, '/proc/meminfo MemTotal (no tighter container limit found)'
    return None, 'unknown'


def doctor_report(root: Optional[str] = None, meminfo_path: Optional[str] = None, use_torch: bool = True,
                  proc_self_cgroup: str = '/proc/self/cgroup',
                  progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    mem = probe_memory(root, proc_self_cgroup)
    meminfo = probe_meminfo(meminfo_path)
    cpus = probe_cpus(root)
    gpus = probe_gpus(use_torch=use_torch, progress=progress)
    warnings: List[str] = []
    lim_gib, lim_src = host_limit(mem, meminfo)
    total = meminfo.get('mem_total_bytes')
    if mem.get('limit_bytes') is not None and total and mem['limit_bytes'] < C.CONTAINER_LIMIT_WARN_FRACTION * total:
        warnings.append(
            f'container memory limit {mem["limit_bytes"] / C.GiB:.1f} GiB is far below the host RAM that '
            f'/proc/meminfo and free -h show ({total / C.GiB:.1f} GiB): plan with the limit — exceeding it ends in '
            f'SIGKILL (exit 137) from the OOM killer, with no Python error.')
    if mem.get('oom_kill'):
        warnings.append(f'{mem["oom_kill"]} past OOM kill(s) recorded in this cgroup ({mem["cgroup_version"]} '
                        f'memory.events / memory.oom_control).')
    if total is None:  # e.g. SWIFT_VORA_MEMINFO names a device, a FIFO or a file of another shape
        warnings.append(f'{meminfo["source"]}: no MemTotal read (not a regular meminfo file of at most '
                        f'{MAX_PROBE_BYTES} bytes); host RAM unknown')
    if mem['status'] == 'none found':
        warnings.append('no cgroup memory limit file found (memory.max / memory.limit_in_bytes): using '
                        '/proc/meminfo as the host RAM limit.')
    for bad in mem.get('unreadable') or []:
        held = 'could not be read' if bad['text'] is None else f'holds {bad["text"]!r}, not a byte count or "max"'
        warnings.append(f'{bad["file"]}: unreadable ({held}): the container '
                        'memory limit there is unknown' + (', not "no limit"' if mem['status'] == 'unreadable' else
                                                           f'; planning with the tighter one read, {mem["limit_file"]}')
                        + '.')
    if not gpus['gpus']:
        warnings.append('no GPU found (torch.cuda unavailable and no nvidia-smi).')
    return {
        'gpus': gpus['gpus'],
        'gpu_probe': gpus['source'],
        'memory': mem,
        'host': meminfo,
        'host_limit_gib': round(lim_gib, 2) if lim_gib is not None else None,
        'host_limit_source': lim_src,
        'cpus': cpus,
        'python': {'executable': sys.executable, 'version': platform.python_version(),
                   'implementation': platform.python_implementation()},
        'packages': package_versions(),
        'warnings': warnings,
    }
