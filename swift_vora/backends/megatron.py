"""MoE on several GPUs: Megatron-SWIFT expert-parallel LoRA (`megatron sft --tuner_type lora`).

What the generated command does (ms-swift 4.6.0, swift/megatron/arguments/megatron_args.py):
- `--expert_model_parallel_size EP`: each GPU holds num_experts / EP experts; the dense parts are replicated
  (or split by `--tensor_model_parallel_size`).
- `--target_modules all-linear`: swift/megatron/utils/utils.py `find_all_linears` takes TELinear,
  TELayerNormColumnParallelLinear and **TEGroupedLinear** (the grouped expert layers) inside the language model;
  the router (TopKRouter) is only added by `all-router`, which we never pass. The vision tower stays frozen.
- `--moe_grouped_gemm true` (one grouped GEMM per expert group), `--moe_permute_fusion true` (fused token
  permutation), `--recompute_granularity full --recompute_method uniform --recompute_num_layers 1` (the plan's
  memory model assumes full recompute).
- LoRA is saved merged into HF safetensors at `OUTPUT/checkpoint-N-merged` (`--merge_lora true`, the default
  with `--save_safetensors true`): that directory is what vLLM loads. Do not merge Megatron MoE LoRA with
  `swift export`.

Megatron needs transformer_engine (CUDA), which is not installable on the CPU machine or the lent GPU machine.
The generated argv is validated against Megatron-SWIFT's own argument class instead: `validate_argv` parses it
with `HfArgumentParser(MegatronSftArguments)` (the parser `megatron sft` itself uses, swift.utils.parse_args),
without constructing the dataclass (its __post_init__ initialises torch.distributed and loads the model). That
needs `megatron-core` and `mcore-bridge` importable; mcore-bridge imports transformer_engine at import time, so
the check runs in a subprocess with a stand-in module for transformer_engine (`python -m
swift_vora.backends.megatron --check-args`).
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .launch import (Launch, LaunchUsageError, PlanView, bool_arg, common_env, console_script, lora_args, read_config,
                     swift_common_args)
from .recipe import Recipe


def _num_experts(model_path: str) -> int:
    cfg = read_config(model_path)
    for c in (cfg.get('text_config') or {}, cfg):
        for key in ('num_experts', 'n_routed_experts', 'num_local_experts'):
            if c.get(key):
                return int(c[key])
    return 0


def parallel_sizes(view: PlanView, recipe: Recipe) -> Dict[str, int]:
    ep = int(recipe['megatron.ep'] or view.ep or view.world)
    tp = int(recipe['megatron.tp'] or view.tp or 1)
    pp = int(recipe['megatron.pp'])
    world = view.world
    if world % (tp * pp):
        raise LaunchUsageError(f'megatron: {world} GPUs are not divisible by tp {tp} x pp {pp}')
    if (world // pp) % ep:
        raise LaunchUsageError(f'megatron: expert parallel size {ep} must divide the {world // pp} GPUs of a pipeline '
                               'stage')
    experts = _num_experts(recipe['model.path'])
    if experts and experts % ep:
        raise LaunchUsageError(f'megatron: {experts} experts cannot be split over expert parallel size {ep}')
    return {'ep': ep, 'tp': tp, 'pp': pp}


def megatron_sft_args(view: PlanView, recipe: Recipe) -> List[str]:
    """Arguments after `megatron sft` (validated by tests against MegatronSftArguments)."""
    if recipe['train.dtype'] != 'bfloat16':
        raise LaunchUsageError('megatron_ep_lora trains in bfloat16 (train.dtype=bfloat16)')
    sizes = parallel_sizes(view, recipe)
    targets = recipe['train.target_modules']
    targets = [targets] if isinstance(targets, str) else list(targets)
    if 'all-router' in targets or any('router' in t for t in targets):
        raise LaunchUsageError('train.target_modules: the MoE router is never trained (no all-router)')
    dp = view.world // (sizes['tp'] * sizes['pp'])
    global_batch = recipe['megatron.global_batch']
    if global_batch % (view.micro_batch * dp):
        raise LaunchUsageError(f'megatron.global_batch {global_batch} must be a multiple of micro_batch '
                               f'{view.micro_batch} x data-parallel size {dp}')
    argv = [*swift_common_args(recipe, view), *lora_args(recipe)]
    argv += ['--expert_model_parallel_size', str(sizes['ep']), '--tensor_model_parallel_size', str(sizes['tp']),
             '--pipeline_model_parallel_size', str(sizes['pp'])]
    if sizes['tp'] > 1:
        argv += ['--sequence_parallel', 'true']
    argv += ['--moe_grouped_gemm', bool_arg(recipe['megatron.moe_grouped_gemm']), '--moe_permute_fusion',
             bool_arg(recipe['megatron.moe_permute_fusion'])]
    recompute = recipe['megatron.recompute'] if recipe['train.gradient_checkpointing'] else 'none'
    argv += ['--recompute_granularity', recompute]
    if recompute == 'full':
        argv += ['--recompute_method', 'uniform', '--recompute_num_layers', str(recipe['megatron.recompute_num_layers'])]
    argv += ['--micro_batch_size', str(view.micro_batch), '--global_batch_size', str(global_batch),
             '--freeze_llm', 'false', '--freeze_vit', bool_arg(recipe['train.freeze_vit']), '--freeze_aligner', 'true',
             '--bf16', 'true', '--attention_backend', recipe['megatron.attention_backend'],
             '--lr', f'{recipe["train.lr"]:g}', '--min_lr', f'{recipe["train.lr"] / 10:g}',
             '--lr_warmup_fraction', f'{recipe["train.warmup_ratio"]:g}']
    if recipe['train.max_steps'] is not None:
        argv += ['--train_iters', str(recipe['train.max_steps'])]
    else:
        argv += ['--num_train_epochs', str(max(1, int(round(recipe['train.epochs']))))]
    argv += ['--save_steps', str(recipe['train.save_steps']), '--logging_steps', str(recipe['train.logging_steps']),
             '--output_dir', recipe['train.output_dir'], '--add_version', bool_arg(recipe['train.add_version']),
             '--no_save_optim', 'true', '--no_save_rng', 'true', '--save_safetensors', 'true', '--merge_lora',
             bool_arg(recipe['megatron.merge_lora']), '--dataloader_num_workers',
             str(recipe['train.dataloader_workers']), '--seed', str(recipe['train.seed'])]
    if recipe['guards.callbacks']:
        argv += ['--callbacks', *recipe['guards.callbacks']]
    return argv + recipe['extra_args']


def build_megatron_launch(view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
    if recipe['train.tuner'] != 'lora':
        raise LaunchUsageError('megatron_ep_lora trains LoRA (train.tuner=lora)')
    env = common_env(recipe, view, environ)
    env['CUDA_DEVICE_MAX_CONNECTIONS'] = '1'  # what swift/cli/_megatron/sft.py sets by default
    argv = [console_script('megatron'), 'sft', *megatron_sft_args(view, recipe)]
    notes = ['needs megatron-core, mcore-bridge and transformer_engine on the GPU machine (pip install '
             '"swift-vora[megatron]" transformer_engine[pytorch])',
             f'merged HF weights for vLLM: {recipe["train.output_dir"]}/[vN-.../]checkpoint-N-merged']
    return Launch(argv=argv, env=env, notes=notes)


# ---------------------------------------------------------------------------------------------------------------
# Validation against Megatron-SWIFT's argument class (parse only)
# ---------------------------------------------------------------------------------------------------------------
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
    import peft.tuners.lora  # noqa: F401  (peft's TE check must see "not installed")
    import megatron.core  # noqa: F401
    import megatron.core.extensions.transformer_engine as mte
    import megatron.core.models.gpt  # noqa: F401
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
        results.append({'unknown': unknown, 'values': json.loads(json.dumps(values, default=str))})
    return results


def validate_argv(argvs: Sequence[Sequence[str]], kind: str = 'sft', python: Optional[str] = None,
                  timeout: float = 300) -> List[Dict[str, Any]]:
    """Parse argvs with MegatronSftArguments in a fresh interpreter; raises RuntimeError if the parser cannot be
    imported (megatron-core / mcore-bridge missing) and ValueError if an argv has arguments it does not know."""
    proc = subprocess.run([python or sys.executable, '-m', 'swift_vora.backends.megatron', '--check-args', kind],
                          input=json.dumps([list(a) for a in argvs]), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f'Megatron-SWIFT argument check failed to run (rc {proc.returncode}):\n{proc.stderr[-3000:]}')
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for argv, result in zip(argvs, results):
        if result['unknown']:
            raise ValueError(f'MegatronSftArguments does not know {result["unknown"]} (argv: {" ".join(argv)})')
    return results


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ['--check-args']:
        print('usage: python -m swift_vora.backends.megatron --check-args [sft|export] < argvs.json', file=sys.stderr)
        return 2
    kind = argv[1] if len(argv) > 1 else 'sft'
    argvs = json.loads(sys.stdin.read())
    results = parse_in_process(argvs, kind)
    sys.stdout.write('\n' + json.dumps(results) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
