"""Gated DeltaNet under `megatron sft` on Hopper: bind the flash-linear-attention kernels that are correct there.

The problem (docs/backends.md, "Gated DeltaNet under Megatron"): mcore-bridge 1.6.5 builds Qwen3.5/3.6-MoE and
Qwen3-Next with its own `GatedDeltaNet` (mcore_bridge/model/modules/gated_delta_net.py, a subclass of megatron-core
0.16.1's megatron/core/ssm/gated_delta_net.py; `USE_MCORE_GDN=1`, the default). Both modules bind
flash-linear-attention (`fla`) when they are imported:
- megatron-core: `from fla.modules.l2norm import l2norm` and `from fla.ops.gated_delta_rule import
  chunk_gated_delta_rule` -> `HAVE_FLA`; its `GatedDeltaNet.__init__` raises "FLA is not installed" without them;
- mcore-bridge: the same two plus `from fla.modules.convolution import causal_conv1d`, in ONE try block: if any
  is missing all three are None, and its forward then calls `l2norm(None)` (TypeError) -- unless
  `deterministic_mode`, which swaps the recurrence for megatron-core's PyTorch reference, but still needs l2norm.
Upstream fla's gated chunk backward is wrong on Hopper with Triton >= 3.4, < 3.7.1 (fla #640: its BK=64 tile is
miscompiled; fla 0.5.0/0.5.1 raise, 0.5.2/0.6 refuse), and the GPU image has torch 2.11 / Triton 3.6. unsloth_zoo
vendors fla 0.5.1 with that tile stepped down to BK=32 on Hopper (`_vendored/fla`, the kernel the Unsloth path
trains with); it has no `fla.modules.convolution` (its convolution lives in `fla.modules.conv`).

What this module does, in the `megatron sft` process only (swift_registry.register_megatron_callbacks calls
`install_from_env()` when ms-swift imports the plugin -- after mcore-bridge registered its models, before the model
is built), and only when the launch asked for it (`SWIFT_VORA_MEGATRON_FLA`, set to `auto` by
backends/megatron.py for a model with linear-attention layers):
1. registers unsloth_zoo's vendored fla as the top-level `fla` package (located with `importlib.util.find_spec`,
   which does not run unsloth_zoo's __init__; the one import of `unsloth_zoo._vendored.fla` inside the tree is
   answered by the registered module, so none of Unsloth's patches are applied);
2. rebinds the module globals the two GatedDeltaNet modules read at call time: `l2norm`, `chunk_gated_delta_rule`
   (and `HAVE_FLA = True` in megatron-core). `causal_conv1d` is left as imported: with fla absent it is None and
   mcore-bridge runs its exact `F.conv1d` path (padded rows; the recipe's packing=off -- packed rows need fla's
   varlen convolution and are refused by the launch).
Inventoried in swift_vora/patches.py (`megatron_gdn_fla`, `mcore_bridge_gdn_fla`: kind `sets`).

`SWIFT_VORA_MEGATRON_FLA`:
- `off` (or unset): nothing is touched; upstream's imports stand.
- `auto`: on a Hopper GPU with Triton in [3.4, 3.7.1) the vendored fla is bound; elsewhere an importable upstream
  fla is left as it is (correct there), else the vendored one. With no correct kernel on a Hopper GPU it REFUSES
  (RuntimeError before the model loads) rather than train on wrong gradients.
- `vendored`: the vendored fla wherever it is installed (refuses when it is not).
The decision is recorded (`last_decision()`) and printed once in the training log.

`gradient_check()` compares the bound kernels with megatron-core's PyTorch reference (`torch_chunk_gated_delta_rule`
+ a PyTorch l2norm), outputs and the gradients of q, k, v, g, beta, as mcore-bridge calls them
(scripts/gpu/gdn_grad_check.py runs it on the GPU before a Megatron Qwen3.5 run; on CPU the tests run it with the
reference on both sides and with a perturbed kernel, which it must reject).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

ENV = 'SWIFT_VORA_MEGATRON_FLA'
MODES = ('off', 'auto', 'vendored')
MEGATRON_GDN = 'megatron.core.ssm.gated_delta_net'
MCORE_BRIDGE_GDN = 'mcore_bridge.model.modules.gated_delta_net'
# The globals each module reads at call time, and where they come from in the bound fla.
BINDINGS = {
    MEGATRON_GDN: {'l2norm': ('fla.modules.l2norm', 'l2norm'),
                   'chunk_gated_delta_rule': ('fla.ops.gated_delta_rule', 'chunk_gated_delta_rule')},
    MCORE_BRIDGE_GDN: {'l2norm': ('fla.modules.l2norm', 'l2norm'),
                       'chunk_gated_delta_rule': ('fla.ops.gated_delta_rule', 'chunk_gated_delta_rule')},
}
PATCH_NAMES = {MEGATRON_GDN: 'megatron_gdn_fla', MCORE_BRIDGE_GDN: 'mcore_bridge_gdn_fla'}
# unsloth_zoo's Hopper fix of fla #640: the tile probe in its vendored chunk_o.py (backends/unsloth_runner.py's
# fla_hopper_workaround() looks for the same name on the bound module).
HOPPER_FIX_MARK = '_is_hopper_tensor'
VENDOR_ALIAS = 'unsloth_zoo._vendored.fla'  # the name the vendored tree imports its own version from
BAD_TRITON = ((3, 4, 0), (3, 7, 1))  # fla #640: [low, high)


@dataclass
class Decision:
    mode: str
    action: str  # none | upstream | vendored | refuse
    why: str
    hopper: Optional[bool] = None
    triton: Optional[str] = None
    vendored_dir: Optional[str] = None
    rebound: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


_last: Optional[Decision] = None


def last_decision() -> Optional[Dict[str, Any]]:
    return _last.to_dict() if _last else None


def vendored_fla_dir() -> Optional[str]:
    """unsloth_zoo's `_vendored/fla` folder if it is installed and carries the Hopper fix; None otherwise.
    `find_spec` of a top-level package does not execute it (unsloth_zoo's __init__ patches a lot)."""
    try:
        spec = importlib.util.find_spec('unsloth_zoo')
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, '_vendored', 'fla')
        chunk_o = os.path.join(path, 'ops', 'common', 'chunk_o.py')
        if os.path.isfile(os.path.join(path, '__init__.py')) and os.path.isfile(chunk_o):
            with open(chunk_o, encoding='utf-8') as f:
                if HOPPER_FIX_MARK in f.read():
                    return path
    return None


