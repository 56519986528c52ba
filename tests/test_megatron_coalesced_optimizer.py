"""The coalesced distributed optimizer (backends/megatron_coalesced_optimizer.py) against megatron-core's own
per-tensor path: megatron-core's DistributedOptimizer methods (`step`, `zero_grad`, the gradient copy, the norm's
gradient list) run on an instance laid out as its constructor lays one out -- bf16 parameters as views of a
parameter buffer with alignment padding between them, fp32 main gradients as views of a gradient buffer, two
parameter groups interleaved, two buffers, tensor-parallel attributes that differ. The constructor itself needs CUDA
tensors; the inner optimizer here is an AdamW with fp32 master weights that reads `decoupled_grad`, as Transformer
Engine's FusedAdam does under the precision-aware optimizer (it needs CUDA too)."""
import logging
import types

import pytest

torch = pytest.importorskip('torch')
distrib = pytest.importorskip('megatron.core.optimizer.distrib_optimizer')

from swift_vora.backends import megatron_coalesced_optimizer as co  # noqa: E402

Range = distrib.Range
DistributedOptimizer = distrib.DistributedOptimizer
PAD = 8  # megatron-core aligns each parameter's start in the buffer (64 elements there; smaller here)


class DecoupledAdamW(torch.optim.Optimizer):
    """AdamW with an fp32 master copy per tensor, reading `decoupled_grad` and writing the bf16 tensor back."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            group['step'] = group.get('step', 0) + 1
            beta1, beta2 = group['betas']
            for p in group['params']:
                grad = getattr(p, 'decoupled_grad', None)
                if grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state['master'] = p.detach().float().clone()
                    state['exp_avg'] = torch.zeros_like(state['master'])
                    state['exp_avg_sq'] = torch.zeros_like(state['master'])
                master, m, v = state['master'], state['exp_avg'], state['exp_avg_sq']
                master.mul_(1 - group['lr'] * group['weight_decay'])
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = m / (1 - beta1 ** group['step'])
                v_hat = v / (1 - beta2 ** group['step'])
                master.addcdiv_(m_hat, v_hat.sqrt().add_(group['eps']), value=-group['lr'])
                p.copy_(master)


class Buffer:
    def __init__(self, numel):
        self.param_data = torch.zeros(numel, dtype=torch.bfloat16)
        self.grad_data = torch.zeros(numel, dtype=torch.float32)


class Chunk:
    def start_param_sync(self):
        pass


# (buffer, group, shape, tensor_model_parallel): the order within a buffer is the buffer's order
LAYOUT = [(0, 0, (4, 5), False), (0, 0, (3, 5), False), (0, 1, (2, 2), False), (0, 0, (5, 3), False),
          (0, 0, (7,), False), (1, 0, (6, 2), False), (1, 0, (3, 3), True), (1, 0, (2, 9), True)]


def distributed_optimizer(seed=0, weight_decays=(0.1, 0.0), buckets=None, shard=None):
    """A megatron-core DistributedOptimizer instance laid out over LAYOUT, with the parameter groups megatron-core
    hands the inner optimizer. `shard`: {buffer: (start, end)}, this data-parallel rank's part of a buffer, as
    megatron-core's ranges give it (a parameter across its edge has only its part inside, one outside none); by
    default the whole buffer (one data-parallel rank: each parameter's shard is all of it)."""
    gen = torch.Generator().manual_seed(seed)
    offsets, ends = {}, {0: 0, 1: 0}
    for i, (b, _, shape, _) in enumerate(LAYOUT):
        start = -(-ends[b] // PAD) * PAD
        offsets[i] = start
        ends[b] = start + torch.Size(shape).numel()
    buffers = [Buffer(-(-ends[b] // PAD) * PAD) for b in (0, 1)]
    buckets = buckets or {}  # LAYOUT index -> its bucket (0 unless given)
    params, gbuf_map = [], {}
    gbuf_ranges = [{torch.bfloat16: [{'param_map': {}} for _ in range(2)]} for _ in buffers]
    for i, (b, g, shape, tp) in enumerate(LAYOUT):
        n = torch.Size(shape).numel()
        data = buffers[b].param_data[offsets[i]:offsets[i] + n]
        data.copy_(torch.randn(n, generator=gen))
        p = torch.nn.Parameter(data.view(shape))
        p.main_grad = buffers[b].grad_data[offsets[i]:offsets[i] + n].view(shape)
        p.tensor_model_parallel = tp
        p.allreduce = True
        params.append(p)
        lo, hi = (shard or {}).get(b, (0, buffers[b].param_data.numel()))
        start, end = max(offsets[i], lo), min(offsets[i] + n, hi)
        if start >= end:  # wholly another rank's
            continue
        gbuf_map[p] = (b, torch.bfloat16, buckets.get(i, 0))
        gbuf_ranges[b][torch.bfloat16][buckets.get(i, 0)]['param_map'][p] = {
            'gbuf_world': Range(start, end), 'param': Range(start - offsets[i], end - offsets[i])}
    model_groups = [[p for p, (_, g, _, _) in zip(params, LAYOUT) if g == group and p in gbuf_map]
                    for group in (0, 1)]

    def local(p):
        b, dtype, bucket = gbuf_map[p]
        return gbuf_ranges[b][dtype][bucket]['param_map'][p]['param']

    shards = [[p.detach().view(-1)[local(p).start:local(p).end] for p in group] for group in model_groups]
    for group, shard_group in zip(model_groups, shards):
        for p, s in zip(group, shard_group):
            s.tensor_model_parallel = p.tensor_model_parallel
    inner = DecoupledAdamW([{'params': s, 'weight_decay': wd} for s, wd in zip(shards, weight_decays)])
    opt = object.__new__(DistributedOptimizer)
    opt.optimizer = inner
    opt.config = types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=True, timers=None,
                                       clip_grad=0.0, log_num_zeros_in_grad=False,
                                       reuse_grad_buf_for_mxfp8_param_ag=False)
    opt.ddp_config = types.SimpleNamespace(use_megatron_fsdp=False, overlap_param_gather=False)
    opt.grad_scaler = None
    opt.is_stub_optimizer = False
    opt.model_chunks = [Chunk()]
    opt.buffers = buffers
    opt.gbuf_ranges = gbuf_ranges
    opt.model_param_gbuf_map = gbuf_map
    opt.model_float16_groups = model_groups
    opt.shard_float16_groups = shards
    opt.model_fp32_groups = [[], []]
    opt.shard_fp32_groups = [[], []]
    opt.tp_group = types.SimpleNamespace(rank=lambda: 0)  # megatron-core's optimizers get one; else the global state
    return opt, params


def backward(opt, params, step):
    """What a backward leaves: each parameter's gradient in its main_grad (the padding untouched)."""
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.main_grad.copy_(torch.randn(p.shape, generator=gen))


def train(opt, params, steps=3):
    for step in range(steps):
        backward(opt, params, step)
        opt.step()  # megatron-core's MixedPrecisionOptimizer.step: gradient copy, inner step, parameter copy
        opt.zero_grad()
        for buffer in opt.buffers:
            buffer.grad_data.zero_()
    return [p.detach().clone() for p in params]


def test_coalesced_steps_give_the_per_tensor_parameters_bit_for_bit():
    per_tensor, params_a = distributed_optimizer()
    coalesced, params_b = distributed_optimizer()
    done = co.coalesce(coalesced)
    assert done is not None
    # group 0: [A, B] (C of group 1 sits between B and D), [D, E] in buffer 0; in buffer 1 [F] and [G, H] (other
    # tensor-parallel attributes); group 1: [C]
    assert [[len(run.params) for run in runs] for runs in done.groups] == [[2, 2, 1, 2], [1]]
    assert (done.tensors_before, done.tensors_after) == (8, 5)
    assert [len(g['params']) for g in coalesced.optimizer.param_groups] == [4, 1]
    for a, b in zip(train(per_tensor, params_a), train(coalesced, params_b)):
        assert torch.equal(a, b)
    assert not torch.equal(params_a[0], distributed_optimizer()[1][0])  # the steps did move the weights


def test_a_run_ends_at_a_bucket_boundary_and_the_updates_stay_the_same():
    """With several data-parallel ranks, this rank's shards of two buckets have other ranks' shards between them: a
    run must not span them. Here D and E sit in one buffer, E in the next bucket."""
    per_tensor, params_a = distributed_optimizer(buckets={4: 1})
    coalesced, params_b = distributed_optimizer(buckets={4: 1})
    done = co.coalesce(coalesced)
    assert [[len(run.params) for run in runs] for runs in done.groups] == [[2, 1, 1, 1, 2], [1]]
    assert [run.bucket_index for run in done.groups[0]] == [0, 0, 1, 0, 0]
    for a, b in zip(train(per_tensor, params_a), train(coalesced, params_b)):
        assert torch.equal(a, b)


def test_with_several_data_parallel_ranks_a_parameter_cut_by_the_shard_steps_its_part_only():
    """This rank's shard of each buffer starts or ends inside a parameter (B of buffer 0, G of buffer 1), and A and H
    are other ranks' entirely: the runs hold the parts this rank updates, the updates are the per-tensor ones bit for
    bit, and what lies outside the shard is left to its own rank."""
    shard = {0: (30, 72), 1: (0, 20)}
    per_tensor, params_a = distributed_optimizer(shard=shard)
    coalesced, params_b = distributed_optimizer(shard=shard)
    done = co.coalesce(coalesced)
    assert done is not None
    # group 0: [B's last 9 elements] (C of group 1 between), [D, E]; buffer 1: [F], [G's first 4] (other attributes)
    assert [[len(run.params) for run in runs] for runs in done.groups] == [[1, 2, 1, 1], [1]]
    assert [(run.start, run.end) for run in done.groups[0]] == [(30, 39), (48, 71), (0, 12), (16, 20)]
    before = distributed_optimizer()[1]
    after_a, after_b = train(per_tensor, params_a), train(coalesced, params_b)
    for a, b in zip(after_a, after_b):
        assert torch.equal(a, b)
    assert torch.equal(after_b[0], before[0]) and torch.equal(after_b[7], before[7])  # A, H: other ranks'
    assert torch.equal(after_b[1].view(-1)[:6], before[1].view(-1)[:6])  # B before the shard
    assert not torch.equal(after_b[1].view(-1)[6:], before[1].view(-1)[6:])  # B inside it, stepped


@pytest.mark.parametrize('rank', [0, 1])
def test_the_gradient_norm_sees_the_same_gradients_and_the_views_carry_the_attributes_it_filters_by(rank):
    """On tensor-parallel rank 1 a tensor without `tensor_model_parallel` is a duplicate: left out of the norm."""
    norms, optimizers = [], []
    for coalesce in (False, True):
        opt, params = distributed_optimizer()
        opt.tp_group = types.SimpleNamespace(rank=lambda: rank)
        if coalesce:
            co.coalesce(opt)
        backward(opt, params, 0)
        opt._copy_model_grads_to_main_grads()
        norms.append(torch.sqrt(sum(g.double().pow(2).sum() for g in opt.get_main_grads_for_grad_norm())).item())
        optimizers.append((opt, params))
    assert norms[0] == norms[1]
    params = optimizers[0][1]
    counted = [p for p in params if rank == 0 or p.tensor_model_parallel]
    assert norms[0] == pytest.approx(torch.sqrt(sum(p.main_grad.double().pow(2).sum() for p in counted)).item(),
                                     rel=1e-12)
    views = optimizers[1][0].optimizer.param_groups[0]['params']
    assert [getattr(v, 'tensor_model_parallel', None) for v in views] == [False, False, False, True]


def where(opt, tensor):
    """(buffer, first element, elements) of a gradient view of one of `opt`'s buffers."""
    for b, buffer in enumerate(opt.buffers):
        start = (tensor.data_ptr() - buffer.grad_data.data_ptr()) // tensor.element_size()
        if 0 <= start < buffer.grad_data.numel():
            return b, start, tensor.numel()
    raise AssertionError('not a view of a gradient buffer')


@pytest.mark.parametrize('rank', [0, 1])
def test_the_gradient_norm_is_summed_over_megatrons_own_per_tensor_list_in_its_order(rank):
    """The multi-tensor norm adds squares chunk by chunk per tensor: over the runs it would add them in another order
    (one fp32 rounding apart on an H100, which gradient clipping turns into another update); the coalesced instance
    hands it the very list upstream's per-tensor path builds."""
    per_tensor, params_a = distributed_optimizer()
    coalesced, params_b = distributed_optimizer()
    for opt in (per_tensor, coalesced):
        opt.tp_group = types.SimpleNamespace(rank=lambda: rank)
    co.coalesce(coalesced)
    for opt, params in ((per_tensor, params_a), (coalesced, params_b)):
        backward(opt, params, 0)
        opt._copy_model_grads_to_main_grads()
    upstream = [where(per_tensor, g) for g in per_tensor.get_main_grads_for_grad_norm()]
    assert [where(coalesced, g) for g in coalesced.get_main_grads_for_grad_norm()] == upstream
    assert len(upstream) == (8 if rank == 0 else 2)


def test_a_run_covers_the_padding_and_its_gradient_there_stays_zero():
    opt, params = distributed_optimizer()
    done = co.coalesce(opt)
    first = done.groups[0][0]
    assert (first.start, first.end) == (0, 24 + 15)  # 4x5 padded to 24, then 3x5
    backward(opt, params, 0)
    opt._copy_model_grads_to_main_grads()
    assert torch.count_nonzero(first.shard.decoupled_grad[20:24]) == 0
    assert first.shard.decoupled_grad.data_ptr() == opt.buffers[0].grad_data.data_ptr()


@pytest.mark.parametrize('change, why', [
    (lambda opt: setattr(opt.config, 'use_precision_aware_optimizer_no_fp8_or_ds_fp8', False), 'precision_aware'),
    (lambda opt: setattr(opt, 'model_fp32_groups', [[torch.nn.Parameter(torch.zeros(2))], []]), 'fp32'),
    (lambda opt: setattr(opt.ddp_config, 'use_megatron_fsdp', True), 'Megatron-FSDP'),
    (lambda opt: setattr(opt, 'is_stub_optimizer', True), 'stub'),
    (lambda opt: setattr(opt.config, 'log_num_zeros_in_grad', True), 'log_num_zeros_in_grad'),
    (lambda opt: opt.optimizer.state[opt.optimizer.param_groups[0]['params'][0]].update(exp_avg=1), 'state'),
])
def test_where_it_does_not_apply_the_optimizer_is_left_as_megatron_built_it(change, why, caplog):
    opt, _ = distributed_optimizer()
    change(opt)
    groups = [list(g['params']) for g in opt.optimizer.param_groups]
    with caplog.at_level(logging.INFO, logger='swift'):
        assert co.coalesce(opt) is None
    assert [list(g['params']) for g in opt.optimizer.param_groups] == groups
    assert 'stays per tensor' in caplog.text and why in caplog.text
    assert 'swift_vora_coalesced' not in vars(opt)


def test_a_parameter_outside_its_buffer_leaves_every_group_per_tensor(caplog):
    opt, params = distributed_optimizer()
    moved = params[4]
    moved.data = moved.data.clone()  # no longer a view of the parameter buffer
    groups = [[t.data_ptr() for t in g['params']] for g in opt.optimizer.param_groups]
    with caplog.at_level(logging.WARNING, logger='swift'):
        assert co.coalesce(opt) is None
    assert [[t.data_ptr() for t in g['params']] for g in opt.optimizer.param_groups] == groups
    assert 'does not lie in its gradient buffer' in caplog.text


def test_saving_or_loading_a_coalesced_optimizer_state_is_refused_naming_the_switch():
    opt, _ = distributed_optimizer()
    co.coalesce(opt)
    for name in ('state_dict', 'sharded_state_dict', 'save_parameter_state', 'load_state_dict'):
        with pytest.raises(RuntimeError, match=f'{co.ENV}=per_tensor'):
            getattr(opt, name)({})


def test_the_trainer_callback_coalesces_each_chained_optimizer_only_without_a_saved_optimizer_state(caplog):
    first, _ = distributed_optimizer()
    second, _ = distributed_optimizer(seed=1)
    chained = types.SimpleNamespace(chained_optimizers=[first, second])
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(no_save_optim=False), optimizer=chained, state=None)
    with caplog.at_level(logging.INFO, logger='swift'):
        co.MegatronCoalescedOptimizer(trainer).on_train_begin()
    assert len(first.optimizer.param_groups[0]['params']) == 7
    assert '--no_save_optim false' in caplog.text
    trainer.args.no_save_optim = True
    with caplog.at_level(logging.INFO, logger='swift'):
        co.MegatronCoalescedOptimizer(trainer).on_train_begin()
    assert [len(g['params']) for o in (first, second) for g in o.optimizer.param_groups] == [4, 1, 4, 1]
    assert 'over 10 coalesced runs of the gradient buffers instead of 16 tensors' in caplog.text


def test_the_switch_reads_coalesced_and_defaults_to_per_tensor():
    assert not co.wanted({})
    assert co.wanted({co.ENV: 'coalesced'})
    with pytest.raises(ValueError):
        co.wanted({co.ENV: 'flat'})


def test_the_gpu_check_builds_the_moe_lora_tensor_layout_it_names():
    """scripts/gpu/coalesced_optimizer_check.py (megatron-core's DDP and optimizer need CUDA): one layer of its model
    on the CPU -- 256 experts x 4 expert-parallel LoRA tensors and 8 dense ones, each tensor's gradient its own."""
    import runpy
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / 'scripts' / 'gpu' / 'coalesced_optimizer_check.py'
    check = runpy.run_path(str(script))
    model = check['build_model'](1, seed=0, device='cpu')
    tensors = list(model.parameters())
    assert len(tensors) == 256 * 4 + 8
    assert sum(getattr(p, 'allreduce', True) is False for p in tensors) == 256 * 4
    assert all(p.dtype == torch.bfloat16 for p in tensors)
    model(torch.ones(len(tensors)).tolist()).backward()
    assert torch.equal(tensors[0].grad, (2 * tensors[0].float()).to(torch.bfloat16))
