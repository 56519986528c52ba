"""Every constant the planner's memory model uses, in one place, with where it comes from.

They feed **predictions**; docs/memory-model.md compares them with measured peaks. `benchmarks/calibrate_memory.py`
records torch.cuda.max_memory_allocated/reserved per phase next to the planner's prediction; fit the constants marked
[fit] to those measurements and note the measurement file next to the value when you change one.

Units: bytes per element / per parameter unless the name says GiB.
"""
from ..budget import VideoBudget as _VideoBudget
from ..data.windowing import WindowConfig as _WindowConfig

GiB = 1024 ** 3  # what torch reports (total_memory, max_memory_allocated)
GB = 1000 ** 3  # what vendors sell ("141 GB HBM3e", "276 GB" of RAM)

# ------------------------------------------------------------------------------------------------------------
# Model states (mixed-precision AdamW). Source: ZeRO paper (Rajbhandari et al. 2020); the arithmetic is in
# docs/memory-model.md and docs/planner.md.
# ------------------------------------------------------------------------------------------------------------
BYTES_BF16 = 2  # bf16 weights / activations
BYTES_FP32 = 4  # fp32 tensors
BYTES_GRAD_BF16 = 2  # DeepSpeed bf16: gradients in bf16 before the fp32 optimizer partition
BYTES_MASTER_FP32 = 4  # fp32 master copy (DeepSpeed bf16 optimizer / ZeRO, Megatron distributed optimizer)
BYTES_ADAM = 8  # Adam m and v in fp32
BYTES_OPTIM_STATES = BYTES_MASTER_FP32 + BYTES_ADAM  # 12: what ZeRO-Offload moves to host RAM
BYTES_MODEL_STATES = BYTES_BF16 + BYTES_GRAD_BF16 + BYTES_OPTIM_STATES  # 16 per trainable parameter
# Without DeepSpeed, swift loads the model in bf16 and HF Trainer + torch AdamW keep m and v in the parameter's
# dtype: pure-bf16 training, 2 (weight) + 2 (grad) + 4 (m, v) bytes per trainable parameter, no fp32 master.
BYTES_PURE_BF16_ADAM = 4  # m + v in bf16
# PEFT casts LoRA adapters to fp32 (LoraConfig/get_peft_model autocast_adapter_dtype=True): 4 weight + 4 grad +
# 8 Adam = 16 per LoRA parameter, again with no separate master copy.
BYTES_LORA_PARAM_PEFT = 4
# Megatron (bf16, accumulate_allreduce_grads_in_fp32 default): bf16 weight 2 + fp32 main grad 4, and with the
# distributed optimizer fp32 master + Adam (12) sharded over data-parallel ranks: 6 + 12/dp.
BYTES_MEGATRON_PARAM_AND_GRAD = 6
# bitsandbytes NF4 with double quantization: 4 bits + 8-bit absmax per 64-block + fp32 second-level constants
# (QLoRA paper: ~0.127 bits of constants per parameter). Applies to the LLM's linear weights only.
BYTES_NF4 = 0.5 + 0.127 / 8
# train.fp8=frozen_base: e4m3 weights with one fp32 scale per tensor (swift_vora/speed/fp8_frozen.py) [derived]
BYTES_FP8 = 1