def _version(text: str) -> Tuple[int, ...]:
    parts = []
    for piece in text.split('+')[0].split('.')[:3]:
        digits = ''.join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def probe_device() -> Tuple[Optional[bool], Optional[str]]:
    """(is the current CUDA device a Hopper GPU -- None without CUDA, the Triton version or None)."""
    hopper = None
    try:
        import torch
        if torch.cuda.is_available():  # this rank's GPU (torchrun's LOCAL_RANK), before Megatron sets the device
            index = int(os.environ.get('LOCAL_RANK', '0') or 0) % max(1, torch.cuda.device_count())
            hopper = torch.cuda.get_device_capability(index)[0] == 9
    except RuntimeError:  # CUDA present but not usable from this process: unknown, as without a GPU
        hopper = None
    except ImportError:
        hopper = None
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return hopper, triton_version


def bound_fla_dir() -> Optional[str]:
    """The folder of the `fla` package this process imported (None if none)."""
    module = sys.modules.get('fla')
    path = getattr(module, '__file__', None) if module is not None else None
    return os.path.dirname(os.path.abspath(path)) if path else None


def upstream_fla_importable() -> bool:
    if 'fla' in sys.modules:  # a vendored copy (unsloth_zoo/_vendored/fla) bound already is not upstream's
        bound = bound_fla_dir()
        return bound is not None and os.path.basename(os.path.dirname(bound)) != '_vendored'
    try:
        return importlib.util.find_spec('fla') is not None
    except (ImportError, ValueError):
        return False


def decide(mode: str, hopper: Optional[bool], triton_version: Optional[str], vendored: Optional[str],
           upstream: bool) -> Decision:
    """What to bind, from the mode and what this machine has (pure: the tests call it with every combination)."""
    bad = bool(hopper) and triton_version is not None and BAD_TRITON[0] <= _version(triton_version) < BAD_TRITON[1]
    facts = dict(hopper=hopper, triton=triton_version, vendored_dir=vendored)
    if mode == 'off':
        return Decision(mode, 'none', f'{ENV}=off: upstream fla bindings left as imported', **facts)
    if mode not in MODES:
        raise ValueError(f'{ENV}={mode!r}: one of {", ".join(MODES)}')
    if mode == 'auto' and not bad and upstream:
        return Decision(mode, 'upstream', 'no Hopper GPU with Triton in [3.4, 3.7.1) here: the installed '
                        'flash-linear-attention is correct and stays bound', **facts)
    if vendored:
        return Decision(mode, 'vendored', "unsloth_zoo's vendored flash-linear-attention 0.5.1 (fla #640's BK=64 "
                        'tile stepped down to 32 on Hopper) bound for Gated DeltaNet', **facts)
    if bad or mode == 'vendored':
        where = (f'a Hopper GPU with Triton {triton_version}, where upstream flash-linear-attention\'s gated chunk '
                 'backward gives wrong gradients (fla #640) or refuses') if bad else f'{ENV}=vendored'
        return Decision(mode, 'refuse', f'{where}, and unsloth_zoo (whose vendored fla is correct there) is not '
                        'installed: install unsloth_zoo (scripts/gpu/fetch_wheels.sh moe carries it), or use '
                        f'Triton >= 3.7.1 with flash-linear-attention >= 0.5.2, or set {ENV}=off to run upstream\'s '
                        'bindings as they are', **facts)
    return Decision(mode, 'none', 'no vendored fla and no upstream fla: megatron-core will refuse the Gated DeltaNet '
                    'layers ("FLA is not installed")', **facts)


