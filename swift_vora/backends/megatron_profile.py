"""Where a `megatron sft` step goes: every step's data wait, and one optimizer step under torch.profiler.

Megatron-SWIFT 4.6 has no profiling arguments: its MegatronArguments carry none of Megatron-LM's `--profile`,
`--use_pytorch_profiler`, `--profile_step_start/end` or `--profile_ranks` (ms-swift runs its own training loop,
swift/megatron/trainers/base.py, and megatron-core 0.16 ships no training loop to hold them). So this is a
Megatron-SWIFT callback, `vora_step_profile`, which the launch names in `--callbacks` when the training process's
environment sets SWIFT_VORA_PROFILE_STEP (backends/megatron.py):

- every step (any value, 0 included): the seconds the training loop spent in the data iterator's `next()` -- the
  DataLoader handing over a micro-batch; the GPU has nothing to do while its workers are behind -- one row per step
  in `data_wait.rank{R}.jsonl` next to the run's logging.jsonl (iteration, data_wait_s, micro-batches fetched, the
  step's host seconds). It wraps the iterator this trainer hands to each train_step (`_replace_data_iterator`,
  an identity hook of Megatron-SWIFT's SFT trainer; patches.py `megatron_data_wait`), nothing else.
- SWIFT_VORA_PROFILE_STEP=N > 0: optimizer step N (1-based) on rank 0 under torch.profiler (CPU + CUDA, without
  Python stacks or shapes: an 8-layer MoE step launches ~10^5 kernels), through backends/step_profile.py as the
  Unsloth runner's -- torch_profile.txt / .json -- with the chrome trace kept (torch_trace.json.gz). For that step
  only, `record_function` regions mark the model's parts (REGIONS: the vision tower, Gated DeltaNet, attention, the
  MoE layer's router, experts and shared expert, the LoRA adapters, the LM head) through forward hooks, the
  data iterator (`vora/data`) and the optimizer's step (`vora/optimizer`, patches.py `megatron_profile_optimizer`),
  and are removed after it. A recomputed layer's forward fires its hooks again inside the backward; the backward's
  own kernels are placed through the autograd node that launched them (benchmarks/megatron_step_profile.py, which
  attributes the step: data wait, vision tower, Gated DeltaNet, attention, expert GEMMs and their LoRA, permutation,
  recompute, optimizer, host idle).
Profile a step after the measured ones: the profiler and the hooks slow it down.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .. import patches, switches
from .megatron_callback import MegatronTrainerCallback

ENV = 'SWIFT_VORA_PROFILE_STEP'
CALLBACK = 'vora_step_profile'  # its name in Megatron-SWIFT's megatron_callbacks_map (swift_registry.py)
DATA_WAIT_FILE = 'data_wait.rank{rank}.jsonl'
REGION_PREFIX = 'vora/'
DATA_REGION = 'vora/data'
OPTIMIZER_REGION = 'vora/optimizer'
logger = logging.getLogger('swift')

# record_function label -> the module class names (suffixes) that open it, first match wins: TEGroupedMLP and
# SharedExpertMLP end with "MLP" too, so they come before the dense MLP. Classes of megatron-core 0.16.1
# (transformer/attention.py SelfAttention, transformer/moe/*.py, transformer/mlp.py MLP, transformer_block.py,
# models/common/embeddings), mcore-bridge 1.6.5 (mm_gpts/qwen3_5.py Qwen3_5MoeGatedDeltaNet; megatron-core's
# ssm/gated_delta_net.py GatedDeltaNet) and transformers' vision towers (Qwen3_5MoeVisionModel, Qwen3VLVisionModel).
REGIONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('vora/vision_tower', ('VisionModel', )),
    ('vora/gated_deltanet', ('GatedDeltaNet', )),
    ('vora/core_attention', ('DotProductAttention', )),
    ('vora/attention', ('SelfAttention', )),
    ('vora/router', ('TopKRouter', )),
    ('vora/experts', ('GroupedMLP', 'SequentialMLP')),
    ('vora/shared_expert', ('SharedExpertMLP', )),
    ('vora/moe_layer', ('MoELayer', )),
    ('vora/mlp', ('MLP', )),
    ('vora/decoder', ('TransformerBlock', )),
    ('vora/embedding', ('LanguageModelEmbedding', )),
)
# label -> module-name suffixes: mcore-bridge's LoRA factors (LoraParallelLinear's lora_A / lora_B ModuleDicts,
# tuners/lora.py) and the LM head (GPTModel.output_layer)
NAMED_REGIONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('vora/lora', ('.lora_A.default', '.lora_B.default')),
    ('vora/output_layer', ('output_layer', )),
)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the training process's environment asks for this callback (SWIFT_VORA_PROFILE_STEP set, 0 included;
    a value the switch refuses raises SwitchError here, before the launch)."""
    return switches.given(ENV, environ) and switches.read(ENV, environ) is not None