# ------------------------------------------------------------------------------------------------------------
# DeepSpeed (swift/config/zero2.json, zero3.json, *_offload.json of ms-swift 4.6.0)
# ------------------------------------------------------------------------------------------------------------
ZERO2_BUCKET_ELEMENTS = 2e8  # reduce_bucket_size / allgather_bucket_size in swift's zero2 presets
ZERO2_BUCKET_COPIES = 2  # ipg buffer + the bucket being reduced [fit]
ZERO3_MAX_LIVE_PARAMS = 1e9  # stage3_max_live_parameters in swift's zero3 presets
ZERO3_SMALL_GPU_GIB = 16.0  # at or below: swift_vora.backends.deepspeed generates the 12 GB field configuration,
ZERO3_MAX_LIVE_PARAMS_SMALL_GPU = 1e8  # whose stage3_max_live_parameters (and max_reuse_distance) is 1e8
# ZeRO-3 gathers each module's full bf16 weights before use and releases them after (prefetch is by
# stage3_prefetch_bucket_size, which "auto" makes 0.9 x hidden^2 elements -- small next to the largest tensor):
# peak gathered bytes ~ this factor x the largest tensor (the embedding / tied lm_head for Qwen3-VL-2B, 311 M).
# 2.0 (a prefetched copy of an equally large tensor) over-predicted the one-GPU ZeRO-3 run by 0.5 GiB
# (docs/memory-model.md, row 8); 1.0 is the gather alone. [fit]
# On more than one GPU the gathered copies of other ranks' partitions are also kept for reuse, up to
# stage3_max_live_parameters (DeepSpeed releases a parameter only past stage3_max_reuse_distance): on 2 GPUs
# the 2B LoRA run held 1e9 live parameters + the tied embedding being fetched at its backward peak
# (docs/memory-model.md, row 12). On one GPU the partition is the whole tensor and
# nothing extra is kept (rows 8, 11).
ZERO3_GATHER_FACTOR = 1.0
# Host RAM pinned/bounce buffers on top of the offloaded optimizer state (pinned allocations round up; DeepSpeed's
# estimator pads host memory by additional_buffer_factor=1.5 — we use a smaller, explicit pad) [fit]
OFFLOAD_HOST_OVERHEAD = 0.10

# ------------------------------------------------------------------------------------------------------------
# Activations per decoder layer, bf16 (2 bytes/element), per token. Derived from the HF Qwen3 / Qwen3.5 forward
# (Korthikanti et al. 2022 style accounting, SDPA/flash attention so no s^2 score matrix is kept). [fit] all.
# ------------------------------------------------------------------------------------------------------------
ACT_BYTES_PER_HIDDEN = 12  # residual stream, 2 RMSNorm inputs+outputs, o_proj / mlp outputs (6 tensors x 2 B)
ACT_BYTES_PER_QKV = 4  # q, k, v projection outputs and their rotary copies (2 x 2 B per element)
ACT_BYTES_PER_ATTN_OUT = 4  # attention output (kept for backward) + o_proj input
ACT_BYTES_PER_FFN = 8  # gate, up, act(gate), act(gate)*up (4 x 2 B) for SwiGLU MLPs / experts
ACT_BYTES_PER_ROUTER_LOGIT = 8  # router logits + softmax in fp32
# Gated DeltaNet (bf16): qkv projection + conv output (2 x conv_dim) and z, core output, gated-norm output
# (3 x value_dim) per token -> 4 bytes per conv channel + 6 bytes per value channel
ACT_LINEAR_ATTN_BYTES_PER_CONV = 4  # [fit]
ACT_LINEAR_ATTN_BYTES_PER_VALUE = 6  # [fit]
LINEAR_ATTN_CHUNK = 64  # chunked delta-rule kernel chunk size (fla / transformers torch_chunk_gated_delta_rule)
LINEAR_ATTN_STATE_BYTES = 4  # per-chunk recurrent state kept in fp32 by the chunked kernel
ACT_LORA_BYTES_PER_INPUT = 2  # LoRA keeps a dropout copy of each targeted module's input (swift lora_dropout=0.05)
# PEFT LoRA on fused 3-D experts (target_parameters -> peft ParamWrapper) materialises W + B@A of each targeted
# expert tensor when its module runs (forward and checkpoint recompute). Worst case on paper ~10 bytes per expert
# parameter of a layer (fp32 delta, bf16 delta, merged weight, its grad); measured (benchmarks/calibrate_memory.py,
# Qwen3.5-35B-A3B shape, docs/memory-model.md): about one bf16 copy of the largest expert tensor (gate_up_proj)
# over the attention-only run once the LoRA states are accounted for.
# Unsloth's split LoRA computes (X@A)@B per expert and never builds it; Megatron's grouped LoRA neither. [fit]
PEFT_EXPERT_LORA_TRANSIENT_BYTES = 2  # per parameter of the largest fused expert tensor
# Backward of one layer holds its saved activations and their gradients at the same time [fit]
ACT_BACKWARD_FACTOR = 2.0
# With gradient checkpointing the layer input (bf16 hidden state) is all that is kept per layer.
ACT_CHECKPOINT_BYTES_PER_HIDDEN = 2
# Decoder layers compiled by torch.compile (recipe train.compile=layers, swift_vora/speed/compile_layers.py; swift
# sft backends without DeepSpeed only): inductor fuses the pointwise ops (norms, rotary, SwiGLU, LoRA dropout) and
# its partitioner saves fewer, fused tensors for backward, and the compiled backward frees as it goes. Fitted on
# the H200 runs of 2026-12-01 (benchmarks/results/throughput-r14*-2026-12-01.json, 2B shape, 6.5k tokens per
# sample; docs/memory-model.md rows 13-17): allocated peaks without checkpointing at micro-batch 1 and 4 give the
# saved fraction (0.85 and 0.85 of the eager accounting above), the checkpointed runs at micro-batch 1 and 4 the
# backward factor (saved activations + their gradients, ~1.4x instead of 2x). [fit]
ACT_COMPILED_SAVED_FRACTION = 0.85  # of the eager per-layer accounting above [fit]
# Megatron-SWIFT without recompute (megatron.recompute=none | selective) keeps fewer activations per layer than the
# HF accounting above: Transformer Engine's LayerNormLinear saves one normalised input for q/k/v (and for the
# shared expert's fc1 and the router), the grouped expert GEMMs save the permuted tokens once, and the LoRA inputs
# are those same tensors. Fitted on one run -- #31 call g's mg_norecompute (the 35B-A3B cut to 8 layers, 7,788
# tokens, EP 1: 47.75 GiB reserved against 57.22 planned with the HF accounting; docs/memory-model.md row 46, in
# sample). The layer working set under full recompute keeps the HF accounting: rows 34, 35, 40, 42 check it. [fit]
MEGATRON_ACT_SAVED_FRACTION = 0.51  # of the per-layer accounting above, every layer kept (no recompute) [fit]
ACT_BACKWARD_FACTOR_COMPILED = 1.4  # instead of ACT_BACKWARD_FACTOR for a compiled layer [fit]