def register_vendored(path: str) -> Any:
    """Register the folder `path` as the top-level `fla` package (its files import each other as `fla.*`), and
    import the two entry points mcore-bridge and megatron-core use. A real fla imported before is set aside."""
    init = os.path.join(path, '__init__.py')
    if bound_fla_dir() == os.path.abspath(path):
        return sys.modules['fla']
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == 'fla' or k.startswith('fla.')}
    spec = importlib.util.spec_from_file_location('fla', init, submodule_search_locations=[path])
    module = importlib.util.module_from_spec(spec)
    sys.modules['fla'] = module
    # The vendored fla/utils/_decorators.py reads its version as `from unsloth_zoo._vendored.fla import __version__`:
    # answered by this module, so that import never runs unsloth_zoo's __init__ (Unsloth's patches, allocator
    # settings). A name already imported stays as it is.
    alias = VENDOR_ALIAS not in sys.modules
    if alias:
        sys.modules[VENDOR_ALIAS] = module
    # The vendored snapshot has no TileLang / intra-card CP backends (unsloth_zoo sets the same two switches).
    os.environ.setdefault('FLA_TILELANG', '0')
    os.environ.setdefault('FLA_INTRACARD_CP', '0')
    try:
        spec.loader.exec_module(module)
        for name in {mod for targets in BINDINGS.values() for mod, _ in targets.values()}:
            importlib.import_module(name)
    except Exception:  # any failure: put back what was there, then re-raise (the caller refuses)
        for k in [k for k in sys.modules if k == 'fla' or k.startswith('fla.')]:
            sys.modules.pop(k, None)
        if alias:
            sys.modules.pop(VENDOR_ALIAS, None)
        sys.modules.update(saved)
        raise
    return module


def rebind(modules: Optional[Dict[str, Any]] = None) -> List[str]:
    """Point the GatedDeltaNet modules' fla globals at the registered `fla` (those already imported; a module
    imported later binds the registered `fla` itself, except mcore-bridge's `fla.modules.convolution`, absent from
    the vendored tree -- its l2norm and chunk come from here). Returns 'module.name' of every global set."""
    from swift_vora import patches
    modules = modules if modules is not None else {name: sys.modules.get(name) for name in BINDINGS}
    done = []
    for name, module in modules.items():
        if module is None:
            continue
        patch = PATCH_NAMES[name]
        if not patches.applicable(patch):
            continue
        for attr, (source, symbol) in BINDINGS[name].items():
            setattr(module, attr, getattr(importlib.import_module(source), symbol))
            done.append(f'{name}.{attr}')
        if hasattr(module, 'HAVE_FLA'):
            module.HAVE_FLA = True
            done.append(f'{name}.HAVE_FLA')
        patches.applied(patch)
    return done


def install(mode: str, *, device: Optional[Tuple[Optional[bool], Optional[str]]] = None,
            vendored: Optional[str] = None, upstream: Optional[bool] = None,
            modules: Optional[Dict[str, Any]] = None, log: Callable[[str], None] = print) -> Decision:
    """Decide and act (see the module docstring). Raises RuntimeError when the decision is to refuse."""
    global _last
    hopper, triton_version = device if device is not None else probe_device()
    vendored = vendored if vendored is not None else vendored_fla_dir()
    upstream = upstream if upstream is not None else upstream_fla_importable()
    decision = decide(mode, hopper, triton_version, vendored, upstream)
    _last = decision
    if decision.action == 'refuse':
        raise RuntimeError(f'swift-vora: Gated DeltaNet under megatron sft: {decision.why}')
    if decision.action == 'vendored':
        register_vendored(decision.vendored_dir)
        decision.rebound = rebind(modules)
    if decision.action != 'none' or mode != 'off':
        log(f'swift-vora: Gated DeltaNet kernels ({ENV}={mode}): {decision.action} -- {decision.why}'
            + (f'; rebound {", ".join(decision.rebound)}' if decision.rebound else ''))
    return decision


