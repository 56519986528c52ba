"""Test stand-ins for Megatron: parse a generated `megatron sft` argv with Megatron-SWIFT's own argument class.

Megatron needs transformer_engine (CUDA), which cannot be installed on a CPU machine. `validate_argv` parses argvs
with `HfArgumentParser(MegatronSftArguments)` (the parser `megatron sft` itself uses, swift.utils.parse_args),
without constructing the dataclass (its __post_init__ initialises torch.distributed and loads the model). That
needs `megatron-core` and `mcore-bridge` importable; mcore-bridge imports transformer_engine at import time, so the
check runs in a subprocess with a stand-in module for transformer_engine (`python tests/megatron_args.py
--check-args`). Names given to `--callbacks` are looked up in Megatron-SWIFT's `megatron_callbacks_map` after the
`--custom_register_path` plugins are imported the way ms-swift imports them (`import_external_file`), as the
trainer looks them up: swift-vora's `vora_*` guards must be registered there. Nothing here can run a model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

# recipes/h200x8.yaml trains Unsloth replicas (the fewest hours on eight H200s): these overrides make it Megatron's
# expert-parallel LoRA by name, at the settings it shipped with for Megatron (micro-batch 2, EP 8, every layer
# recomputed by Megatron's own settings)
H200X8_AS_MEGATRON_LORA = ['train.backend=megatron_ep_lora', 'train.checkpoint_layers=null', 'train.micro_batch=2',
                           'megatron.ep=8']


def _install_transformer_engine_stand_in() -> None:
    """Let mcore-bridge import without transformer_engine, for argument parsing only.

    megatron.core and peft detect TE at import and fall back cleanly when it is absent, so they are imported
    first; mcore_bridge then imports `transformer_engine` unconditionally (patcher.py, model/gpts/*), which a
    meta-path finder answers with empty stand-in modules. Nothing here can run a model."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types
    if importlib.util.find_spec('transformer_engine') is not None:
        return
    import megatron.core  # noqa: F401
    import megatron.core.extensions.transformer_engine as mte
    import megatron.core.models.gpt  # noqa: F401
    import peft.tuners.lora  # noqa: F401  (peft's TE check must see "not installed")
    for name in ('TEGroupedLinear', 'TELinear'):  # None without TE; mcore-bridge patches methods onto them
        if getattr(mte, name, None) is None:
            setattr(mte, name, type(name, (), {}))

    class _Stub(types.ModuleType):

        def __getattr__(self, item):
            if item.startswith('__'):
                raise AttributeError(item)
            value = type(item, (), {'__init__': lambda self, *a, **k: None})
            setattr(self, item, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):

        def find_spec(self, fullname, path=None, target=None):
            if fullname == 'transformer_engine' or fullname.startswith('transformer_engine.'):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _Stub(spec.name)
            module.__path__ = []
            module.__version__ = '0.0.0+stand-in'
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


def _parser(kind: str = 'sft'):
    _install_transformer_engine_stand_in()
    from swift.megatron.arguments import MegatronExportArguments, MegatronSftArguments
    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser
    cls = MegatronSftArguments if kind == 'sft' else MegatronExportArguments
    with _patch_get_type_hints():  # what swift.utils.parse_args does before HfArgumentParser
        return HfArgumentParser([cls])


def parse_in_process(argvs: Sequence[Sequence[str]], kind: str = 'sft') -> List[Dict[str, Any]]:
    """Parse each argv (the part after `megatron sft`) with Megatron-SWIFT's parser. Returns, per argv,
    {'unknown': [...], 'values': {dest: parsed value for every flag given}}. Call in a subprocess (it installs
    the transformer_engine stand-in into this interpreter)."""
    parser = _parser(kind)
    results = []
    for argv in argvs:
        namespace, unknown = parser.parse_known_args(list(argv))
        given = {a[2:].split('=', 1)[0] for a in argv if a.startswith('--')}
        values = {k: v for k, v in vars(namespace).items() if k in given}
        named = list(values.get('callbacks') or [])
        known = _megatron_callback_names(values.get('custom_register_path') or []) if named else set()
        results.append({'unknown': unknown, 'unknown_callbacks': [c for c in named if c not in known],
                        'values': json.loads(json.dumps(values, default=str))})
    return results


def _megatron_callback_names(plugins: Sequence[str]) -> set:
    """The names `megatron_callbacks_map` holds once `plugins` are imported as `--custom_register_path` does (after
    swift.megatron, which `megatron sft` imports first)."""
    import swift.megatron  # noqa: F401
    from swift.megatron.callbacks import megatron_callbacks_map
    from swift.utils import import_external_file
    for plugin in plugins:
        import_external_file(plugin)
    return set(megatron_callbacks_map)


def validate_argv(argvs: Sequence[Sequence[str]], kind: str = 'sft', python: Optional[str] = None,
                  timeout: float = 300) -> List[Dict[str, Any]]:
    """Parse argvs with MegatronSftArguments in a fresh interpreter; raises RuntimeError if the parser cannot be
    imported (megatron-core / mcore-bridge missing) and ValueError if an argv has arguments it does not know or names
    a callback no plugin registers in megatron_callbacks_map."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `--custom_register_path swift_vora`: cwd
    proc = subprocess.run([python or sys.executable, os.path.abspath(__file__), '--check-args', kind],
                          input=json.dumps([list(a) for a in argvs]), capture_output=True, text=True, timeout=timeout,
                          cwd=repo)
    if proc.returncode != 0:
        raise RuntimeError(f'Megatron-SWIFT argument check failed to run (rc {proc.returncode}):\n'
                           f'{proc.stderr[-3000:]}')
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for argv, result in zip(argvs, results):
        if result['unknown']:
            raise ValueError(f'MegatronSftArguments does not know {result["unknown"]} (argv: {" ".join(argv)})')
        if result.get('unknown_callbacks'):
            raise ValueError(f'megatron_callbacks_map has no {result["unknown_callbacks"]} after importing the '
                             f'--custom_register_path plugins (argv: {" ".join(argv)})')
    return results


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ['--check-args']:
        print('usage: python tests/megatron_args.py --check-args [sft|export] < argvs.json', file=sys.stderr)
        return 2
    kind = argv[1] if len(argv) > 1 else 'sft'
    argvs = json.loads(sys.stdin.read())
    results = parse_in_process(argvs, kind)
    sys.stdout.write('\n' + json.dumps(results) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