# Vision tower (Qwen3-VL ViT blocks: LayerNorm, qkv, proj, GELU MLP), bf16 per patch [fit]
VIT_ACT_BYTES_PER_HIDDEN = 16  # norm in/out x2, qkv(3h)->counted below, attn out, proj out, residuals
VIT_ACT_BYTES_PER_QKV = 6  # 3h qkv output x 2 B
VIT_ACT_BYTES_PER_FFN = 6  # fc1 out, GELU out, fc2 in (bf16)
# The frozen vision tower: the notes expected swift to checkpoint it with inputs requiring grad (so backward
# re-runs it and its block inputs are kept). Measured with ms-swift 4.6.0 + transformers 5.17
# (docs/memory-model.md): torch warns "None of the inputs have requires_grad=True" in the ViT and the peaks of
# runs with and without ViT checkpointing are identical, i.e. nothing of the frozen ViT is kept for backward.
# 'no_grad' is therefore the default; 'checkpointed_requires_grad' remains for stacks that do backprop into it.
VISION_MODE_DEFAULT = 'no_grad'

# ------------------------------------------------------------------------------------------------------------
# Logits and loss
# ------------------------------------------------------------------------------------------------------------
# HF path: bf16 logits (2) + fp32 upcast in the loss (4) + fp32 grad of the logits (4) per position x vocab.
LOGITS_BYTES_HF = 10
# Megatron-SWIFT (ms-swift 4.6.0, megatron-core 0.16.1, mcore-bridge 1.6.5) computes the logits of every position
# (mcore_bridge/model/gpt_model.py:587 runs the output layer on all hidden states; there is no logits_to_keep), split
# by TP, and hands them with the labels to compute_language_model_loss (gpt_model.py:613). ms-swift turns the fused
# loss on (swift/megatron/arguments/megatron_args.py:516-517: cross_entropy_loss_fusion=True,
# cross_entropy_fusion_impl='native'; 'te' is the other value), which picks (megatron/core/models/common/
# language_module/language_module.py:140-167):
#   native: fused_vocab_parallel_cross_entropy (megatron/core/fusions/fused_cross_entropy.py). Forward: the output
#     layer's bf16 logits (2) and their fp32 copy (.float(), tensor_parallel/cross_entropy.py:28; 4) are alive at once;
#     max-subtraction, exp and the division into the softmax are in place on that copy (cross_entropy.py:45, 65, 80),
#     which is saved for backward (fused_cross_entropy.py:119) while the bf16 logits, saved by nobody (the output
#     layer keeps its input and weight), are freed: 6 bytes. Backward (calculate_gradients, fused_cross_entropy.py:
#     66-84): the helpers run under torch.compile (jit_fuser, megatron/core/jit.py:21), and inductor functionalises
#     the in-place index_put/mul on the saved softmax: its output code allocates a new fp32 [positions, vocab] buffer
#     and the bf16 gradient while the fp32 softmax is alive (benchmarks/megatron_ce_memory.py; read on CPU inductor,
#     torch 2.14: the forward helpers allocate only the fp32 copy). Peak 4 + 4 + 2 = 10 bytes per position x
#     vocab / TP at the start of backward. [derived; the CUDA kernels of torch 2.11 unverified]
LOGITS_BYTES_MEGATRON_NATIVE = 10
#   te: Transformer Engine's parallel_cross_entropy (transformer_engine/pytorch/cross_entropy.py, Triton kernels in
#     transformer_engine/pytorch/triton/cross_entropy.py): an online softmax over the bf16 logits with 3 fp32 values
#     per position; the bf16 logits are the only vocab-sized tensor, saved for backward and overwritten in place by
#     their gradient (cross_entropy_backward_kernel stores grad_input into X_ptr): 2 bytes per position x vocab / TP.
#     [derived]
LOGITS_BYTES_MEGATRON_TE = 2
LOGITS_BYTES_MEGATRON = {'native': LOGITS_BYTES_MEGATRON_NATIVE, 'te': LOGITS_BYTES_MEGATRON_TE}  # by CE impl
# megatron_ep_lora's --recompute_granularity (recipe megatron.recompute). full: every layer's input kept, the layer
# recomputed in backward (the plan's checkpoint + working-set terms); selective: Megatron's default recompute_modules
# ['core_attn'] -- with fused (flash) attention the core attention saves nothing a recompute drops (its inputs are
# the QKV projection's outputs, its output the out-projection's input), so it is planned as none: every layer keeps
# its activations
MEGATRON_RECOMPUTE = ('full', 'selective', 'none')
MEGATRON_CROSS_ENTROPY = ('native', 'te')  # --cross_entropy_fusion_impl values of ms-swift 4.6
MEGATRON_CROSS_ENTROPY_DEFAULT = 'native'  # ms-swift 4.6's default
# Until 2026-12-02 this was one constant, 17, fitted to the single one-H200 run of a random Qwen3-VL-MoE (hidden 512,
# 2,130 tokens, vocab 151,936; benchmarks/results/megatron-h200-2026-12-01.json). That run's memory(GiB) is
# torch.cuda.max_memory_reserved over the whole process: 3.95 GiB at steps 1-2 and 6.39 GiB from step 3, a jump the
# size of two fp32 logits blocks (2 x 1.21 GiB) while the samples' lengths varied (2,118 / 2,130 / 2,143 tokens) --
# consistent with the caching allocator keeping vocab-sized segments of earlier lengths (reserved, not allocated),
# not settled: its allocated peak was not recorded. docs/memory-model.md, "Megatron-SWIFT".
# The TE kernels were read at NVIDIA/TransformerEngine 02965d2 (2025); TE 2.11's were not checked line by line.
# Unsloth's fused/chunked cross entropy never materialises full fp32 logits: bytes per position x vocab [fit]
LOGITS_BYTES_UNSLOTH = 2
# ms-swift 4.6 with transformers>=5 projects only the positions that carry labels (Seq2SeqTrainer ->
# SwiftMixin.get_use_logits_to_keep / prepare_logits_to_keep, on by default when the model's forward takes
# `logits_to_keep`); Unsloth keeps an integer suffix from the first label. Megatron computes every position.

