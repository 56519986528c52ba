"""Memory model: per backend and phase, directions that must hold whatever the constants are fitted to."""
import os
import re

import pytest

from swift_vora.plan import constants as C
from swift_vora.plan.memory import TrainSetup, estimate
from swift_vora.plan.model_source import load_model_spec
from swift_vora.plan.video_budget import text_only_tokens, video_tokens

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'configs')
MOE = load_model_spec(os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json'))
DENSE = load_model_spec(os.path.join(CONFIGS, 'qwen3_vl_2b.json'))
TOK = video_tokens(32, 2, 64, 196)


def est(spec, **kw):
    return estimate(spec, kw.pop('tokens', TOK), TrainSetup(**kw))


COMBOS = [(b, t) for b in ('ddp', 'deepspeed_zero2', 'deepspeed_zero3', 'unsloth_split_lora')
          for t in ('lora', 'full', 'selective') if b != 'unsloth_split_lora' or t == 'lora']


@pytest.mark.parametrize('backend,tuner', COMBOS)
def test_phases_and_breakdown(backend, tuner):
    e = est(DENSE, backend=backend, tuner=tuner)
    ph = e.phases
    assert ph['load']['gpu'] <= ph['first_step']['gpu'] <= ph['steady']['gpu']
    assert abs(sum(e.gpu.values()) - e.gpu_peak) < 1e6  # the breakdown is the peak moment
    assert abs(sum(e.host.values()) - e.host_peak) < 1e6
    assert e.gpu['CUDA context'] == C.CUDA_CONTEXT_GIB * C.GiB


def test_zero_stages_scale_with_gpus():
    z2_1 = est(DENSE, backend='deepspeed_zero2', tuner='full')
    z2_8 = est(DENSE, backend='deepspeed_zero2', tuner='full', gpus_per_node=8)
    z3_8 = est(DENSE, backend='deepspeed_zero3', tuner='full', gpus_per_node=8)
    assert z3_8.gpu_peak < z2_8.gpu_peak < z2_1.gpu_peak
    # ZeRO-2: 2 bytes/param replicated + 14/N; ZeRO-3: 16/N (plus the gathered working set)
    w = DENSE.total_params * 2
    assert z2_8.gpu['weights (bf16)'] == pytest.approx(w)
    assert z3_8.gpu['weights shard (ZeRO-3, bf16)'] == pytest.approx(w / 8)


def test_offload_moves_states_to_host():
    on = est(MOE, backend='deepspeed_zero2', tuner='full')
    off = est(MOE, backend='deepspeed_zero2', tuner='full', offload='cpu')
    assert off.gpu_peak < on.gpu_peak and off.host_peak > on.host_peak
    t = MOE.trainable_params('full')
    assert off.host['offloaded optimizer states (fp32 master + Adam m, v)'] == pytest.approx(12 * t)
    z3 = est(DENSE, backend='deepspeed_zero3', tuner='full', offload='cpu')
    assert 'offloaded bf16 parameters (ZeRO-3)' in z3.host
    assert not any(k.startswith('weights') for k in z3.gpu)


def test_megatron_splits_experts_by_ep_and_dense_by_tp():
    e1 = est(MOE, backend='megatron_ep_lora', tuner='lora', gpus_per_node=8, ep=1)
    e8 = est(MOE, backend='megatron_ep_lora', tuner='lora', gpus_per_node=8, ep=8)
    comps = MOE.params_by_component()
    drop = e1.gpu['weights (frozen base, bf16)'] - e8.gpu['weights (frozen base, bf16)']
    assert drop == pytest.approx(2 * comps['experts'] * (1 - 1 / 8))
    t2 = est(MOE, backend='megatron_ep_lora', tuner='lora', gpus_per_node=8, ep=8, tp=2)
    assert t2.gpu_peak < e8.gpu_peak
    # Megatron computes logits for every position (vocab-parallel), HF only for the supervised ones
    assert any(k.startswith('logits + loss (all positions') for k in e8.gpu)
    assert 'distributed optimizer (fp32 master + Adam, sharded over DP)' in e8.gpu


def test_megatron_full_sft_counts_megatron_cores_ddp_buffers_and_the_distributed_optimizer():
    """megatron_ep_full, per GPU (megatron-core 0.16.1): bf16 weights (dense / TP, experts / EP), an fp32 main grad for
    every local trainable parameter (DDP's grad buffer, whole on every rank), the fp32 master and Adam's m, v sharded
    over the data-parallel group of their kind -- the experts' over world / EP."""
    comps = MOE.params_by_component()
    trainable = {c: n for c, n in comps.items() if c != 'vision'}  # the vision tower stays frozen
    experts = trainable['experts']
    dense = sum(trainable.values()) - experts
    for ep, world in ((8, 8), (4, 8), (1, 1)):
        e = est(MOE, backend='megatron_ep_full', tuner='full', gpus_per_node=world, ep=ep)
        local = experts / ep + dense
        assert e.trainable_params == sum(trainable.values())
        assert e.gpu['gradients: fp32 main grads, DDP buffer (every local trainable parameter)'] == pytest.approx(
            4 * local)
        sharded = experts / ep / (world // ep) + dense / world
        assert e.gpu['distributed optimizer: fp32 master params (sharded over DP)'] == pytest.approx(4 * sharded)
        assert e.gpu['distributed optimizer: Adam m, v fp32 (sharded over DP)'] == pytest.approx(8 * sharded)
        weights = 2 * (experts / ep + sum(n for c, n in comps.items() if c != 'experts'))
        assert e.gpu['weights (bf16)'] == pytest.approx(weights, rel=1e-3)  # biases / norms counted in the groups
        # the bf16 weight gradient in flight before DDP's hook adds it: the largest local tensor, once
        largest = max(g.numel / (ep if g.component == 'experts' else 1) for g in MOE.groups if g.tower == 'llm')
        assert e.gpu['weight gradient in flight (bf16, the largest local tensor, before DDP adds it in fp32)'] == \
            pytest.approx(2 * largest)
    # the grad buffer is allocated once: the fragmentation of the per-step allocations leaves it out
    full = est(MOE, backend='megatron_ep_full', tuner='full', gpus_per_node=8, ep=8)
    static = {'weights (bf16)', 'gradients: fp32 main grads, DDP buffer (every local trainable parameter)',
              'distributed optimizer: fp32 master params (sharded over DP)',
              'distributed optimizer: Adam m, v fp32 (sharded over DP)'}
    outside = {'CUDA context', 'NCCL buffers', 'allocator fragmentation (reserved - allocated)'}
    per_step = sum(v for k, v in full.gpu.items() if k not in static | outside)  # activations, logits, the wgrad
    assert full.gpu['allocator fragmentation (reserved - allocated)'] == pytest.approx(
        C.ALLOCATOR_FRAGMENTATION * per_step + C.ALLOCATOR_FRAGMENTATION_STATIC * sum(full.gpu[k] for k in static))
    # experts split 8 ways with one copy each: their states are not sharded; at EP 4 two copies share them
    assert est(MOE, backend='megatron_ep_full', tuner='full', gpus_per_node=8, ep=4).gpu_peak > full.gpu_peak


def test_unsloth_offloaded_checkpoints_in_host_ram():
    e = est(MOE, backend='unsloth_split_lora', tuner='lora', checkpoint_offload=True)
    expected = MOE.num_layers * 2 * MOE.hidden_size * TOK.total_tokens * C.UNSLOTH_OFFLOAD_PINNED_FACTOR
    assert e.host_by_phase['steady']['offloaded layer checkpoints (Unsloth, pinned)'] == pytest.approx(expected)
    assert 'activations: layer checkpoints' not in e.gpu
    # on the GPU (the planner's choice when there is room): the same checkpoints in GPU memory, none in host RAM
    on_gpu = est(MOE, backend='unsloth_split_lora', tuner='lora')
    assert on_gpu.gpu['activations: layer checkpoints'] == pytest.approx(expected / C.UNSLOTH_OFFLOAD_PINNED_FACTOR)
    assert 'offloaded layer checkpoints (Unsloth, pinned)' not in on_gpu.host_by_phase['steady']
    # at micro-batch 1 the checkpoints on the GPU (1.1 GiB) stay below the LoRA gradients that replace them in
    # backward: no higher peak than offloaded (the H200 measured 6.00 GiB above the model both ways); at micro-batch
    # 4 they are larger than the gradients and raise it
    assert on_gpu.gpu_peak <= e.gpu_peak
    mb4 = {where: est(MOE, backend='unsloth_split_lora', tuner='lora', micro_batch=4, checkpoint_offload=where)
           for where in (False, True)}
    assert mb4[False].gpu_peak > mb4[True].gpu_peak
    assert sum(on_gpu.host_by_phase['steady'].values()) < sum(e.host_by_phase['steady'].values())


def test_activation_switches():
    base = est(DENSE, backend='ddp', tuner='lora')
    no_gc = est(DENSE, backend='ddp', tuner='lora', gradient_checkpointing=False)
    grad_vit = est(DENSE, backend='ddp', tuner='lora', vision_mode='checkpointed_requires_grad')
    all_logits = est(DENSE, backend='ddp', tuner='lora', logits_positions='all')
    assert no_gc.gpu_peak > base.gpu_peak and grad_vit.gpu_peak > base.gpu_peak  # default: frozen ViT, no grad
    logits_all = all_logits.gpu['logits + loss (all positions, fp32)']
    assert logits_all == pytest.approx(TOK.total_tokens * DENSE.vocab_size * C.LOGITS_BYTES_HF)
    assert all_logits.gpu_peak > base.gpu_peak
    text = est(DENSE, backend='ddp', tuner='lora', tokens=text_only_tokens(TOK.total_tokens))
    assert not any('vision' in k for k in text.gpu)
    mb2 = est(DENSE, backend='ddp', tuner='lora', micro_batch=2)
    assert mb2.gpu['activations: layer checkpoints'] == pytest.approx(2 * base.gpu['activations: layer checkpoints'])


def test_pure_bf16_without_deepspeed():
    e = est(DENSE, backend='ddp', tuner='full')
    t = DENSE.trainable_params('full')
    assert e.gpu.get('optimizer states (Adam m, v bf16)', 0) + e.gpu.get('optimizer step temporaries (foreach AdamW)',
                                                                         0) >= 4 * t


def test_every_constant_is_documented():
    src = open(C.__file__).read().splitlines()
    for i, line in enumerate(src):
        if re.match(r'^[A-Z][A-Z0-9_]* = ', line):
            documented = '#' in line or (i > 0 and src[i - 1].lstrip().startswith('#'))
            assert documented, f'constants.py:{i + 1} has no comment: {line}'


def test_compiled_layers_save_fewer_activations_and_fragment_less():
    """train.compile=layers: the compiled layers keep ACT_COMPILED_SAVED_FRACTION of the eager activations, their
    checkpointed backward holds ACT_BACKWARD_FACTOR_COMPILED x one layer, and the allocator (expandable segments)
    fragments little -- so a compiled plan is smaller, checkpointed or not, and says why."""
    for gc in (True, False):
        eager = est(DENSE, backend='ddp', tuner='lora', gradient_checkpointing=gc, micro_batch=4)
        compiled = est(DENSE, backend='ddp', tuner='lora', gradient_checkpointing=gc, micro_batch=4,
                       compiled_layers=True)
        assert compiled.gpu_peak < eager.gpu_peak
        assert any('compiled' in n for n in compiled.assumptions)
        assert not any('compiled' in n for n in eager.assumptions)
        frag = 'allocator fragmentation (reserved - allocated)'
        assert compiled.gpu[frag] < 0.5 * eager.gpu[frag]
    no_gc = est(DENSE, backend='ddp', tuner='lora', gradient_checkpointing=False)
    no_gc_compiled = est(DENSE, backend='ddp', tuner='lora', gradient_checkpointing=False, compiled_layers=True)
    key = 'activations: all layers (no checkpointing)'
    assert no_gc_compiled.gpu[key] == pytest.approx(C.ACT_COMPILED_SAVED_FRACTION * no_gc.gpu[key])
    text = text_only_tokens(TOK.total_tokens)  # (with video, the compiled layer's working set can fall below the
    # vision block's, which then names the row)
    gc_eager = est(DENSE, backend='ddp', tuner='lora', micro_batch=4, tokens=text)
    gc_compiled = est(DENSE, backend='ddp', tuner='lora', micro_batch=4, compiled_layers=True, tokens=text)
    ws = 'activations: working set of one layer (recompute + backward)'
    assert gc_compiled.gpu[ws] == pytest.approx(gc_eager.gpu[ws] * C.ACT_COMPILED_SAVED_FRACTION
                                                * C.ACT_BACKWARD_FACTOR_COMPILED / C.ACT_BACKWARD_FACTOR)
    # the layer checkpoints themselves are the same hidden states, compiled or not
    assert gc_compiled.gpu['activations: layer checkpoints'] == gc_eager.gpu['activations: layer checkpoints']


def test_compile_modes_agree_with_the_recipe_and_the_lever():
    from swift_vora.backends.recipe import CHOICES
    from swift_vora.plan.memory import COMPILE_MODES
    from swift_vora.speed import compile_layers
    assert COMPILE_MODES == compile_layers.MODES == tuple(CHOICES['train.compile'])


def test_megatron_cross_entropy_implementation_sets_the_logits_term():
    """Megatron computes every position's logits, split by TP: native (fp32 softmax + its backward's buffers) holds
    10 bytes per position x vocab, TE's fused cross entropy 2 (constants.py derives both); the plan says which --
    in the breakdown when the logits are the larger of them and the layer working set, else in a note."""
    tok = text_only_tokens(4096)
    ws_label = 'activations: working set of one layer (recompute + backward)'
    peaks = {}
    for tp in (1, 2):
        for ce in ('native', 'te'):
            e = est(MOE, tokens=tok, backend='megatron_ep_lora', gpus_per_node=8, ep=8, tp=tp, cross_entropy=ce)
            logits = tok.total_tokens * MOE.vocab_size * C.LOGITS_BYTES_MEGATRON[ce] / tp
            shown = [(k, v) for k, v in e.gpu.items() if k.startswith('logits')]
            if shown:
                (label, value), = shown
                assert value == pytest.approx(logits)
                assert ('TE fused' in label) == (ce == 'te')
                assert ws_label not in e.gpu
            else:
                assert e.gpu[ws_label] >= logits
                assert any(f'logits + loss ({logits / C.GiB:.2f} GiB)' in n for n in e.assumptions)
            peaks[tp, ce] = e.gpu_peak
        assert peaks[tp, 'te'] < peaks[tp, 'native']
    with pytest.raises(ValueError, match='cross entropy'):
        est(MOE, tokens=tok, backend='megatron_ep_lora', gpus_per_node=8, ep=8, cross_entropy='liger')


def test_megatron_counts_the_larger_of_logits_and_layer_working_set_other_backends_both():
    """Megatron's loss backward frees the logits before the last layer is recomputed: one of the two is on the
    GPU at a time, so going from TE's cross entropy (logits below the working set) to native (above it) adds only
    what native's logits exceed the working set by. A HF backend still adds both."""
    tok = text_only_tokens(4096)
    ws_label = 'activations: working set of one layer (recompute + backward)'
    te = est(MOE, tokens=tok, backend='megatron_ep_lora', gpus_per_node=8, ep=8, cross_entropy='te')
    native = est(MOE, tokens=tok, backend='megatron_ep_lora', gpus_per_node=8, ep=8, cross_entropy='native')
    logits = {ce: tok.total_tokens * MOE.vocab_size * C.LOGITS_BYTES_MEGATRON[ce] for ce in ('te', 'native')}
    ws = te.gpu[ws_label]
    assert logits['te'] < ws < logits['native']  # the case this test is about
    assert ws_label not in native.gpu and not any(k.startswith('logits') for k in te.gpu)
    alloc = {ce: e.phases['steady']['gpu_allocated'] for ce, e in (('te', te), ('native', native))}
    assert alloc['native'] - alloc['te'] == pytest.approx(logits['native'] - ws, rel=1e-6)
    ddp = est(DENSE, backend='ddp', tuner='lora')
    assert ws_label in ddp.gpu and any(k.startswith('logits') for k in ddp.gpu)


def test_plan_cli_cross_entropy_flag_changes_the_megatron_plan():
    from swift_vora.cli.plan import plan_from_argv
    args = ['--model', os.path.join(CONFIGS, 'qwen3_moe_30b_a3b.json'), '--gpus', '8', '--gpu-mem-gib', '139.8',
            '--backend', 'megatron_ep_lora', '--ep', '8', '--seq-len', '8192']
    native, default, te = (plan_from_argv(args + extra) for extra in (['--cross-entropy', 'native'], [],
                                                                       ['--cross-entropy', 'te']))
    assert default.gpu_peak_gib == native.gpu_peak_gib  # ms-swift's default
    assert te.gpu_peak_gib < native.gpu_peak_gib


def test_megatron_recompute_none_or_selective_plans_every_layers_activations():
    """megatron.recompute (--recompute_granularity): full keeps one checkpoint per layer; none keeps every layer's
    activations, and so does selective (Megatron's core_attn recompute saves nothing with fused attention) -- a
    recipe that turns recompute off is planned at the memory it will take, and says why for selective."""
    from swift_vora.backends.planning import plan_request
    from swift_vora.backends.recipe import recipe_from_dict
    from swift_vora.cli.plan import plan_from_argv
    args = ['--model', os.path.join(CONFIGS, 'qwen3_moe_30b_a3b.json'), '--gpus', '8', '--gpu-mem-gib', '139.8',
            '--backend', 'megatron_ep_lora', '--ep', '8', '--seq-len', '8192']
    full, none, selective = (plan_from_argv(args + extra) for extra in ([], ['--recompute', 'none'],
                                                                        ['--recompute', 'selective']))
    assert any(k == 'activations: layer checkpoints' for k in full.breakdown)
    assert 'activations: all layers (no checkpointing)' in none.breakdown
    layers = none.breakdown['activations: all layers (no checkpointing)']
    assert layers > 5 * full.breakdown['activations: layer checkpoints']
    assert none.gpu_peak_gib > full.gpu_peak_gib
    assert selective.gpu_peak_gib == none.gpu_peak_gib
    assert any('recompute=selective' in a for a in selective.assumptions)
    assert not any('recompute=selective' in a for a in none.assumptions)
    # the recipe key reaches the planner; the other backends ignore it (they checkpoint by train.*)
    doc = {'model': {'path': os.path.join(CONFIGS, 'qwen3_moe_30b_a3b.json')}, 'data': {'dataset': 'x.jsonl'},
           'megatron': {'recompute': 'none'}}
    assert plan_request(recipe_from_dict(doc, where='<test>')).recompute == 'none'
    ddp = ['--model', os.path.join(CONFIGS, 'qwen3_vl_2b.json'), '--hardware', 'h200x1', '--backend', 'ddp']
    assert plan_from_argv(ddp + ['--recompute', 'none']).gpu_peak_gib == plan_from_argv(ddp).gpu_peak_gib


def test_checkpointing_fewer_layers_plans_their_activations_and_a_speed_in_between():
    from swift_vora.cli.plan import plan_from_argv
    base = ['--model', os.path.join(os.path.dirname(__file__), 'fixtures', 'configs', 'qwen3_vl_2b.json'),
            '--hardware', 'h200x1', '--backend', 'ddp', '--compile', 'layers', '--frame-tokens', '180',
            '--clip-seconds', '32', '--answer-tokens', '16', '--as-given']
    every = plan_from_argv(base)
    assert plan_from_argv([*base, '--checkpoint-layers', '28']).gpu_peak_gib == every.gpu_peak_gib  # all 28
    none = plan_from_argv([*base, '--no-gradient-checkpointing'])
    zero = plan_from_argv([*base, '--checkpoint-layers', '0'])
    assert zero.gpu_peak_gib == pytest.approx(none.gpu_peak_gib, abs=0.01)  # 0 checkpointed = no checkpointing
    assert zero.est_samples_per_s == pytest.approx(none.est_samples_per_s, rel=1e-3)
    part = plan_from_argv([*base, '--checkpoint-layers', '20'])
    assert part.breakdown['activations: 8 of 28 layers not checkpointed'] > 0
    assert every.gpu_peak_gib < part.gpu_peak_gib < none.gpu_peak_gib
    assert every.est_samples_per_s < part.est_samples_per_s < none.est_samples_per_s
    assert '20 of 28 layers checkpointed' in part.est_source


def test_plan_cli_checkpoint_layers_auto_on_a_dense_model_is_no_checkpointing_where_memory_is_free():
    """`--checkpoint-layers auto` on the 2B dense shape on an H200: every layer fits without its checkpoint, so the
    plan keeps none (the plan of --checkpoint-layers 0, which plans as no checkpointing); on a 16 GiB GPU some."""
    from swift_vora.cli.plan import plan_from_argv
    base = ['--model', os.path.join(os.path.dirname(__file__), 'fixtures', 'configs', 'qwen3_vl_2b.json'),
            '--backend', 'ddp', '--compile', 'layers', '--frame-tokens', '180', '--clip-seconds', '32',
            '--answer-tokens', '16', '--as-given']
    auto = plan_from_argv([*base, '--hardware', 'h200x1', '--checkpoint-layers', 'auto'])
    zero = plan_from_argv([*base, '--hardware', 'h200x1', '--checkpoint-layers', '0'])
    assert auto.checkpoint_layers == 0 and auto.gpu_peak_gib == zero.gpu_peak_gib
    assert any(r.startswith('train.checkpoint_layers=auto: no decoder layer checkpointed, all 28')
               for r in auto.reasons)
    small = plan_from_argv([*base, '--gpus', '1', '--gpu-mem-gib', '16', '--checkpoint-layers', 'auto'])
    assert small.verdict == 'fits' and 0 < small.checkpoint_layers < 28
    assert plan_from_argv([*base, '--gpus', '1', '--gpu-mem-gib', '16', '--checkpoint-layers',
                           str(small.checkpoint_layers - 1)]).verdict == 'does_not_fit'
    with pytest.raises(SystemExit):  # argparse: neither a count nor auto
        plan_from_argv([*base, '--hardware', 'h200x1', '--checkpoint-layers', 'most'])


def test_unsloth_checkpoints_and_lora_gradients_peak_one_after_the_other():
    """Backward frees layer i's checkpoint as it allocates layer i's LoRA gradients: on the Unsloth path the two
    count at the larger, not the sum (the H200's backward peak at micro-batch 1 was the same with the checkpoints on
    the GPU and offloaded). Offloaded checkpoints have nothing on the GPU to overlap."""
    freed = 'activations: layer checkpoints freed as the LoRA gradients fill (backward)'
    for mb in (1, 4):
        e = est(MOE, backend='unsloth_split_lora', tuner='lora', micro_batch=mb)
        ckpt, grads = e.gpu['activations: layer checkpoints'], e.gpu['gradients (LoRA, fp32)']
        assert e.gpu[freed] == pytest.approx(-min(ckpt, grads))
    offloaded = est(MOE, backend='unsloth_split_lora', tuner='lora', checkpoint_offload=True)
    assert freed not in offloaded.gpu
    ddp = est(DENSE, backend='ddp', tuner='lora')  # the HF path's gradients were not examined: still added
    assert freed not in ddp.gpu
