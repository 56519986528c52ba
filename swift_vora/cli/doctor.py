"""`swift-vora doctor`: what this machine has -- GPUs, the container's memory limit, host RAM, CPUs, versions.

Exit 0. The probes are swift_vora/plan/probe.py's; torch is imported inside the GPU probe only.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List

from ..json_output import dumps

EXIT_OK = 0


def register_commands(subparsers) -> None:
    d = subparsers.add_parser('doctor', help='what this machine has: GPUs, container memory limit, RAM, CPUs, '
                              'package versions',
                              description='Probe GPUs (torch.cuda, else nvidia-smi), the container memory limit '
                              '(cgroup v2 memory.max / v1 memory.limit_in_bytes), host RAM (/proc/meminfo), CPUs, '
                              'the interpreter and package versions.')
    d.add_argument('--json', action='store_true', help='print JSON')
    d.add_argument('--cgroup-root', default=None,
                   help='cgroup filesystem root (default: $SWIFT_VORA_CGROUP_ROOT or /sys/fs/cgroup)')
    d.add_argument('--no-torch', action='store_true', help='do not import torch (GPUs from nvidia-smi only)')
    d.set_defaults(handler=cmd_doctor)


def cmd_doctor(args) -> int:
    from ..plan.probe import doctor_report
    def progress(message: str) -> None:  # stderr, so that --json output stays one object on stdout
        print(f'swift-vora doctor: {message}', file=sys.stderr, flush=True)

    rep = doctor_report(root=args.cgroup_root, use_torch=not args.no_torch, progress=progress)
    if args.json:
        print(dumps(rep, indent=2))
        return EXIT_OK
    print(render_doctor(rep))
    return EXIT_OK


def render_doctor(rep: Dict[str, Any]) -> str:
    out: List[str] = []
    gpus = rep['gpus']
    out.append(f'GPUs ({rep["gpu_probe"]}): {len(gpus) if gpus else "none"}')
    for g in gpus:
        free = f', {g["free_gib"]:.2f} GiB free' if g.get('free_gib') is not None else ''
        out.append(f'  [{g["index"]}] {g["name"]}: {g["total_gib"]:.2f} GiB total{free}')
    m = rep['memory']
    if m['status'] == 'none found':
        out.append(f'container memory limit: none found (no memory.max / memory/memory.limit_in_bytes under '
                   f'{m["cgroup_root"]})')
    elif m['status'] == 'unlimited':
        out.append(f'container memory limit: cgroup {m["cgroup_version"]}, no limit ("max")')
    elif m['status'] == 'unreadable':
        out.append(f'container memory limit: unreadable (cgroup {m["cgroup_version"]}, '
                   + ', '.join(f'{u["file"]} ' + ('could not be read' if u['text'] is None else f'holds {u["text"]!r}')
                               for u in m['unreadable']) + ')')
    else:
        out.append(f'container memory limit: {m["limit_gib"]:.2f} GiB (cgroup {m["cgroup_version"]}, '
                   f'{m["limit_file"]})')
    if m.get('usage_gib') is not None:
        out.append(f'  usage now: {m["usage_gib"]:.2f} GiB' +
                   (f', peak {m["peak_bytes"] / 1024 ** 3:.2f} GiB' if m.get('peak_bytes') else ''))
    if m['cgroup_version']:
        out.append(f'  past OOM kills: {m["oom_kill"] if m.get("oom_kill") is not None else "not readable"}')
    h = rep['host']
    if h.get('mem_total_gib') is not None:
        out.append(f'host RAM (/proc/meminfo): {h["mem_total_gib"]:.2f} GiB total, '
                   f'{h["mem_available_gib"] or 0:.2f} GiB available')
    else:
        out.append(f'host RAM: {h.get("source") or "/proc/meminfo"} not readable')
    if rep.get('host_limit_gib') is not None:
        out.append(f'plan with: {rep["host_limit_gib"]:.2f} GiB host RAM ({rep["host_limit_source"]})')
    c = rep['cpus']
    out.append(f'CPUs: {c["count"]} usable (affinity {c["affinity"]}, cgroup quota '
               f'{c["cgroup_quota"] if c["cgroup_quota"] else "none"}, os.cpu_count {c["os_cpu_count"]})')
    py = rep['python']
    out.append(f'python: {py["executable"]} ({py["implementation"]} {py["version"]})')
    pk = rep['packages']
    have = [f'{k} {v}' for k, v in pk.items() if v]
    missing = [k for k, v in pk.items() if not v]
    out.append('packages: ' + (', '.join(have) if have else 'none found'))
    if missing:
        out.append('not installed: ' + ', '.join(missing))
    if rep['warnings']:
        out.append('warnings:')
        out += [f'  - {w}' for w in rep['warnings']]
    return '\n'.join(out)
