"""FP8 GEMMs for the frozen base weights of LoRA training (`SWIFT_VORA_FP8=frozen_base`, recipe `train.fp8`).

In LoRA the base weights never change: their GEMMs need the forward product and the input-gradient product, never
a weight gradient. Both can run in FP8 on GPUs with FP8 tensor cores (compute capability 8.9+: Ada, Hopper,
Blackwell; an H200 multiplies FP8 at about twice its bf16 rate), and a weight that never changes is cast to FP8
once and kept so (half the memory of bf16). The LoRA adapters, norms, attention and the loss stay as they were.

The library is torchao's float8 training stack, used for what it does well -- the scaled casts
(`hp_tensor_to_float8_dynamic`, e4m3 for weights and activations, e5m2 for gradients) and the scaled matrix product
of its `Float8TrainingTensor` (torch._scaled_mm on the GPU; `emulate` in high precision elsewhere). Its module swap
(`convert_to_float8_training` -> `Float8Linear`) is not used: its backward always computes a weight gradient and
re-casts the weight from bf16 in every call (torchao 0.18 `matmul_with_hp_or_float8_args`), which for a frozen
weight is a third more FP8 GEMMs than needed and a bf16 weight kept besides. `FrozenFp8Linear` holds the weight
already cast (tensorwise scale from its exact max, fixed: the weight is frozen) and its autograd function computes
the output and the input gradient only; it saves no activation (a frozen GEMM needs none for its backward).

Applied at train begin (a trainer callback, after PEFT wrapped the model and before the layers are compiled) to
every frozen `nn.Linear` inside the decoder layers -- PEFT's `base_layer` of each LoRA layer and the linears LoRA
does not target -- whose two dimensions are multiples of 16 (torch._scaled_mm's rule); the others stay in bf16
and are counted. The vision tower, the embeddings and the LM head stay as they were. Refused where it cannot
help or was not shown to work: a GPU without FP8 tensor cores, no GPU (unless `SWIFT_VORA_FP8_EMULATE=1`, which
emulates the casts in high precision for checks -- no speed), DeepSpeed ZeRO-3 (its weights are partitioned),
Megatron and Unsloth (their own layers).
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from swift.callbacks import TrainerCallback

from .. import switches

# One statement of each rule, shared with the plan (which must say in advance what this module will do):
# FP8 tensor cores from compute capability 8.9 (Ada, Hopper, Blackwell); torch._scaled_mm takes weights whose two
# dimensions are multiples of 16
from ..plan.hardware import FP8_CAPABILITY as MIN_CAPABILITY
from ..plan.memory import FP8_DIM_MULTIPLE as DIM_MULTIPLE

ENV = 'SWIFT_VORA_FP8'
EMULATE_ENV = 'SWIFT_VORA_FP8_EMULATE'
ACCUM_ENV = 'SWIFT_VORA_FP8_ACCUM'
REPORT = 'fp8.json'
logger = logging.getLogger('swift')


class Fp8Unavailable(RuntimeError):
    """FP8 asked for where it cannot run: the reason and what to do instead."""


def mode(environ=None) -> str:
    return switches.read(ENV, environ)


def enabled(environ=None) -> bool:
    return mode(environ) != 'off'


def emulated(environ=None) -> bool:
    return bool(switches.read(EMULATE_ENV, environ))


def fast_accumulation(environ=None) -> bool:
    """Whether the forward GEMM accumulates fast (torchao's default recipe) or exactly (SWIFT_VORA_FP8_ACCUM)."""
    return switches.read(ACCUM_ENV, environ) == 'fast'


def gpu_supports_fp8(capability: Optional[Tuple[int, int]]) -> bool:
    return capability is not None and tuple(capability) >= MIN_CAPABILITY


def unsupported_reason(capability: Optional[Tuple[int, int]], name: str = 'this GPU') -> Optional[str]:
    """Why FP8 GEMMs cannot run on a GPU of `capability` (None: no GPU), or None when they can."""
    if capability is None:
        return 'no CUDA GPU: FP8 GEMMs need FP8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell)'
    if not gpu_supports_fp8(capability):
        major, minor = capability
        return (f'{name} has compute capability {major}.{minor}; FP8 tensor cores need 8.9+ (Ada, Hopper, '
                'Blackwell). Ampere cards (3060, 3090, A100) keep bf16: set train.fp8: off')
    return None


def _mm_config(emulate: bool, fast_accum: bool = True):
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig
    # (emulate, use_fast_accum, fp8_output, pad_inner_dim): the forward accumulates fast as torchao's default recipe
    # does unless SWIFT_VORA_FP8_ACCUM=exact (the first H200 run's losses drifted 2.6 % from bf16's: a suspect);
    # exact accumulation for the input gradient always
    return LinearMMConfig(ScaledMMConfig(emulate, fast_accum, False, False),
                          ScaledMMConfig(emulate, False, False, False), ScaledMMConfig(emulate, False, False, False))


@functools.lru_cache(maxsize=None)
def frozen_fp8_matmul():
    """The autograd function (built on first use: importing this module needs neither torch nor torchao)."""
    import torch
    from torchao.float8.config import e4m3_dtype, e5m2_dtype  # fnuz variants on ROCm
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole

    class FrozenFp8Matmul(torch.autograd.Function):
        """x @ W^T with W frozen and already in FP8: the output and the input gradient, no weight gradient."""

        @staticmethod
        def forward(ctx, x, weight_fp8_t, mm_config):
            ctx.weight_fp8_t, ctx.mm_config = weight_fp8_t, mm_config
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            with torch.autocast(x.device.type, enabled=False):  # the casts and the scaled product set the dtypes
                x_fp8 = hp_tensor_to_float8_dynamic(x2, e4m3_dtype, mm_config, gemm_input_role=GemmInputRole.INPUT)
                out = torch.mm(x_fp8, weight_fp8_t)
            return out.reshape(*shape[:-1], out.shape[-1])

        @staticmethod
        def backward(ctx, grad_out):
            shape = grad_out.shape
            g2 = grad_out.reshape(-1, shape[-1])
            with torch.autocast(grad_out.device.type, enabled=False):
                g_fp8 = hp_tensor_to_float8_dynamic(g2, e5m2_dtype, ctx.mm_config,
                                                    gemm_input_role=GemmInputRole.GRAD_OUTPUT)
                grad_in = torch.mm(g_fp8, ctx.weight_fp8_t.t())
            return grad_in.reshape(*shape[:-1], grad_in.shape[-1]), None, None

    return FrozenFp8Matmul


@functools.lru_cache(maxsize=None)
def frozen_fp8_linear_class():
    """The module class (built on first use, like the autograd function)."""
    import torch
    # Resolved here, once, not in forward: torch.compile traces into an lru_cache-wrapped call, and on torch 2.11
    # the class statement inside it broke every compiled decoder layer's graph at each FP8 linear (the H200 run of
    # 2026-12-02: 32 graphs and 24 breaks where bf16 compiled 3 graphs and none; FP8 at 0.42x of bf16)
    matmul = frozen_fp8_matmul()

    class FrozenFp8Linear(torch.nn.Module):
        """A frozen `nn.Linear` whose weight is held in FP8 (e4m3, one scale) and multiplied in FP8."""

        def __init__(self, linear: torch.nn.Linear, emulate: bool = False, fast_accum: bool = True):
            super().__init__()
            from torchao.float8.config import e4m3_dtype
            from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
            from torchao.float8.float8_training_tensor import GemmInputRole
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.mm_config = _mm_config(emulate, fast_accum)
            with torch.no_grad():
                # W^T as a column-major view of the row-major W: the layout torch._scaled_mm takes second
                self.weight_fp8_t = hp_tensor_to_float8_dynamic(linear.weight.detach().t(), e4m3_dtype,
                                                                self.mm_config, gemm_input_role=GemmInputRole.WEIGHT)
            self.weight_dtype = linear.weight.dtype
            self.bias = linear.bias  # frozen with the weight; added in the output's dtype
            self.emulate = emulate

        @property
        def weight(self):
            """The weight in its training dtype (a new tensor from the FP8 copy, for code that reads
            `base_layer.weight`; the forward never uses it)."""
            return self.weight_fp8_t.to_original_precision().t().to(self.weight_dtype)

        def forward(self, x):
            import torch
            if torch.is_autocast_enabled(x.device.type):
                x = x.to(torch.get_autocast_dtype(x.device.type))
            out = matmul.apply(x, self.weight_fp8_t, self.mm_config)
            return out if self.bias is None else out + self.bias.to(out.dtype)

        def extra_repr(self) -> str:
            return (f'in_features={self.in_features}, out_features={self.out_features}, '
                    f'bias={self.bias is not None}, fp8=e4m3 tensorwise{", emulated" if self.emulate else ""}')

    return FrozenFp8Linear


def eligible(linear) -> Optional[str]:
    """None when `linear` can be converted; else why not."""
    if linear.weight.requires_grad:
        return 'trainable'
    if linear.in_features % DIM_MULTIPLE or linear.out_features % DIM_MULTIPLE:
        return f'dimensions {linear.out_features}x{linear.in_features} not multiples of {DIM_MULTIPLE}'
    if linear.weight.is_meta or linear.weight.numel() == 0:
        return 'weight not materialised (meta or partitioned)'
    return None


def convert_frozen_linears(layers: List, emulate: bool = False, fast_accum: bool = True) -> Dict[str, Any]:
    """Replace every eligible frozen `nn.Linear` inside `layers` (in place). Returns what was done."""
    import gc
    done, replaced = _swap_linears(layers, emulate, fast_accum)
    done['forward_accumulation'] = 'fast' if fast_accum else 'exact'
    gc.collect()
    # The saving is real only if nothing else holds the replaced bf16 weights (a module list taken before the swap
    # did on the H200, 2026-12-02: peak 1.2 GiB above bf16 instead of 1.3 below)
    done['replaced_weights_still_alive'] = sum(ref() is not None for ref in replaced)
    return done


def _swap_linears(layers: List, emulate: bool, fast_accum: bool):
    """(what was done, weak references to the replaced weights); returns before the caller looks for survivors,
    so none of its locals holds one."""
    import weakref

    import torch
    cls = frozen_fp8_linear_class()
    converted, kept, bytes_before, bytes_after, replaced = 0, {}, 0, 0, []
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is not torch.nn.Linear:
                    continue
                why = eligible(child)
                if why is not None:
                    if why != 'trainable':  # LoRA's own A and B are trainable by design, not "kept"
                        kept[why] = kept.get(why, 0) + 1
                    continue
                bytes_before += child.weight.numel() * child.weight.element_size()
                new = cls(child, emulate=emulate, fast_accum=fast_accum)
                bytes_after += new.weight_fp8_t._data.numel() * new.weight_fp8_t._data.element_size()
                setattr(parent, name, new)
                replaced.append(weakref.ref(child.weight))
                converted += 1
    return ({'converted': converted, 'kept_bf16': kept, 'weight_bytes_before': bytes_before,
             'weight_bytes_after': bytes_after, 'weight_gib_before': round(bytes_before / 2**30, 3),
             'weight_gib_after': round(bytes_after / 2**30, 3), 'layers': len(layers), 'emulated': emulate},
            replaced)


def device_capability(model) -> Tuple[Optional[Tuple[int, int]], str]:
    """(compute capability of the model's GPU or None, its name)."""
    import torch
    param = next((p for p in model.parameters()), None)
    if param is None or param.device.type != 'cuda':
        return None, str(param.device) if param is not None else 'no parameters'
    return torch.cuda.get_device_capability(param.device), torch.cuda.get_device_name(param.device)


def apply(model, environ=None, output_dir: Optional[str] = None) -> Dict[str, Any]:
    """Convert the model's decoder layers (raises Fp8Unavailable with the reason where FP8 cannot run)."""
    from .compile_layers import decoder_layers
    emulate = emulated(environ)
    if _zero3(model):
        raise Fp8Unavailable('train.fp8=frozen_base under DeepSpeed ZeRO-3: its weights are partitioned and '
                             'gathered per module, which the FP8 copy would bypass. Set train.fp8: off, or train '
                             'without ZeRO-3 (the plan says whether the model fits)')
    capability, name = device_capability(model)
    reason = None if emulate else unsupported_reason(capability, name)
    if reason:
        raise Fp8Unavailable(f'train.fp8=frozen_base: {reason}')
    layers = decoder_layers(model)
    if not layers:
        raise Fp8Unavailable('train.fp8=frozen_base: no decoder layers found in the model (a *DecoderLayer '
                             'ModuleList); nothing would run in FP8')
    done = convert_frozen_linears(layers, emulate=emulate, fast_accum=fast_accumulation(environ))
    done['gpu'] = name
    done['capability'] = list(capability) if capability else None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, REPORT), 'w') as f:
            json.dump(done, f, indent=2)
    return done


