"""What importing the plugin does inside ms-swift, all of it here: the `video_ora` template and dataset, the
callbacks (the guards and the speed levers') and the patches.

Callbacks: each guard (swift_vora/guards/registry.py) and each speed lever with a callback (swift_vora/speed/) is
an ms-swift `TrainerCallback` registered in `swift.callbacks.callbacks_map` as `vora_<name>`, so
`--callbacks vora_coverage ...` works like any ms-swift callback. To make them default without a flag, one narrow
patch wraps `SwiftMixin._get_callbacks` (the method that turns `args.callbacks` into callback objects,
swift/trainers/mixin.py): it appends the enabled guards, then the enabled levers' callbacks, that the command line
did not already name, and `process_group_exit.TrainEnd` (gloo ranks that finished leave together).
Switches are read when the trainer is built. The guards and levers apply to ms-swift's SFT-style trainers
(`swift.trainers`), not to the RLHF or Megatron trainers; `TrainEnd` to every trainer that builds callbacks here.

Under `megatron sft` (the plugin is imported by `--custom_register_path` after `swift.megatron`), the guards of
`guards.registry.MEGATRON_GUARDS` are also registered in Megatron-SWIFT's `megatron_callbacks_map` as `vora_<name>`;
Megatron-SWIFT has no default-callback hook, so `swift-vora train` names the enabled ones in `--callbacks`
(swift_vora/backends/megatron.py); so too `vora_step_profile` (backends/megatron_profile.py: the data wait of every
step, one step under torch.profiler) when SWIFT_VORA_PROFILE_STEP is set. Outside such a process nothing of Megatron
is imported (it needs megatron-core and Transformer Engine).

Before anything is registered, every `SWIFT_VORA_*` variable is checked against the switch table
(swift_vora/switches.py). Patches at import: the batched vision attention (swift_vora/speed/vit_attention.py;
SWIFT_VORA_VIT_ATTENTION=transformers to skip it). The template applies the per-sample levers itself
(swift_vora/speed/encode.py).
"""
from __future__ import annotations

import sys

_registered = False
PREFIX = 'vora_'


def register_all() -> None:
    global _registered
    if _registered:
        register_megatron_callbacks()  # swift.megatron may have been imported since (idempotent)
        return
    from .switches import check_environment
    check_environment()  # a misspelt SWIFT_VORA_* name or a bad value stops here, not silently mid-run
    from .dataset import register_video_ora_dataset
    from .template import register_video_ora_template
    register_video_ora_template()
    register_video_ora_dataset()
    register_callbacks()
    register_megatron_callbacks()
    from . import process_group_exit
    process_group_exit.register()  # a rank that finishes before rank 0 must not die in gloo's teardown
    from .speed.vit_attention import patch_vision_attention  # one sync and one attention call per ViT layer
    patch_vision_attention()
    from .speed.patch_embed import patch_patch_embeddings  # cuDNN's Conv3d kernel for one patch per row is slow
    patch_patch_embeddings()
    from . import trained_budget  # a checkpoint infers with the video budget it was trained on
    trained_budget.install()
    from .speed import packed_attention  # --attn_impl vora_varlen: --padding_free/--packing without flash-attn
    packed_attention.register()
    packed_attention.accept_in_padding_free_check()
    _registered = True


def _applies_to(trainer) -> bool:
    module = type(trainer).__module__
    return not module.startswith(('swift.rlhf_trainers', 'swift.megatron'))