# ------------------------------------------------------------------------------------------------------------
# Runtime overheads (GPU)
# ------------------------------------------------------------------------------------------------------------
CUDA_CONTEXT_GIB = 0.75  # CUDA context + cuBLAS/cuDNN workspaces, outside torch's allocator (0.5-1 GiB) [fit]
NCCL_BUFFERS_GIB = 0.5  # NCCL communicator buffers per GPU when world size > 1 [fit]
# reserved - allocated: the caching allocator fragments on the short-lived tensors (activations, gradients,
# buckets, optimizer temporaries); long-lived weights/states allocated once fragment little. [fit]
ALLOCATOR_FRAGMENTATION = 0.10  # fraction of the dynamic allocations (5-15 % is typical)
ALLOCATOR_FRAGMENTATION_STATIC = 0.01  # fraction of the static allocations (weights, optimizer states)
# With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set by every launch, backends/common.py) segments grow in
# place: reserved - allocated measured 0.09-0.5 GiB on 6-100 GiB peaks (the r14 runs above) [fit]; applied to the
# compiled layers and the Unsloth path (its MoE runs: 0.35 GiB on a 58 GiB peak, #31 call g; rows 19-22, 31-33,
# 37-47 of docs/memory-model.md), not refitted for it.
ALLOCATOR_FRAGMENTATION_EXPANDABLE = 0.01
ADAM_STEP_TEMP_FRACTION = 0.5  # torch foreach AdamW: _foreach_sqrt(exp_avg_sq) copies one of the two moments [fit]
MOE_DISPATCH_COPIES = 3  # permuted tokens, expert outputs, un-permuted combine buffers (x k x hidden, bf16) [fit]
# Unsloth's split-LoRA expert path (unsloth_zoo moe_utils.forward_native_grouped_mm, read 2026-12-03), per routed
# token: it saves the permuted input once (the LoRA A grouped GEMMs' weight gradient needs it; the frozen base GEMM
# needs no input), the gate/up output (its fused SiLU backward) and the activated intermediate (the down projection's
# LoRA A input), and not the expert output: the routing weights' gradient comes from an identity on the intermediate
# (_MoEGateGradIdentity), so the weighted un-permute keeps nothing. Derived from the code, not fitted; chosen after
# calibration rows 32, 33 and 39 showed the generic counts 2.3x too high (those rows are in-sample for it).
UNSLOTH_MOE_DISPATCH_COPIES = 1  # the permuted input (x k x hidden, bf16)
UNSLOTH_ACT_BYTES_PER_EXPERT_FFN = 6  # gate+up output (2 x I) and the activated intermediate (I), bf16
FIT_MARGIN = 0.0  # extra headroom required on top of the predicted peak, fraction of capacity
# What the search (plan/search.py) leaves free of the GPU when it chooses a setting the user did not set (a larger
# micro-batch, fewer checkpointed layers): the plan's peaks are within +-10 % of the measured ones, mostly above
# (docs/memory-model.md), so a chosen setting keeps 5 % of the GPU; what the user sets is planned against all of it.
SEARCH_MARGIN = 0.05
TIGHT_FRACTION = 0.90  # peak above this fraction of capacity -> a "tight" warning in the reasons
# Samples/s of the compiled 2B LoRA on one H200 without checkpointing, relative to checkpointed micro-batch 1, by
# micro-batch (docs/runs/benchmarks-log.md, runs 14a and 14c: 3.76 -> 4.76, and 5.70 at micro-batch 4); quoted by
# the plan's "Memory to spare" sentence (measured speed, not a memory fit).
SPEEDUP_WITHOUT_CHECKPOINTING = {1: 1.27, 4: 1.52}
# Samples/s of Unsloth's split LoRA with the layer checkpoints on the GPU, relative to its offloaded checkpointing
# (Qwen3.5-MoE 35B-A3B shape, 8 of 40 layers, 64 frames, one H200, 2026-12-02: 2.60 against 2.03); quoted by the
# plan's checkpoint sentence (measured speed, not a memory fit).
UNSLOTH_GPU_CHECKPOINT_SPEEDUP = 1.28

