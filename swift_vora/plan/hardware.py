"""Hardware the planner plans for: named profiles, a custom description, or this machine (`local`).

GiB vs GB: every capacity here is in GiB (2**30 bytes), the unit torch reports. Vendors sell GB (10**9):
an H200's "141 GB" of HBM3e shows up as ~139.8 GiB of `torch.cuda.get_device_properties().total_memory`
on the lent machine; a "12 GB" RTX 3060 as ~11.76 GiB.

Host RAM is what one node's training job may use: the container's cgroup limit if there is one, else the
machine's RAM. The profile values are documented assumptions — pass `--host-ram-gib` when you know better.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from . import constants as C


@dataclass
class Hardware:
    name: str
    num_gpus: int  # per node
    gpu_mem_gib: float  # per GPU, as torch reports it
    host_ram_gib: Optional[float]  # per node: container limit, else RAM; None = unknown
    nodes: int = 1
    gpu_name: str = ''
    source: str = 'profile'  # 'profile' | 'custom' | 'probed'
    bf16: Optional[bool] = None  # probed: every GPU computes in bf16 (compute capability >= 8.0); None: unknown
    # FP8 tensor cores on every GPU (compute capability >= 8.9): from the GPU's class for a profile, probed for
    # local; None: unknown (custom hardware)
    fp8: Optional[bool] = None
    host_ram_source: str = ''
    notes: List[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.num_gpus * self.nodes

    def with_gpus(self, num_gpus: int, nodes: Optional[int] = None) -> 'Hardware':
        """The same GPU type and host, with another GPU count (used to propose 'more GPUs')."""
        return Hardware(name=f'{num_gpus} x {self.gpu_name or "GPU"} ({self.gpu_mem_gib:g} GiB)', num_gpus=num_gpus,
                        gpu_mem_gib=self.gpu_mem_gib, host_ram_gib=self.host_ram_gib,
                        nodes=self.nodes if nodes is None else nodes, gpu_name=self.gpu_name, source=self.source,
                        host_ram_source=self.host_ram_source, fp8=self.fp8)

    def describe(self) -> str:
        nodes = f' x {self.nodes} nodes' if self.nodes > 1 else ''
        host = f'{self.host_ram_gib:.1f} GiB host RAM' if self.host_ram_gib is not None else 'host RAM unknown'
        if not self.num_gpus:
            return f'no GPU{nodes}, {host}'
        gname = f' {self.gpu_name}' if self.gpu_name else ''
        return f'{self.num_gpus} x{gname} {self.gpu_mem_gib:.2f} GiB{nodes}, {host}'

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d['world'] = self.world
        return d


# Memory of one GPU as torch reports it (torch.cuda.get_device_properties(i).total_memory = CUDA's
# totalGlobalMem, the "Total amount of global memory" line of deviceQuery), in GiB, rounded down. This is less than
# the vendor's GB figure and less than nvidia-smi's memory.total (which also counts memory the driver reserves):
# an A100-SXM4-40GB shows 40960 MiB in nvidia-smi but 40339 MiB (42,298,834,944 B) in deviceQuery.
# Sources: the lent H200 machine (torch, 139.8 GiB); deviceQuery outputs posted in public issues for the A100 40GB
# (bottlerocket-os/bottlerocket#3873: 42,298,834,944 B), A100 80GB (ekondis/mixbench#47: 81049 MiB) and RTX 5090
# (aikitoria/open-gpu-kernel-modules#1: 33,677,180,928 B); torch's printed total_memory for the RTX 3060 12 GB
# (12,636,061,696 B), RTX 3090 (25,438,126,080 B) and RTX 4090 (25,393,692,672 B = 24217 MiB); H100 80GB HBM3
# and L40S: torch/vLLM-reported totals of 79.11 GiB and 44.39 GiB (nvidia-smi shows 81559 MiB and 46068 MiB).
# A different board, driver or ECC setting moves these by a few hundred MiB: `--hardware local` probes yours.
GPU_GIB = {
    'RTX 3060': 11.76, 'RTX 3090': 23.69, 'RTX 4090': 23.65, 'RTX 5090': 31.36, 'L40S': 44.39,
    'A100 40GB': 39.39, 'A100 80GB': 79.15, 'H100 80GB': 79.11, 'H200': 139.8,
}
# Compute capability of each GPU class (NVIDIA's CUDA GPUs table): FP8 tensor cores from 8.9 (Ada, Hopper, Blackwell)
GPU_CAPABILITY = {
    'RTX 3060': (8, 6), 'RTX 3090': (8, 6), 'RTX 4090': (8, 9), 'RTX 5090': (12, 0), 'L40S': (8, 9),
    'A100 40GB': (8, 0), 'A100 80GB': (8, 0), 'H100 80GB': (9, 0), 'H200': (9, 0),
}
FP8_CAPABILITY = (8, 9)


def parse_capability(text) -> Optional[tuple]:
    """'8.9' -> (8, 9); None for what is not a capability (nvidia-smi's '[N/A]')."""
    major, _, minor = str(text or '').partition('.')
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def has_fp8(gpu_name: str) -> Optional[bool]:
    cap = GPU_CAPABILITY.get(gpu_name)
    return None if cap is None else cap >= FP8_CAPABILITY


H200_GIB = GPU_GIB['H200']  # torch total_memory of one H200 (141 GB HBM3e) on the lent machine
_DGX = 'DGX-class node (assumption)'
# name -> (gpus, GiB per GPU, host GiB, GPU name, host source note). Host RAM is an assumption unless said
# otherwise: pass --host-ram-gib (or host_ram_gib in a recipe) when you know your machine's, or plan on the
# machine itself with --hardware local.
PROFILES: Dict[str, tuple] = {
    # 4 x RTX 3060 12 GB (12,636,061,696 B = 11.77 GiB as torch reports); a 64 GiB workstation.
    '3060x4': (4, GPU_GIB['RTX 3060'], 64.0, 'RTX 3060', 'assumed 64 GiB workstation'),
    # 3 x RTX 3090 24 GB (25,438,126,080 B = 23.69 GiB); a 128 GiB workstation (assumption).
    '3090x3': (3, GPU_GIB['RTX 3090'], 128.0, 'RTX 3090', 'assumed 128 GiB workstation'),
    '3090x1': (1, GPU_GIB['RTX 3090'], 64.0, 'RTX 3090', 'assumed 64 GiB desktop'),
    '3090x2': (2, GPU_GIB['RTX 3090'], 128.0, 'RTX 3090', 'assumed 128 GiB workstation'),
    '4090x1': (1, GPU_GIB['RTX 4090'], 64.0, 'RTX 4090', 'assumed 64 GiB desktop'),
    '4090x2': (2, GPU_GIB['RTX 4090'], 128.0, 'RTX 4090', 'assumed 128 GiB workstation'),
    '4090x4': (4, GPU_GIB['RTX 4090'], 256.0, 'RTX 4090', 'assumed 256 GiB workstation'),
    '4090x8': (8, GPU_GIB['RTX 4090'], 512.0, 'RTX 4090', 'assumed 512 GiB server'),
    '5090x1': (1, GPU_GIB['RTX 5090'], 64.0, 'RTX 5090', 'assumed 64 GiB desktop'),
    'l40sx4': (4, GPU_GIB['L40S'], 512.0, 'L40S', 'assumed 512 GiB server (4-GPU L40S node)'),
    'l40sx8': (8, GPU_GIB['L40S'], 1024.0, 'L40S', 'assumed 1 TiB server'),
    # DGX A100 320 GB ships 1 TB of RAM, DGX A100 640 GB 2 TB, DGX H100 2 TB (vendor GB)
    'a100-40x1': (1, GPU_GIB['A100 40GB'], 85 * C.GB / C.GiB, 'A100 40GB', 'cloud 1-GPU A100 VM, 85 GB (assumption)'),
    'a100-40x8': (8, GPU_GIB['A100 40GB'], 1000 * C.GB / C.GiB, 'A100 40GB', f'{_DGX}: DGX A100 320GB, 1 TB'),
    'a100-80x1': (1, GPU_GIB['A100 80GB'], 117 * C.GB / C.GiB, 'A100 80GB', 'cloud 1-GPU A100 VM, 117 GB (assumption)'),
    'a100-80x8': (8, GPU_GIB['A100 80GB'], 2000 * C.GB / C.GiB, 'A100 80GB', f'{_DGX}: DGX A100 640GB, 2 TB'),
    'h100x1': (1, GPU_GIB['H100 80GB'], 200 * C.GB / C.GiB, 'H100 80GB', 'cloud 1-GPU H100 VM, 200 GB (assumption)'),
    'h100x8': (8, GPU_GIB['H100 80GB'], 2000 * C.GB / C.GiB, 'H100 80GB', f'{_DGX}: DGX H100, 2 TB'),
    # 1 x H200 in a container of 276 GB (= 257.0 GiB) of RAM (the first user's). The lent machine itself has 128 GiB
    # and no cgroup limit: use `--hardware local` there, or `--host-ram-gib 128`.
    'h200x1': (1, H200_GIB, 276 * C.GB / C.GiB, 'H200', 'assumed 276 GB container limit'),
    # 8 x H200 in one node (DGX/HGX H200 class: 2 TB of system RAM = 1862.6 GiB).
    'h200x8': (8, H200_GIB, 2000 * C.GB / C.GiB, 'H200', 'DGX H200 system memory 2 TB (assumption)'),
}


# Generic profiles `<gpu>x<N>` for the counts a node of that GPU class is sold with: the GPU's memory (GPU_GIB), and
# host RAM assumed per GPU (the named profiles' figures divided by their GPU count; capped at the 8-GPU node's).
GPU_CLASSES = {
    # class: (GPU_GIB key, GPUs per node it is sold with, host GiB assumed per GPU, host cap GiB)
    '3060': ('RTX 3060', range(1, 5), 16.0, 64.0),
    '3090': ('RTX 3090', range(1, 5), 64.0, 256.0),
    '4090': ('RTX 4090', range(1, 9), 64.0, 512.0),
    '5090': ('RTX 5090', range(1, 9), 64.0, 512.0),
    'l40s': ('L40S', range(1, 9), 128.0, 1024.0),
    'a100-40': ('A100 40GB', (1, 2, 4, 8, 16), 85 * C.GB / C.GiB, 1000 * C.GB / C.GiB),
    'a100-80': ('A100 80GB', (1, 2, 4, 8), 117 * C.GB / C.GiB, 2000 * C.GB / C.GiB),
    'h100': ('H100 80GB', (1, 2, 4, 8), 200 * C.GB / C.GiB, 2000 * C.GB / C.GiB),
    'h200': ('H200', (1, 2, 4, 8), 276 * C.GB / C.GiB, 2000 * C.GB / C.GiB),
}


def profile_names() -> List[str]:
    """Every profile name `--hardware` takes: the named ones and each `<gpu>x<N>`."""
    generic_names = [f'{c}x{n}' for c, (_, counts, _, _) in GPU_CLASSES.items() for n in counts]
    return list(PROFILES) + [n for n in generic_names if n not in PROFILES]


def suggest_profiles(name: str) -> List[str]:
    """The profiles a mistyped name most likely meant: `h200` -> h200x1; `a100x1` -> a100-80x1, a100-40x1."""
    name = name.strip().lower()
    known = profile_names()
    gpu_class, _, count = name.rpartition('x')
    if name in GPU_CLASSES:
        return [f'{name}x1']
    prefixed = [n for n in known if gpu_class and n.startswith(gpu_class) and n.endswith('x' + count)]
    if prefixed:
        return prefixed[:3]
    import difflib
    return difflib.get_close_matches(name, known, n=3, cutoff=0.5)


def profile(name: str) -> Hardware:
    name = name.strip().lower()  # H100x1, H200X8: the same profiles
    if name in PROFILES:
        n, mem, host, gname, note = PROFILES[name]
        return Hardware(name=name, num_gpus=n, gpu_mem_gib=mem, host_ram_gib=host, gpu_name=gname, source='profile',
                        host_ram_source=note, fp8=has_fp8(gname))
    gpu_class, _, count = name.rpartition('x')
    if gpu_class in GPU_CLASSES and count.isdigit():
        key, counts, per_gpu, cap = GPU_CLASSES[gpu_class]
        if int(count) not in counts:
            raise KeyError(f'hardware profile {name!r}: {key} nodes come with {", ".join(map(str, counts))} GPUs; '
                           f'for another count give --gpus N with --hardware {gpu_class}x1')
        return generic(gpu_class, int(count))
    close = suggest_profiles(name)
    hint = f' (did you mean {" or ".join(close)}?)' if close else ''
    raise KeyError(f'unknown hardware profile {name!r}{hint}; known: {", ".join(PROFILES)}, local, and <gpu>x<N> for '
                   f'gpu in {", ".join(GPU_CLASSES)}')


def generic(gpu_class: str, count: int) -> Hardware:
    key, _, per_gpu, cap = GPU_CLASSES[gpu_class]
    host = min(cap, per_gpu * count)
    return Hardware(name=f'{gpu_class}x{count}', num_gpus=count, gpu_mem_gib=GPU_GIB[key], host_ram_gib=host,
                    gpu_name=key, source='profile', fp8=has_fp8(key),
                    host_ram_source=f'assumed {host:.0f} GiB ({per_gpu:.0f} GiB per {key}; give --host-ram-gib)')


def with_gpu_count(hw: Hardware, gpus: int) -> Hardware:
    """`--hardware NAME --gpus N`: the profile's GPU with N of them per node; host RAM scaled like a generic profile
    of that GPU class when there is one, else kept."""
    if gpus < 1:
        raise ValueError('--gpus must be >= 1')
    gpu_class = next((c for c, v in GPU_CLASSES.items() if v[0] == hw.gpu_name), None)
    out = generic(gpu_class, gpus) if gpu_class else hw.with_gpus(gpus)
    out.name = f'{hw.name} with {gpus} GPU{"s" if gpus > 1 else ""}'
    out.nodes = hw.nodes
    return out


def custom(gpus: int, gpu_mem_gib: float, host_ram_gib: Optional[float], nodes: int = 1) -> Hardware:
    if gpus < 1 or gpu_mem_gib <= 0:
        raise ValueError('--gpus must be >= 1 and --gpu-mem-gib > 0')
    return Hardware(name=f'custom {gpus} x {gpu_mem_gib:g} GiB', num_gpus=gpus, gpu_mem_gib=gpu_mem_gib,
                    host_ram_gib=host_ram_gib, nodes=nodes, source='custom',
                    host_ram_source='--host-ram-gib' if host_ram_gib is not None else 'not given')


# GPU name (as torch / nvidia-smi print it) -> GPU_GIB key; the more specific patterns first.
_NAME_PATTERNS = (('H200', 'H200'), ('H100', 'H100 80GB'), ('A100-SXM4-80GB', 'A100 80GB'), ('A100 80GB', 'A100 80GB'),
                  ('A100', 'A100 40GB'), ('L40S', 'L40S'), ('5090', 'RTX 5090'), ('4090', 'RTX 4090'),
                  ('3090', 'RTX 3090'), ('3060', 'RTX 3060'))


def gpu_class_of(name: str) -> Optional[str]:
    """The GPU_GIB key of a GPU name as torch / nvidia-smi / a profile print it ('NVIDIA H100 80GB HBM3' -> 'H100
    80GB'); None for a card not listed."""
    for pattern, key in _NAME_PATTERNS:
        if pattern.lower() in name.lower():
            return key
    return None


def torch_gib_from_smi(name: str, smi_gib: float) -> Optional[float]:
    """torch's total for a card that nvidia-smi reported: nvidia-smi's memory.total also counts memory the driver
    reserves, so it overstates what torch can allocate. Returns the known torch total when `name` is a card in
    GPU_GIB and nvidia-smi's figure is within 5 % above it (so a 48 GB modded 4090 is not taken for a 24 GB one)."""
    for pattern, key in _NAME_PATTERNS:
        if pattern.lower() in name.lower():
            known = GPU_GIB[key]
            return known if known <= smi_gib <= known * 1.05 else None
    return None


def local(use_torch: bool = False, cgroup_root: Optional[str] = None) -> Hardware:
    """This machine, from doctor's probes (nvidia-smi first unless use_torch, so `plan` stays fast)."""
    from . import probe
    g = probe.probe_gpus(use_torch=use_torch)
    if not g['gpus'] and not use_torch:
        g = probe.probe_gpus(use_torch=True)
    mem = probe.probe_memory(cgroup_root)
    meminfo = probe.probe_meminfo()
    lim, src = probe.host_limit(mem, meminfo)
    gpus = g['gpus']
    notes = []
    if not gpus:
        notes.append('no GPU found on this machine')
    mem_gib = min(x['total_gib'] for x in gpus) if gpus else 0.0
    names = sorted({x['name'] for x in gpus})
    if gpus and g.get('source') == 'nvidia-smi':
        known = [torch_gib_from_smi(x['name'], x['total_gib']) for x in gpus]
        if all(k is not None for k in known):
            notes.append(f'nvidia-smi reports {mem_gib:.2f} GiB per GPU including driver-reserved memory; planned '
                         f'with the {min(known):.2f} GiB torch reports for {", ".join(names)}')
            mem_gib = min(known)
        else:
            notes.append(f'GPU memory from nvidia-smi ({mem_gib:.2f} GiB) includes driver-reserved memory: torch '
                         f'can allocate somewhat less (`swift-vora doctor` probes with torch)')
    caps = [x.get('compute_capability') for x in gpus]
    bf16 = all(float(c) >= 8.0 for c in caps) if gpus and all(caps) else None
    parsed = [parse_capability(c) for c in caps]
    fp8 = all(c >= FP8_CAPABILITY for c in parsed) if gpus and all(parsed) else None
    return Hardware(name='local', num_gpus=len(gpus), gpu_mem_gib=mem_gib, host_ram_gib=lim,
                    gpu_name=', '.join(names), source='probed', host_ram_source=src, notes=notes, bf16=bf16, fp8=fp8)


# A probed GPU may report a little less than the profile's figure (another driver, ECC on): that much is accepted.
MEMORY_TOLERANCE = 0.03


def machine_mismatch(planned: Hardware, here: Hardware, needs_bf16: bool,
                     host_peak_gib: Optional[float] = None) -> List[str]:
    """Why a plan for `planned` cannot run on `here` (this machine, as `doctor` probes it): fewer GPUs per node,
    less memory per GPU, no bf16 where the recipe trains in bf16, less host memory (the container's limit where
    there is one) than the plan's host peak `host_peak_gib`. [] when it can."""
    problems = []
    if host_peak_gib is not None and here.host_ram_gib is not None and host_peak_gib > here.host_ram_gib:
        problems.append(f'a host peak of {host_peak_gib:.2f} GiB per node planned, {here.host_ram_gib:.2f} GiB here '
                        f'({here.host_ram_source or "probed"}): the kernel would kill the run while it loads')
    if here.num_gpus < planned.num_gpus:
        problems.append(f'{planned.num_gpus} GPU{"s" if planned.num_gpus > 1 else ""} per node planned, '
                        f'{here.num_gpus} here' + (f' ({here.gpu_name})' if here.gpu_name else ''))
    elif here.num_gpus and here.gpu_mem_gib < planned.gpu_mem_gib * (1 - MEMORY_TOLERANCE):
        problems.append(f'{planned.gpu_mem_gib:.2f} GiB per GPU planned, {here.gpu_mem_gib:.2f} GiB here '
                        f'({here.gpu_name})')
    if needs_bf16 and here.num_gpus and here.bf16 is False:
        problems.append(f'the recipe trains in bfloat16 and {here.gpu_name} has no bf16 (compute capability < 8.0)')
    return problems


def resolve(name: Optional[str] = None, gpus: Optional[int] = None, gpu_mem_gib: Optional[float] = None,
            host_ram_gib: Optional[float] = None, nodes: int = 1) -> Hardware:
    """`--hardware NAME` or `--gpus/--gpu-mem-gib/--host-ram-gib`; `--host-ram-gib` overrides a profile's host."""
    if name not in (None, '') and name.strip().lower() != 'local' and (gpus is not None or gpu_mem_gib is not None):
        hw = profile(name)  # a profile's GPU, with another count and/or memory
        if gpus is not None:
            hw = with_gpu_count(hw, gpus)
        if gpu_mem_gib is not None:
            if gpu_mem_gib <= 0:
                raise ValueError('--gpu-mem-gib must be > 0')
            hw.gpu_mem_gib = gpu_mem_gib
            hw.name += f', {gpu_mem_gib:g} GiB each'
        hw.nodes = nodes
        if host_ram_gib is not None:
            hw.host_ram_gib, hw.host_ram_source = host_ram_gib, '--host-ram-gib'
        return hw
    if gpus is not None or gpu_mem_gib is not None:
        if gpus is None or gpu_mem_gib is None:
            raise ValueError('--gpus and --gpu-mem-gib go together (or --hardware NAME --gpus N)')
        return custom(gpus, gpu_mem_gib, host_ram_gib, nodes)
    name = name or 'local'
    hw = local() if name.strip().lower() == 'local' else profile(name)
    hw.nodes = nodes
    if host_ram_gib is not None:
        hw.host_ram_gib = host_ram_gib
        hw.host_ram_source = '--host-ram-gib'
    return hw