def install_from_env(environ: Optional[Dict[str, str]] = None) -> Optional[Decision]:
    """The plugin's entry point inside `megatron sft`: nothing unless the launch set SWIFT_VORA_MEGATRON_FLA."""
    from swift_vora import switches
    mode = switches.read(ENV, environ)
    if mode == 'off':
        return None
    if _last is not None:  # decided once per process; a forked DataLoader worker inherits the parent's decision
        return _last  # (and must not probe CUDA again: it cannot be re-initialised in a forked child)
    return install(mode)


# ---------------------------------------------------------------------------------------------------------------
# the gradient check
# ---------------------------------------------------------------------------------------------------------------
def reference_l2norm(x):
    """What fla's l2norm computes (eps 1e-6 inside the square root), in fp32."""
    import torch
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _inputs(batch: int, seq: int, heads: int, head_dim: int, device: str, dtype, seed: int):
    import torch
    gen = torch.Generator(device='cpu').manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)
    q, k, v = (rand(batch, seq, heads, head_dim).to(dtype) for _ in range(3))
    alpha = rand(batch, seq, heads)
    # log decay <= 0, fp32 as mcore-bridge passes it; mostly slow (~-0.05 a token), so the state carries across
    # chunks and the inter-chunk backward (fla #640's kernel) matters
    g = -torch.nn.functional.softplus(alpha.float() - 3.0)
    beta = rand(batch, seq, heads).sigmoid().to(dtype)
    return q, k, v, g, beta


def gradient_check(kernel: Callable, l2norm: Callable, reference: Callable, *, batch: int = 1, seq: int = 512,
                   heads: int = 4, head_dim: int = 128, device: str = 'cpu', dtype=None, reference_dtype=None,
                   seed: int = 0, tolerance: float = 0.02) -> Dict[str, Any]:
    """Relative error (|a - b| / |b|, Frobenius) of the output and of d q, k, v, g, beta between `kernel` with
    `l2norm` and `reference` with reference_l2norm, called as mcore-bridge's GatedDeltaNet calls them (q and k
    l2-normalised outside the kernel, use_qk_l2norm_in_kernel=False, no initial state). `ok` when every error is
    within `tolerance`. `reference_dtype` (default `dtype`): the reference runs on the same inputs cast to it (fp32
    for a bf16 kernel)."""
    import torch
    dtype = dtype or torch.float32
    reference_dtype = reference_dtype or dtype
    q, k, v, g, beta = _inputs(batch, seq, heads, head_dim, device, dtype, seed)
    gen = torch.Generator(device='cpu').manual_seed(seed + 1)
    upstream_grad = torch.randn(batch, seq, heads, head_dim, generator=gen).to(device, dtype)

    seconds = {}

    def run(label, fn, norm, cast):
        start = time.perf_counter()
        leaves = [(t.detach().clone() if t is g else t.detach().to(cast)).requires_grad_(True)
                  for t in (q, k, v, g, beta)]
        out, _ = fn(norm(leaves[0]), norm(leaves[1]), leaves[2], g=leaves[3], beta=leaves[4], initial_state=None,
                    output_final_state=False, use_qk_l2norm_in_kernel=False)
        (out.float() * upstream_grad.float()).sum().backward()
        if str(device).startswith('cuda'):
            torch.cuda.synchronize()
        seconds[label] = round(time.perf_counter() - start, 2)  # the kernel's includes its compile and autotune
        return [out.detach()] + [t.grad.detach() for t in leaves]

    got, want = run('kernel_s', kernel, l2norm, dtype), run('reference_s', reference, reference_l2norm, reference_dtype)
    names = ('out', 'dq', 'dk', 'dv', 'dg', 'dbeta')
    errors = {}
    for name, a, b in zip(names, got, want):
        a, b = a.float(), b.float()
        finite = bool(torch.isfinite(a).all())
        errors[name] = round(float((a - b).norm() / b.norm().clamp_min(1e-12)), 6) if finite else float('inf')
    return {'shape': {'batch': batch, 'seq': seq, 'heads': heads, 'head_dim': head_dim, 'dtype': str(dtype),
                      'reference_dtype': str(reference_dtype)},
            'tolerance': tolerance, 'rel_error': errors, 'ok': all(e <= tolerance for e in errors.values()),
            **seconds}