# ------------------------------------------------------------------------------------------------------------
# Host RAM
# ------------------------------------------------------------------------------------------------------------
HOST_PER_PROCESS_GIB = 3.0  # RSS of one training process: python + torch + CUDA libs + swift/transformers [fit]
HOST_DATALOADER_WORKERS = 4  # per training process (the measured baseline used 4)
HOST_PER_WORKER_GIB = 0.75  # decoded frames + prefetch per worker (64 frames of 640x360 RGB is ~44 MB) [fit]
SAFETENSORS_SHARD_GB = 5.0  # HF save_pretrained max_shard_size default ("5GB"): transient host copy at load
MEGATRON_HOST_PER_PROCESS_GIB = 5.0  # megatron/TE import + mcore-bridge conversion buffers per rank [fit]
# Unsloth's offloaded gradient checkpointing copies every layer input to pinned host memory; torch's caching host
# allocator rounds pinned blocks up to a power of two, hence a factor on top of 2*s*h per layer [fit]
UNSLOTH_OFFLOAD_PINNED_FACTOR = 1.3
UNSLOTH_GPU_INFLIGHT_LAYERS = 2  # layer inputs resident on the GPU while the offload streams run [fit]
# Container limit vs /proc/meminfo: warn when the cgroup limit is below this fraction of MemTotal.
CONTAINER_LIMIT_WARN_FRACTION = 0.75

