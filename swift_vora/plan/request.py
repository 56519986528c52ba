"""What the planner is asked (`PlanRequest`) and what it answers (`Plan`), the JSON of docs/contract.md."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple, Union

from . import constants as C
from .backend import AUTO, Backend
from .hardware import Hardware
from .memory import BACKENDS, COMPILE_MODES, FP8_MODES, VISION_MODES
from .model_spec import LORA_TARGETS, TUNERS, ModelSpec

BACKEND_CHOICES = (AUTO, ) + BACKENDS
OFFLOADS = ('none', 'cpu')
QUANTS = ('none', '4bit')
CHECKPOINTS = ('auto', 'gpu', 'host')  # unsloth_split_lora's layer checkpoints
CHECKPOINT_LAYERS_AUTO = AUTO  # checkpoint_layers: the plan picks the fewest checkpointed layers that fit
VERDICTS = ('fits', 'does_not_fit', 'refused')
# What the search may choose where the user did not (plan/search.py): the samples per GPU per step, how many decoder
# layers are checkpointed, DeepSpeed's CPU offload, and the video budget (lowered only where it does not fit)
SEARCHABLE = ('micro_batch', 'checkpoint_layers', 'offload', 'video_budget')
EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 3, 4


@dataclass
class PlanRequest:
    """Everything `plan` (and `train`) needs to decide; all fields have the CLI's defaults."""
    model: str  # model directory or config.json; only config.json is read
    hardware: Union[str, Hardware, None] = None  # profile name (3060x4, 3090x3, h200x1, h200x8), 'local', Hardware
    tuner: str = 'lora'  # lora | full | selective (attention + shared experts)
    backend: str = AUTO  # auto, or the name of a Backend (ddp, deepspeed_zero3, megatron_ep_lora, ...)
    offload: str = 'none'  # none | cpu (DeepSpeed offload_optimizer / offload_param)
    quant: str = 'none'  # none | 4bit (QLoRA: bitsandbytes NF4 base)
    ep: Optional[int] = None  # expert parallel size (Megatron); None = chosen
    tp: Optional[int] = None  # tensor parallel size (Megatron); None = 1
    micro_batch: int = 1
    pack_length: Optional[int] = None  # dataset packing (swift sft --packing): rows filled up to this many tokens
    # the template's cap on one sample (--max_length): a longer sample loses frames until it fits (template.py)
    max_length: Optional[int] = None
    seq_len: Optional[int] = None  # tokens per sample; when given, the sample is treated as text only
    fps: float = C.DEFAULT_FPS  # video budget (ignored when seq_len is given)
    max_frames: int = C.DEFAULT_MAX_FRAMES
    min_frames: int = C.DEFAULT_MIN_FRAMES  # the template samples at least this many frames (video.min_frames)
    # the lowest tokens per frame pair the template may shrink a pair to (video.min_pair_tokens): with min_frames, the
    # floor the search lowers the video budget to
    min_pair_tokens: int = C.DEFAULT_MIN_PAIR_TOKENS
    frame_tokens: int = C.DEFAULT_FRAME_TOKENS  # LLM tokens per frame pair (video.pair_tokens)
    clip_seconds: float = C.DEFAULT_CLIP_SECONDS
    text_tokens: int = C.DEFAULT_PROMPT_TOKENS + C.DEFAULT_ANSWER_TOKENS  # prompt + answer around the video
    supervised_tokens: int = C.DEFAULT_ANSWER_TOKENS  # answer tokens (positions with labels)
    lora_rank: int = C.DEFAULT_LORA_RANK
    lora_targets: str = 'all-linear'  # all-linear | all-linear-except-experts | attention
    nodes: int = 1
    gradient_checkpointing: bool = True
    # with gradient checkpointing: the first N decoder layers checkpointed, the others keep their activations
    # (recipe train.checkpoint_layers); None: every layer; 'auto': the fewest whose plan fits (plan/fit.py)
    checkpoint_layers: Optional[Union[int, str]] = None
    # unsloth_split_lora's layer checkpoints: auto (on the GPU when the plan fits so, else host RAM) | gpu | host
    checkpoints: str = 'auto'
    samples_per_epoch: Optional[int] = None  # windowed samples of the dataset (train counts them): hours per epoch
    compile: str = 'off'  # off | layers (recipe train.compile: the decoder layers under torch.compile)
    fp8: str = 'off'  # off | frozen_base (recipe train.fp8: the decoder's frozen base linears in FP8)
    vision_mode: str = C.VISION_MODE_DEFAULT  # no_grad (measured default) | checkpointed_requires_grad
    # megatron_ep_lora's loss (recipe megatron.cross_entropy_fusion_impl): native (ms-swift's default) | te
    cross_entropy: str = C.MEGATRON_CROSS_ENTROPY_DEFAULT
    # megatron_ep_lora's recompute (recipe megatron.recompute): full | selective | none (constants.py)
    recompute: str = 'full'
    # Megatron's samples per optimizer step over all GPUs (recipe megatron.global_batch): a micro-batch the search
    # chooses for a Megatron backend divides it by the data-parallel size
    global_batch: Optional[int] = None
    # The settings the planner may choose itself (plan/search.py SEARCHABLE: micro_batch, checkpoint_layers, offload,
    # video_budget): what the user did not set. Empty: plan exactly what is asked (the Python API's default).
    # backend=auto is searched whatever this says.
    search: Tuple[str, ...] = ()

    def validate(self) -> None:
        checks = [('tuner', self.tuner, TUNERS), ('backend', self.backend, BACKEND_CHOICES),
                  ('offload', self.offload, OFFLOADS), ('quant', self.quant, QUANTS),
                  ('lora_targets', self.lora_targets, LORA_TARGETS), ('vision_mode', self.vision_mode, VISION_MODES),
                  ('compile', self.compile, COMPILE_MODES), ('checkpoints', self.checkpoints, CHECKPOINTS),
                  ('fp8', self.fp8, FP8_MODES),
                  ('cross_entropy', self.cross_entropy, C.MEGATRON_CROSS_ENTROPY),
                  ('recompute', self.recompute, C.MEGATRON_RECOMPUTE)]
        for name, val, allowed in checks:
            if val not in allowed:
                raise ValueError(f'{name} must be one of {", ".join(allowed)} (got {val!r})')
        for name in ('micro_batch', 'lora_rank', 'nodes', 'max_frames', 'min_frames', 'frame_tokens'):
            if int(getattr(self, name)) < 1:
                raise ValueError(f'{name} must be >= 1')
        for name in ('ep', 'tp', 'seq_len', 'pack_length'):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f'{name} must be >= 1')
        if self.fps <= 0 or self.clip_seconds <= 0:
            raise ValueError('fps and clip_seconds must be positive')
        unknown = [name for name in self.search if name not in SEARCHABLE]
        if unknown:
            raise ValueError(f'search: {", ".join(unknown)} cannot be searched (searchable: {", ".join(SEARCHABLE)})')
        k = self.checkpoint_layers
        if k is not None and k != CHECKPOINT_LAYERS_AUTO and (isinstance(k, (bool, str)) or int(k) < 0):
            raise ValueError(f'checkpoint_layers must be a number of layers >= 0 or {CHECKPOINT_LAYERS_AUTO} '
                             f'(got {k!r})')