def region_of(module_name: str, class_name: str) -> Optional[str]:
    """The region label a module opens, None for the modules that open none."""
    for label, suffixes in NAMED_REGIONS:
        if module_name.endswith(suffixes):
            return label
    for label, suffixes in REGIONS:
        if class_name.endswith(suffixes):
            return label
    return None


class DataWaitClock:
    """Seconds spent in `next()` of the iterators it wraps, since the last `take()`."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.mark: Optional[Callable[[], Any]] = None  # record_function factory while a step is profiled

    def wrap(self, iterator):
        if isinstance(iterator, list):  # virtual pipeline stages: one iterator each
            return [self.wrap(it) for it in iterator]
        return iterator if iterator is None or isinstance(iterator, TimedIterator) else TimedIterator(iterator, self)

    def take(self) -> Tuple[float, int]:
        out = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out


class TimedIterator:
    """An iterator whose `next()` time goes to a DataWaitClock (and, in a profiled step, into a `vora/data` range)."""

    def __init__(self, iterator, clock: DataWaitClock):
        self.iterator = iterator
        self.clock = clock

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        mark = self.clock.mark() if self.clock.mark is not None else None
        if mark is not None:
            mark.__enter__()
        try:
            return next(self.iterator)
        finally:
            if mark is not None:
                mark.__exit__(None, None, None)
            self.clock.seconds += time.perf_counter() - t0
            self.clock.calls += 1


class Regions:
    """`record_function` ranges around the model's parts (REGIONS) and the optimizer's step, for one profiled step;
    `remove()` takes every hook and wrapper away again."""

    def __init__(self, chunks, optimizer=None):
        import torch
        self._rf = torch.autograd.profiler.record_function
        self._open: Dict[Tuple[int, int], List[Any]] = {}
        self.handles: List[Any] = []
        self.labels: Dict[str, int] = {}
        for chunk in chunks:
            for name, module in chunk.named_modules():
                label = region_of(name, type(module).__name__)
                if label is not None:
                    self._hook(module, label)
                    self.labels[label] = self.labels.get(label, 0) + 1
        self.optimizer, self._own_step = None, None
        if optimizer is not None and patches.applicable('megatron_profile_optimizer'):
            # the instance's own `step` if it had one (put back after), else the class's (the attribute removed)
            self.optimizer, self._own_step = optimizer, optimizer.__dict__.get('step')
            rf, step = self._rf, optimizer.step

            def profiled_step(*args, **kwargs):
                with rf(OPTIMIZER_REGION):
                    return step(*args, **kwargs)

            optimizer.step = patches.mark(profiled_step, 'megatron_profile_optimizer', step)

    def _hook(self, module, label: str) -> None:
        rf, opened = self._rf, self._open

        def pre(mod, args):
            mark = rf(label)
            mark.__enter__()
            opened.setdefault((id(mod), threading.get_ident()), []).append(mark)

        def post(mod, args, output):
            stack = opened.get((id(mod), threading.get_ident()))
            if stack:
                stack.pop().__exit__(None, None, None)

        self.handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for stack in self._open.values():  # a forward that raised between its hooks
            while stack:
                stack.pop().__exit__(None, None, None)
        if self.optimizer is not None:
            if self._own_step is None:
                del self.optimizer.step
            else:
                self.optimizer.step = self._own_step
            self.optimizer = None


class MegatronStepProfile(MegatronTrainerCallback):
    """The `vora_step_profile` callback (Megatron-SWIFT's callback events; the others are the base's
    no-ops). Reads `trainer.args.output_dir`, `trainer.state.iteration`,
    `trainer.unwrapped_models` and `trainer.optimizer`."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.target = switches.read(ENV) or 0
        self.clock = DataWaitClock()
        self.rank = _rank()
        self.path = os.path.join(self.output_dir(), DATA_WAIT_FILE.format(rank=self.rank))
        self.t0: Optional[float] = None
        self.regions: Optional[Regions] = None
        self.profiler = None
        self.context = None
        self.wrapped = False

    def output_dir(self) -> str:
        return getattr(self.trainer.args, 'output_dir', None) or '.'

    def iteration(self) -> int:
        return int(self.trainer.state.iteration)

    # the data iterator ----------------------------------------------------------------------------------------
    def on_train_begin(self):
        trainer = self.trainer
        replace = getattr(trainer, '_replace_data_iterator', None)
        if replace is None or not patches.applicable('megatron_data_wait'):
            logger.warning('swift-vora step profile: the trainer has no _replace_data_iterator hook here; no data '
                           'wait is recorded')
            return
        clock = self.clock

        def timed(data_iterator):
            return clock.wrap(replace(data_iterator))

        trainer._replace_data_iterator = patches.mark(timed, 'megatron_data_wait', replace)
        self.wrapped = True
        logger.info(f'swift-vora step profile: data wait of every step -> {self.path}'
                    + (f'; optimizer step {self.target} profiled on rank 0' if self.target else ''))

    def on_step_begin(self):
        self.clock.take()
        if self.target and self.iteration() + 1 == self.target and self.rank == 0:
            self._start()
        self.t0 = time.perf_counter()

    def on_step_end(self):
        host_s = time.perf_counter() - self.t0 if self.t0 is not None else None
        if self.context is not None:
            self._stop()
        wait_s, calls = self.clock.take()
        if self.wrapped:
            row = {'iteration': self.iteration(), 'data_wait_s': round(wait_s, 6), 'next_calls': calls,
                   'step_host_s': round(host_s, 6) if host_s is not None else None,
                   'profiled': self.iteration() == self.target}
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, 'a', encoding='utf-8') as f:
                f.write(json.dumps(row) + '\n')

    def on_train_end(self):
        if self.context is not None:  # training ended inside the profiled step
            self._stop()

    # the profiled step ----------------------------------------------------------------------------------------
    def _start(self) -> None:
        import torch

        from .step_profile import StepProfiler
        self.regions = Regions(list(getattr(self.trainer, 'unwrapped_models', None) or []),
                               getattr(self.trainer, 'optimizer', None))
        self.clock.mark = lambda: torch.autograd.profiler.record_function(DATA_REGION)
        self.profiler = StepProfiler(self.output_dir(), step=self.target, stacks=False, trace=True)
        self.context = self.profiler.step(self.target)
        self.context.__enter__()
        logger.info(f'swift-vora step profile: optimizer step {self.target} under torch.profiler; regions '
                    f'{json.dumps(self.regions.labels)}')

    def _stop(self) -> None:
        try:
            self.context.__exit__(None, None, None)
        finally:
            self.context = None
            self.clock.mark = None
            if self.regions is not None:
                self.regions.remove()
                self.regions = None
        logger.info(f'swift-vora step profile: {self.profiler.written} and {self.profiler.trace_written} written')


def _rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def read_data_wait(path: str) -> List[Dict[str, Any]]:
    """The rows of a `data_wait.rank{R}.jsonl` (a benchmark reads them next to logging.jsonl)."""
    rows = []
    with open(path, encoding='utf-8') as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f'{path}:{line_no}: not JSON ({e})') from e
    return rows