# ------------------------------------------------------------------------------------------------------------
# Default sample: ONE source of truth with the `video_ora` template, the dataset and the recipes. The budget is
# swift_vora.budget.VideoBudget's defaults (fps 2, 4..64 frames, 256 tokens per frame pair), the clip length the
# dataset's default window (swift_vora.data.windowing.WindowConfig, 60 s). Change them there, not here.
# ------------------------------------------------------------------------------------------------------------
_BUDGET = _VideoBudget()
DEFAULT_CLIP_SECONDS = float(_WindowConfig().window)  # clip (window) length: the dataset's default window
DEFAULT_FPS = float(_BUDGET.fps)  # frames per second of clip (video.fps / SWIFT_VORA_FPS)
DEFAULT_MAX_FRAMES = int(_BUDGET.max_frames)  # frame cap per clip (video.max_frames / SWIFT_VORA_MAX_FRAMES)
DEFAULT_MIN_FRAMES = int(_BUDGET.min_frames)  # never fewer frames per clip (video.min_frames)
DEFAULT_FRAME_TOKENS = int(_BUDGET.pair_tokens)  # tokens per frame pair (video.pair_tokens / SWIFT_VORA_PAIR_TOKENS)
DEFAULT_MIN_PAIR_TOKENS = int(_BUDGET.min_pair_tokens)  # the lowest tokens a pair is shrunk to (video.min_pair_tokens)
TIMESTAMP_TOKENS_PER_GROUP = 8  # "<t seconds>" text (~6 tokens) + vision start/end per frame pair [fit]
DEFAULT_PROMPT_TOKENS = 96  # system + user prompt around the video
DEFAULT_ANSWER_TOKENS = 32  # the JSON window list the model learns to write (the supervised positions)
DEFAULT_LORA_RANK = 8  # ms-swift --lora_rank default
