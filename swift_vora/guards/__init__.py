"""Training guards: ms-swift callbacks that make the silent failures of (multi-GPU) video SFT loud.

Importing the plugin (`--custom_register_path swift_vora`) registers them as `vora_<name>` in
`swift.callbacks.callbacks_map` and enables them by default (swift_vora/swift_registry.py; the selection is in
registry.py, `SWIFT_VORA_GUARDS=none` turns them off). One module per guard:

- coverage       every rank gets batches; tail samples ms-swift would drop are padded/dropped/stop
                 (`SWIFT_VORA_TAIL`); sample ids consumed per rank, never-seen report per epoch
- supervision    a batch without supervised tokens stops the run; distribution at the end
- lora_update    every lora_B changed after the first step, every lora_A after the second (ZeRO-3 safe)
- fingerprint    interpreter, packages, git commit/dirty, plugin and recipe hashes, argv, env -> fingerprint.json
- memory         memory by phase per rank (CUDA allocator or host RSS) -> memory_phases.rank*.jsonl; OOM report
- zero3_load     under ZeRO-3, every checkpoint tensor is compared with the gathered parameter
- verify_adapter after the final save, `swift-vora verify-adapter` reloads the adapter in a fresh process

Under `megatron sft`, fingerprint, memory and lora_update run as Megatron-SWIFT callbacks (megatron.py).
See docs/guards.md. Importing this package does not import ms-swift; the guard modules do.
"""
from .registry import GUARDS, enabled_guards

__all__ = ['GUARDS', 'enabled_guards']