@dataclass
class Plan:
    """A planning decision. The first seven fields are the JSON keys of docs/contract.md."""
    backend: Backend
    verdict: str  # fits | does_not_fit | refused
    gpu_peak_gib: Optional[float]  # per GPU, the largest phase (None when refused)
    host_peak_gib: Optional[float]  # per node
    reasons: List[str]
    breakdown: Dict[str, float]  # per-GPU items at the peak, GiB
    command: List[str]  # argv `train` would run: the launch's, filled by swift_vora/cli/compose.py ([] when refused)
    host_breakdown: Dict[str, float] = field(default_factory=dict)  # per-node host items, GiB
    phases: Dict[str, Dict[str, float]] = field(default_factory=dict)  # load / first_step / steady -> gpu/host GiB
    gpu_capacity_gib: Optional[float] = None
    host_limit_gib: Optional[float] = None
    host_limit_source: str = ''
    num_gpus: int = 0  # per node
    nodes: int = 1
    tuner: str = 'lora'
    offload: str = 'none'
    quant: str = 'none'
    ep: int = 1
    tp: int = 1
    micro_batch: int = 1
    lora_rank: int = C.DEFAULT_LORA_RANK
    lora_targets: str = 'all-linear'
    trainable_params: Optional[int] = None
    tokens: Dict[str, Any] = field(default_factory=dict)
    model: Dict[str, Any] = field(default_factory=dict)  # ModelSpec.summary()
    hardware: Dict[str, Any] = field(default_factory=dict)
    rule: Optional[str] = None  # refusal rule id
    alternative: Optional[Dict[str, Any]] = None  # cheapest alternative that fits (does_not_fit / refused)
    alternatives: List[Dict[str, Any]] = field(default_factory=list)
    assumptions: List[str] = field(default_factory=list)
    config_source: Dict[str, Any] = field(default_factory=dict)  # where config.json came from (model_source)
    checkpoints: Optional[str] = None  # unsloth_split_lora: where the layer checkpoints live, 'gpu' | 'host'
    # with gradient checkpointing: the first N decoder layers checkpointed (the request's number, or the plan's pick
    # for 'auto'); None: every layer
    checkpoint_layers: Optional[int] = None
    fp8: str = 'off'  # off | frozen_base: the decoder's frozen base linears computed and held in FP8
    # speed (plan/speed.py): from the model's FLOPs and an efficiency measured on an H200; est_source says which
    est_tokens_per_s: Optional[float] = None
    est_samples_per_s: Optional[float] = None
    est_samples_per_epoch: Optional[int] = None
    est_hours_per_epoch: Optional[float] = None  # None without a dataset to count
    est_source: str = ''  # every factor of the estimate and where it comes from (the text shows it with --explain)
    est_basis: str = ''  # what the estimate rests on, in a user's words: "measured: ..." or "no measurement: ..."
    est_measured: bool = False  # False: no run of this backend on this kind of model; no number is given
    # The settings that fit, fewest estimated hours first, the plan's own first (`chosen`): backend, micro-batch,
    # checkpointed layers, offload, video budget, GPU peak, tokens/s, hours and what each estimate rests on
    options: List[Dict[str, Any]] = field(default_factory=list)
    # What the search chose and what it kept as the user set it (plan/search.py): {'searched': [...], 'kept': [...],
    # 'chosen': {setting: value}, 'budget_lowered': bool, 'candidates': N}
    search: Dict[str, Any] = field(default_factory=dict)
    # Where the numbers come from: the derivations and measurements behind the reasons (`plan --explain`, and here)
    explain: List[str] = field(default_factory=list)
    predicted: bool = True  # every number here is a prediction (constants.py), not a measurement
    # The model as the planner read it, for the launch: config.json is read once (not in the JSON: `model` is its
    # summary there)
    spec: Optional[ModelSpec] = field(default=None, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        return {'fits': EXIT_FITS, 'does_not_fit': EXIT_DOES_NOT_FIT, 'refused': EXIT_REFUSED}[self.verdict]

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(replace(self, spec=None))
        del out['spec']
        return out


def alternative_plan(plan: Plan, alternative: Dict[str, Any]) -> Plan:
    """One of `plan.alternatives` as a plan of its own (it fits), for the launch that would train it."""
    a = alternative
    return Plan(backend=Backend(a['backend']), verdict='fits', gpu_peak_gib=a['gpu_peak_gib'],
                host_peak_gib=a['host_peak_gib'], reasons=[], breakdown={}, command=[], num_gpus=a['num_gpus'],
                nodes=a['nodes'], tuner=a['tuner'], offload=a['offload'], quant=a['quant'], ep=a['ep'], tp=a['tp'],
                micro_batch=a['micro_batch'], lora_rank=plan.lora_rank, tokens=plan.tokens, model=plan.model,
                gpu_capacity_gib=a['gpu_mem_gib'], spec=plan.spec, checkpoints=a.get('checkpoints'),
                checkpoint_layers=a.get('checkpoint_layers'),
                fp8=a.get('fp8', 'off'))
