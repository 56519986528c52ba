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
                        host_ram_source=self.host_ram_source)

    def describe(self) -> str:
        nodes = f' x {self.nodes} nodes' if self.nodes > 1 else ''
        host = f'{self.host_ram_gib:.1f} GiB host RAM' if self.host_ram_gib is not None else 'host RAM unknown'
        gname = f' {self.gpu_name}' if self.gpu_name else ''
        return f'{self.num_gpus} x{gname} {self.gpu_mem_gib:.2f} GiB{nodes}, {host}'

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d['world'] = self.world
        return d


H200_GIB = 139.8  # torch total_memory of one H200 (141 GB HBM3e) on the lent machine
# name -> (gpus, GiB per GPU, host GiB, GPU name, host source note)
PROFILES: Dict[str, tuple] = {
    # 4 x RTX 3060 12 GB (12,636,061,696 B = 11.77 GiB as torch reports); a 64 GiB workstation.
    '3060x4': (4, 11.76, 64.0, 'RTX 3060', 'assumed 64 GiB workstation'),
    # 3 x RTX 3090 24 GB (25,438,126,080 B = 23.69 GiB); a 128 GiB workstation (assumption).
    '3090x3': (3, 23.69, 128.0, 'RTX 3090', 'assumed 128 GiB workstation'),
    # 1 x H200; the seed case's container: 276 GB (= 257.0 GiB) of RAM. The lent machine itself has 128 GiB
    # and no cgroup limit: use `--hardware local` there, or `--host-ram-gib 128`.
    'h200x1': (1, H200_GIB, 276 * C.GB / C.GiB, 'H200', "seed case container limit: 276 GB"),
    # 8 x H200 in one node (DGX/HGX H200 class: 2 TB of system RAM = 1862.6 GiB).
    'h200x8': (8, H200_GIB, 2000 * C.GB / C.GiB, 'H200', 'DGX H200 system memory 2 TB (assumption)'),
}


def profile(name: str) -> Hardware:
    if name not in PROFILES:
        raise KeyError(f'unknown hardware profile {name!r}; known: {", ".join(PROFILES)}, local')
    n, mem, host, gname, note = PROFILES[name]
    return Hardware(name=name, num_gpus=n, gpu_mem_gib=mem, host_ram_gib=host, gpu_name=gname, source='profile',
                    host_ram_source=note)


def custom(gpus: int, gpu_mem_gib: float, host_ram_gib: Optional[float], nodes: int = 1) -> Hardware:
    if gpus < 1 or gpu_mem_gib <= 0:
        raise ValueError('--gpus must be >= 1 and --gpu-mem-gib > 0')
    return Hardware(name=f'custom {gpus} x {gpu_mem_gib:g} GiB', num_gpus=gpus, gpu_mem_gib=gpu_mem_gib,
                    host_ram_gib=host_ram_gib, nodes=nodes, source='custom',
                    host_ram_source='--host-ram-gib' if host_ram_gib is not None else 'not given')


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
    return Hardware(name='local', num_gpus=len(gpus), gpu_mem_gib=mem_gib, host_ram_gib=lim,
                    gpu_name=', '.join(names), source='probed', host_ram_source=src, notes=notes)


def resolve(name: Optional[str] = None, gpus: Optional[int] = None, gpu_mem_gib: Optional[float] = None,
            host_ram_gib: Optional[float] = None, nodes: int = 1) -> Hardware:
    """`--hardware NAME` or `--gpus/--gpu-mem-gib/--host-ram-gib`; `--host-ram-gib` overrides a profile's host."""
    if gpus is not None or gpu_mem_gib is not None:
        if name not in (None, ''):
            raise ValueError('give either --hardware or --gpus/--gpu-mem-gib, not both')
        if gpus is None or gpu_mem_gib is None:
            raise ValueError('--gpus and --gpu-mem-gib go together')
        return custom(gpus, gpu_mem_gib, host_ram_gib, nodes)
    name = name or 'local'
    hw = local() if name == 'local' else profile(name)
    hw.nodes = nodes
    if host_ram_gib is not None:
        hw.host_ram_gib = host_ram_gib
        hw.host_ram_source = '--host-ram-gib'
    return hw