def register_callbacks() -> None:
    """Put the guards and the levers' callbacks into `callbacks_map` and make the enabled ones default
    (idempotent)."""
    from swift.callbacks import callbacks_map
    from swift.trainers.mixin import SwiftMixin

    from . import patches, process_group_exit, speed, trained_budget
    from .guards.registry import GUARDS, enabled_guards, guard_class

    for name in GUARDS:
        callbacks_map.setdefault(PREFIX + name, guard_class(name))
    levers = speed.callback_levers()
    for lever in levers:
        callbacks_map.setdefault(PREFIX + lever.name, speed.callback_class(lever))
    original = SwiftMixin._get_callbacks
    if patches.patched_by(original) == 'default_callbacks' or not patches.applicable('default_callbacks'):
        return

    def _get_callbacks(self, args):
        callbacks = original(self, args)
        if _applies_to(self):
            named = set(getattr(args, 'callbacks', None) or [])
            callbacks += [callbacks_map[PREFIX + name](args, self) for name in enabled_guards()
                          if PREFIX + name not in named]
            callbacks += [speed.callback_class(lever)(args, self) for lever in levers  # trainer-level like guards
                          if lever.enabled() and PREFIX + lever.name not in named]
            callbacks.append(trained_budget.record_on_save_callback(args, self))  # the budget in every checkpoint
        callbacks.append(process_group_exit.train_end_callback())  # every trainer: gloo ranks leave together
        return callbacks

    SwiftMixin._get_callbacks = patches.mark(_get_callbacks, 'default_callbacks', original)


def register_megatron_callbacks() -> bool:
    """Inside a Megatron-SWIFT process, put the Megatron-capable guards into `megatron_callbacks_map` as
    `vora_<name>` (idempotent); elsewhere do nothing and import nothing. True when registered."""
    if 'swift.megatron' not in sys.modules:  # only `megatron sft` / `megatron ...` entry points import it
        return False
    try:
        from swift.megatron.callbacks import MegatronCallback, megatron_callbacks_map
    except ImportError:
        # swift.megatron is there half-imported, not a Megatron process: an import of Megatron-SWIFT's arguments that
        # failed on a machine without transformer_engine (a dry run's argument check) leaves the package behind
        return False

    from .backends import megatron_coalesced_optimizer, megatron_prefetch, megatron_profile
    from .guards.registry import MEGATRON_GUARDS, megatron_guard_class
    callbacks = {PREFIX + name: megatron_guard_class(name) for name in MEGATRON_GUARDS}
    # the step profile and data-wait log (backends/megatron_profile.py), named by the launch when the training
    # process's environment sets SWIFT_VORA_PROFILE_STEP; the training DataLoader read across epoch ends
    # (backends/megatron_prefetch.py), named unless it sets SWIFT_VORA_MEGATRON_PREFETCH=off
    callbacks[megatron_profile.CALLBACK] = megatron_profile.MegatronStepProfile
    callbacks[megatron_prefetch.CALLBACK] = megatron_prefetch.MegatronEpochPrefetch
    # the distributed optimizer over coalesced runs of the gradient buffers (backends/megatron_coalesced_optimizer.py),
    # named where the training process's environment sets SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced
    callbacks[megatron_coalesced_optimizer.CALLBACK] = megatron_coalesced_optimizer.MegatronCoalescedOptimizer
    for name, cls in callbacks.items():
        # MegatronCallback second: events ms-swift adds later fall back to its no-ops
        megatron_callbacks_map.setdefault(name, type(cls.__name__, (cls, MegatronCallback),
                                                     {'__module__': cls.__module__}))
    # Compiled Triton kernels and autotuning timings persist across launches (and from scripts/gpu/gdn_grad_check.py
    # into the run after it): without this every `megatron sft` process autotunes the Gated DeltaNet kernels again
    # (two 147 s first steps on a fresh H200, 2026-12-02). Set before any kernel compiles; a user's value is kept.
    from .backends import kernel_cache, megatron_fla
    kernel_cache.use_in_this_process()
    # Gated DeltaNet models: the flash-linear-attention kernels that are correct on this GPU (only when the launch
    # set SWIFT_VORA_MEGATRON_FLA; a refusal stops here, before the model loads)
    megatron_fla.install_from_env()
    # MoE LoRA: an expert layer's factors as one grouped GEMM each (only where SWIFT_VORA_MEGATRON_EXPERT_LORA says so;
    # before the model is built, so that mcore-bridge's update_layer builds them)
    # and the frozen experts under that LoRA as one grouped GEMM per product (SWIFT_VORA_MEGATRON_EXPERT_BASE)
    from .backends import megatron_expert_base, megatron_expert_lora
    megatron_expert_lora.install_from_env()
    megatron_expert_base.install_from_env()
    return True