def _zero3(model) -> bool:
    """Whether any parameter is a DeepSpeed ZeRO-3 partition (ds_id set by deepspeed.zero.Init)."""
    return any(hasattr(p, 'ds_id') for p in model.parameters())


def describe(done: Dict[str, Any]) -> str:
    kept = ', '.join(f'{n} ({why})' for why, n in done['kept_bf16'].items()) or 'none'
    return (f'swift-vora fp8: {done["converted"]} frozen linear layers of {done["layers"]} decoder layers compute in '
            f'FP8{" (emulated: no speed)" if done["emulated"] else ""}; their weights {done["weight_gib_before"]} '
            f'-> {done["weight_gib_after"]} GiB; kept in bf16: {kept}' + (
                f'; WARNING: {done["replaced_weights_still_alive"]} replaced bf16 weights are still referenced '
                'elsewhere, so their memory is not freed' if done.get('replaced_weights_still_alive') else ''))


class Fp8FrozenBase(TrainerCallback):
    """At train begin: the decoder's frozen linears to FP8 (before compile_layers, which compiles what it finds)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import torch
        if model is None:
            return
        done = apply(model, output_dir=getattr(args, 'output_dir', None) if state.is_world_process_zero else None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the bf16 copies are gone: give their blocks back
        logger.info(describe(done))
