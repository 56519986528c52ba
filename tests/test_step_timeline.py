"""benchmarks/step_timeline.py: where a profiled step's GPU idles, and which Python calls synchronise."""
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))

import step_timeline  # noqa: E402


def _x(name, cat, ts, dur, **kw):
    return {'ph': 'X', 'name': name, 'cat': cat, 'ts': ts, 'dur': dur, **kw}


def test_gpu_idle_splits_the_gaps_by_the_innermost_region():
    trace = {'traceEvents': [
        _x('vora/training_step', 'user_annotation', 0, 1000),
        _x('vora/vision_tower', 'user_annotation', 100, 200),
        _x('k1', 'kernel', 0, 100),
        _x('k2', 'kernel', 150, 50),      # 50 us idle before it, inside vision_tower
        _x('k3', 'kernel', 190, 100),     # overlaps k2: no gap
        _x('k4', 'kernel', 700, 100),     # 410 us idle, in training_step only
        _x('memcpy', 'gpu_memcpy', 805, 10),  # 5 us: below min_gap_us, not counted
        _x('cudaStreamSynchronize', 'cuda_runtime', 280, 20),
        _x('aten::nonzero', 'cpu_op', 310, 30),
        _x('aten::nonzero', 'cpu_op', 350, 30),
        {'ph': 'i', 'name': 'marker', 'ts': 5},
    ]}
    got = step_timeline.gpu_idle(trace, min_gap_us=20)
    assert got['window_ms'] == 0.815 and got['gpu_idle_ms'] == 0.46 and got['gaps'] == 2
    assert got['gpu_busy_ms'] == 0.35
    assert got['idle_ms_by_region'] == {'vora/training_step': 0.41, 'vora/vision_tower': 0.05}
    largest = got['largest_gaps'][0]
    assert largest['ms'] == 0.41 and largest['region'] == 'vora/training_step' and largest['at_ms'] == 0.29
    assert largest['host_call_when_idle_began'] == 'cudaStreamSynchronize'
    assert largest['host_ops_during'] == ['aten::nonzero x2']


def test_gpu_idle_without_kernels_says_so():
    assert step_timeline.gpu_idle({'traceEvents': [_x('aten::mm', 'cpu_op', 0, 5)]}) == {
        'error': 'no GPU events in the trace'}


def test_regions_mark_the_trainer_phases_in_a_profile():
    class Vision(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class TextModel(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual, self.language = Vision(), TextModel()
            Vision.__name__ = 'ToyVisionModel'
            TextModel.__name__ = 'ToyTextModel'

        def forward(self, x):
            return self.language(self.visual(x))

    class Accelerator:
        def backward(self, loss):
            loss.backward()

    class Trainer:
        def __init__(self):
            self.model, self.accelerator = Model(), Accelerator()

        def training_step(self, x):
            loss = self.model(x).sum()
            self.accelerator.backward(loss)
            return loss

    trainer = Trainer()
    step_timeline.Regions(trainer)
    step_timeline.Regions(trainer)  # a second install does not wrap twice
    x = torch.ones(3, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert trainer.training_step(x).item() == 9.0
    names = [e.name for e in prof.events() if e.name.startswith('vora/')]
    assert sorted(set(names)) == ['vora/backward', 'vora/language_model', 'vora/training_step', 'vora/vision_tower']
    assert names.count('vora/training_step') == 1
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_kernel_families_name_the_kernels_the_h200_profiles_showed():
    """One table for the dense and the MoE benchmarks; the specific families win over the generic ones."""
    named = {
        'void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn>': 'GEMM (dense, LoRA)',
        'nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT': 'GEMM (dense, LoRA)',
        'void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>': 'attention',
        'fmha_cutlassF_bf16_aligned_64x64_rf_sm80': 'attention',
        'chunk_gated_delta_rule_fwd_kernel_h_blockdim64': 'Gated DeltaNet (fla Triton)',
        'void at::cuda::detail::_grouped_mm_kernel<cutlass::bfloat16_t>': 'grouped GEMM (experts)',
        # torch._grouped_mm at full depth on the H200 (call e of #30), as the profile truncates it
        '_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversa':
            'grouped GEMM (experts)',
        'Memcpy HtoD (Pageable -> Device)': 'host<->device copies (inputs, offloaded checkpoints)',
        'triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0': 'Triton (Liger, compiled, other)',
        'void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>': 'elementwise / reduce (torch)',
        'void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float>': 'dropout',
        'ncclDevKernel_AllReduce_Sum_f32_RING_LL': 'communication (NCCL)',
        'some_custom_kernel': 'other',
    }
    for kernel, family in named.items():
        assert step_timeline.kernel_family(kernel) == family, kernel
