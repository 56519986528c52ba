"""Where a `megatron sft` step goes: the `vora_step_profile` callback (swift_vora/backends/megatron_profile.py) around a
stand-in Megatron-SWIFT trainer on the CPU -- the data wait of every step, one step under torch.profiler with the
model's regions, everything removed after it -- and benchmarks/megatron_step_profile.py's attribution of a trace:
a hand-built one with known answers, and the real chrome trace of that CPU step with a kernel launched by each of
its matrix products (the CPU has no kernels: the launches are what a CUDA trace adds, on the same host ops)."""
import gzip
import json
import os
import sys
import time

import pytest
import torch

from swift_vora import patches
from swift_vora.backends import megatron_profile
from swift_vora.backends.megatron_profile import MegatronStepProfile, Regions, read_data_wait, region_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks'))
import megatron_step_profile as msp  # noqa: E402


# ---- a model whose classes carry megatron-core's names ----------------------------------------------------------
class TopKRouter(torch.nn.Module):
    def __init__(self, h, e):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(e, h) * 0.1)

    def forward(self, x):
        return torch.softmax(x @ self.weight.t(), dim=-1)


class LoraFactor(torch.nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(b, a) * 0.1)

    def forward(self, x):
        return x @ self.weight.t()


class TEGroupedMLP(torch.nn.Module):
    """Experts with a LoRA on fc1, named as mcore-bridge names them (linear_fc1.lora_A.default)."""

    def __init__(self, h, inter):
        super().__init__()
        self.fc1 = torch.nn.Parameter(torch.randn(inter, h) * 0.1)
        self.fc2 = torch.nn.Parameter(torch.randn(h, inter) * 0.1)
        self.linear_fc1 = torch.nn.Module()
        self.linear_fc1.lora_A = torch.nn.ModuleDict({'default': LoraFactor(h, 2)})
        self.linear_fc1.lora_B = torch.nn.ModuleDict({'default': LoraFactor(2, inter)})

    def forward(self, x):
        up = x @ self.fc1.t() + self.linear_fc1.lora_B['default'](self.linear_fc1.lora_A['default'](x))
        return torch.relu(up) @ self.fc2.t()


class MoELayer(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.router = TopKRouter(h, 4)
        self.experts = TEGroupedMLP(h, 32)

    def forward(self, x):
        probs = self.router(x)
        order = torch.argsort(probs[:, 0])  # a stand-in for the token permutation
        return self.experts(x[order])[torch.argsort(order)] * probs[:, :1]


class SelfAttention(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.qkv = torch.nn.Linear(h, 3 * h)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.t(), dim=-1) @ v


class Layer(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.self_attention = SelfAttention(h)
        self.mlp = MoELayer(h)

    def forward(self, x):
        x = x + self.self_attention(x)
        return x + self.mlp(x)


class TransformerBlock(torch.nn.Module):
    """Megatron's full recompute: each layer's forward under a reentrant checkpoint."""

    def __init__(self, h, n):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(h) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)
        return x


class Model(torch.nn.Module):
    def __init__(self, h=16, n=2):
        super().__init__()
        self.decoder = TransformerBlock(h, n)
        self.output_layer = torch.nn.Linear(h, 8)

    def forward(self, x):
        return self.output_layer(self.decoder(x))


class SlowData:
    """A data iterator whose batches take a while (the DataLoader's workers falling behind)."""

    def __init__(self, h=16, wait=0.02):
        self.h, self.wait = h, wait

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(self.wait)
        return torch.randn(6, self.h, requires_grad=True)


class Optimizer:
    """Megatron's optimizer as the trainer calls it: `step()` on an object (MegatronOptimizer is no torch one)."""

    def __init__(self, params):
        self.inner = torch.optim.SGD(params, lr=0.1)

    def step(self):
        self.inner.step()
        self.inner.zero_grad()
        return True, 0.0, None


class Trainer:
    """What the callback reads of Megatron-SWIFT's BaseMegatronTrainer, and its train_step's order of calls."""

    def __init__(self, out):
        self.args = type('Args', (), {'output_dir': str(out), 'tuner_type': 'lora'})()
        self.state = type('State', (), {'iteration': 0})()
        self.model = Model()
        self.unwrapped_models = [self.model]
        self.optimizer = Optimizer(self.model.parameters())
        self.data = SlowData()

    def _replace_data_iterator(self, data_iterator):
        return data_iterator

    def train_step(self, micro_batches=2):
        data = self._replace_data_iterator(self.data)
        for _ in range(micro_batches):  # forward_backward_func: get_batch (next) then forward, then backward
            self.model(next(data)).float().pow(2).mean().backward()
        self.optimizer.step()


@pytest.fixture
def known_upstream(monkeypatch):
    """The two upstream targets taken as checked: Megatron-SWIFT's trainer module imports transformer_engine (CUDA
    only); tests/test_patched_upstream.py checks both targets against the installed sources."""
    for name in ('megatron_data_wait', 'megatron_profile_optimizer'):
        monkeypatch.setitem(patches._checked, name, None)


def run_steps(trainer, callback, steps):
    callback.on_train_begin()
    for _ in range(steps):
        callback.on_step_begin()
        trainer.train_step()
        trainer.state.iteration += 1
        callback.on_step_end()
    callback.on_train_end()


@pytest.fixture(scope='module')
def profiled(tmp_path_factory):
    """Three steps of the stand-in trainer with step 2 profiled: the run's folder and its trainer."""
    out = tmp_path_factory.mktemp('megatron_profile')
    mp = pytest.MonkeyPatch()
    mp.setenv(megatron_profile.ENV, '2')
    for name in ('megatron_data_wait', 'megatron_profile_optimizer'):
        mp.setitem(patches._checked, name, None)
    try:
        torch.manual_seed(0)
        trainer = Trainer(out)
        run_steps(trainer, MegatronStepProfile(trainer), 3)
    finally:
        mp.undo()
    return out, trainer


# ---- the callback ---------------------------------------------------------------------------------------------------
def test_every_step_logs_its_data_wait_and_the_profiled_step_is_marked(profiled):
    out, _ = profiled
    rows = read_data_wait(str(out / 'data_wait.rank0.jsonl'))
    assert [r['iteration'] for r in rows] == [1, 2, 3]
    assert [r['profiled'] for r in rows] == [False, True, False]
    assert all(r['next_calls'] == 2 for r in rows)  # the two micro-batches of each step
    assert all(0.035 <= r['data_wait_s'] <= r['step_host_s'] for r in rows)  # 2 x 20 ms of sleep, inside the step


def test_the_profiled_step_writes_its_tables_and_trace_then_leaves_nothing_behind(profiled):
    out, trainer = profiled
    summary = json.loads((out / 'torch_profile.json').read_text())
    assert summary['step'] == 2 and summary['wall_s'] > 0.035
    assert 'aten::mm' in {e['name'] for e in summary['events']}
    assert not (out / 'torch_profile_stacks.txt').exists()  # no stacks recorded: no grouped tables
    with gzip.open(out / 'torch_trace.json.gz', 'rt') as f:
        names = {e.get('name') for e in json.load(f)['traceEvents']}
    assert {'vora/router', 'vora/experts', 'vora/lora', 'vora/moe_layer', 'vora/attention', 'vora/decoder',
            'vora/output_layer', 'vora/data', 'vora/optimizer'} <= names
    for module in trainer.model.modules():  # every hook removed, the optimizer's own step back
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert 'step' not in trainer.optimizer.__dict__ and trainer.optimizer.step.__func__ is Optimizer.step


def test_no_profile_step_still_logs_the_data_wait(tmp_path, monkeypatch, known_upstream):
    monkeypatch.setenv(megatron_profile.ENV, '0')
    trainer = Trainer(tmp_path)
    run_steps(trainer, MegatronStepProfile(trainer), 2)
    assert len(read_data_wait(str(tmp_path / 'data_wait.rank0.jsonl'))) == 2
    assert not (tmp_path / 'torch_profile.json').exists() and not (tmp_path / 'torch_trace.json.gz').exists()


def test_regions_are_megatron_core_names():
    assert region_of('decoder.layers.0.mlp.experts', 'TEGroupedMLP') == 'vora/experts'
    assert region_of('decoder.layers.0.mlp.shared_experts', 'SharedExpertMLP') == 'vora/shared_expert'
    assert region_of('decoder.layers.0.mlp', 'MLP') == 'vora/mlp'
    assert region_of('decoder.layers.0.self_attention', 'Qwen3_5MoeGatedDeltaNet') == 'vora/gated_deltanet'
    assert region_of('decoder.layers.3.self_attention.core_attention', 'TEDotProductAttention') == \
        'vora/core_attention'
    assert region_of('decoder.layers.0.mlp.experts.linear_fc1.lora_A.default', 'TEGroupedLinear') == 'vora/lora'
    assert region_of('visual.visual', 'Qwen3_5MoeVisionModel') == 'vora/vision_tower'
    assert region_of('decoder.layers.0.input_layernorm', 'RMSNorm') is None


def test_the_launch_names_the_callback_only_when_the_switch_is_set():
    assert not megatron_profile.wanted({})
    assert megatron_profile.wanted({megatron_profile.ENV: '0'}) and megatron_profile.wanted({megatron_profile.ENV:
                                                                                            '13'})
    with pytest.raises(ValueError, match='SWIFT_VORA_PROFILE_STEP'):
        megatron_profile.wanted({megatron_profile.ENV: 'soon'})


def test_regions_put_back_an_instance_step(known_upstream):
    model = Model()
    optimizer = Optimizer(model.parameters())
    own = optimizer.step
    optimizer.step = own  # an instance attribute of its own (a wrapper someone else installed)
    regions = Regions([model], optimizer)
    assert optimizer.step is not own and patches.patched_by(optimizer.step) == 'megatron_profile_optimizer'
    regions.remove()
    assert optimizer.step is own


# ---- the attribution ----------------------------------------------------------------------------------------------
def X(cat, name, ts, dur, tid, **args):
    return {'ph': 'X', 'cat': cat, 'name': name, 'ts': ts, 'dur': dur, 'pid': 1, 'tid': tid, 'args': args}


def launch(ts, tid, corr):
    return X('cuda_runtime', 'cudaLaunchKernel', ts, 2, tid, correlation=corr)


def kernel(name, ts, dur, corr, stream=7):
    return X('kernel', name, ts, dur, stream, correlation=corr)


def hand_built_trace():
    """One micro-batch: data (0-100 us), an expert GEMM and its LoRA forward, their backward on the autograd thread,
    a recomputed Gated DeltaNet forward inside a checkpoint's backward, the optimizer; window 0-1000 us."""
    main, worker = 1, 2
    events = [
        X('user_annotation', 'vora/data', 0, 100, main),
        X('user_annotation', 'enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__', 5, 90, main),
        X('user_annotation', 'vora/moe_layer', 190, 220, main),
        X('user_annotation', 'vora/experts', 200, 200, main),
        X('cpu_op', '_GroupedLinear', 210, 40, main, **{'Sequence number': 10, 'Fwd thread id': 0}),
        launch(220, main, 1),
        X('user_annotation', 'vora/lora', 300, 50, main),
        X('cpu_op', '_GroupedLinear', 305, 20, main, **{'Sequence number': 11, 'Fwd thread id': 0}),
        launch(310, main, 2),
        X('cpu_op', BACKWARD('_GroupedLinearBackward'), 500, 100, worker, **{'Sequence number': 10,
                                                                            'Fwd thread id': 1}),
        launch(510, worker, 3),
        X('cpu_op', BACKWARD('CheckpointFunctionBackward'), 600, 200, worker, **{'Sequence number': 12,
                                                                                'Fwd thread id': 1}),
        X('user_annotation', 'vora/gated_deltanet', 610, 40, worker),
        launch(620, worker, 4),
        X('user_annotation', 'vora/optimizer', 900, 100, main),
        launch(910, main, 5),
        kernel('sm90_xmma_gemm_bf16bf16_bf16f32', 230, 50, 1),
        kernel('nvjet_tst_64x8_64x16_lora', 320, 10, 2),
        kernel('sm90_xmma_gemm_bf16bf16_bf16f32', 520, 40, 3),
        kernel('chunk_gated_delta_rule_fwd_kernel_h', 630, 70, 4),
        kernel('multi_tensor_apply_kernel', 920, 70, 5),
    ]
    return {'traceEvents': events}


def BACKWARD(node):
    return msp.BACKWARD_OP + node


def rows_of(result):
    return {r['part']: r for r in result['rows']}


def test_a_hand_built_step_is_attributed_exactly():
    result = msp.attribute(hand_built_trace())
    rows = rows_of(result)
    assert result['window_ms'] == 1.0 and result['gpu_busy_ms'] == 0.24
    assert rows['data wait']['ms'] == 0.1  # the GPU idle while the loop waited for its batch
    assert rows['expert GEMMs']['busy_ms'] == 0.09  # 50 us forward + 40 us backward, linked by sequence number
    assert rows['expert GEMMs']['phases_ms'] == {'forward': 0.05, 'backward': 0.04}
    assert rows['expert LoRA']['busy_ms'] == 0.01
    assert rows['recompute']['busy_ms'] == 0.07 and rows['recompute']['recomputed_parts_ms'] == {'Gated DeltaNet': 0.07}
    assert rows['optimizer']['busy_ms'] == 0.07
    # every other idle microsecond is the host's, charged to the kernel it was making
    assert rows['host idle']['ms'] == pytest.approx(1.0 - 0.1 - 0.24)
    assert rows['host idle']['phases_ms']['forward: expert GEMMs'] == 0.13  # 100-230 us, after the data arrived
    assert sum(r['ms'] for r in result['rows']) == pytest.approx(result['window_ms'])
    assert result['backward_linked_fraction'] == 1.0 and result['data_wait_fraction'] == 0.1


def test_the_optimizers_host_ops_say_which_python_step_held_the_host():
    """The optimizer's host time by op: the step of a fused Adam that walks its parameters in Python shows as itself,
    the views it takes per tensor counted; ops outside the optimizer's range, or on another thread, are not."""
    trace = hand_built_trace()
    trace['traceEvents'] += [
        X('cpu_op', 'Optimizer.step#FusedAdam.step', 905, 80, 1),
        *[X('cpu_op', 'aten::slice', 930 + i, 1, 1) for i in range(3)],
        X('cpu_op', 'aten::slice', 700, 1, 1),  # before the optimizer
        X('cpu_op', 'aten::slice', 930, 1, 2),  # another thread
    ]
    ops = msp.optimizer_host_ops(trace)
    assert ops == [{'op': 'Optimizer.step#FusedAdam.step', 'count': 1, 'ms': 0.08},
                   {'op': 'aten::slice', 'count': 3, 'ms': 0.003}]
    assert 'On the host inside the optimizer\'s step' in msp.render(msp.attribute(trace))


def test_overlapping_kernels_share_their_overlap():
    trace = hand_built_trace()
    trace['traceEvents'].append(kernel('sm90_xmma_gemm_bf16bf16_bf16f32', 240, 50, 1, stream=8))  # 240-290
    rows = rows_of(msp.attribute(trace))
    # 230-290 busy (60 us) for 100 us of kernels: the two expert GEMMs of corr 1 share 240-280
    assert rows['expert GEMMs']['busy_ms'] == pytest.approx(0.06 + 0.04)
    assert rows['expert GEMMs']['kernels'] == 3


def with_launches(trace, products=('aten::mm', 'aten::addmm', 'aten::bmm')):
    """A CPU trace as a CUDA one reads: every matrix product op launches one kernel (named after it) on stream 7."""
    events = trace['traceEvents']
    ops = [e for e in events if e.get('ph') == 'X' and e.get('cat') == 'cpu_op' and e['name'] in products]
    t_end = max(float(e['ts']) + float(e['dur']) for e in events if e.get('ph') == 'X')
    for corr, op in enumerate(ops, 1):
        ts = float(op['ts'])
        events.append(launch(ts + 0.01, op['tid'], corr))
        events.append(kernel(f'sm90_xmma_gemm_{op["name"]}', t_end + corr * 10, 5, corr))
    return trace


def test_the_real_cpu_trace_of_a_recomputed_moe_step_places_every_product(profiled):
    out, _ = profiled
    with gzip.open(out / 'torch_trace.json.gz', 'rt') as f:
        trace = json.load(f)
    assert 'error' in msp.attribute(trace)  # a CPU profile has no kernels to attribute
    result = msp.attribute(with_launches(trace))
    rows = rows_of(result)
    # forward, the recomputed forward and the backward of each part; the backward placed through its forward op
    assert rows['expert GEMMs']['phases_ms'].keys() == {'forward', 'backward'}
    assert rows['expert LoRA']['phases_ms'].keys() == {'forward', 'backward'}
    assert rows['router']['kernels'] > 0 and rows['attention (projections, norms)']['kernels'] > 0
    assert {'expert GEMMs', 'expert LoRA', 'router', 'attention (projections, norms)'} <= set(
        rows['recompute']['recomputed_parts_ms'])
    assert rows['LM head']['kernels'] >= 3  # its forward and the two products of its backward (no recompute)
    assert 'optimizer' not in rows  # SGD's update is no matrix product
    assert result['backward_linked_fraction'] >= 0.95
    # kernels: forward 2 micro-batches x 2 layers each recomputed once, and every backward product, all placed
    assert UNPLACED_ROWS(rows) == 0


def UNPLACED_ROWS(rows):
    return rows.get(msp.UNPLACED, {}).get('kernels', 0) + rows.get(msp.OUTSIDE, {}).get('kernels', 0)


def test_the_script_writes_the_table(tmp_path):
    path = tmp_path / 'trace.json.gz'
    with gzip.open(path, 'wt') as f:
        json.dump(hand_built_trace(), f)
    assert msp.main([str(path), '--json', str(tmp_path / 'a.json'), '--md', str(tmp_path / 'a.md')]) == 0
    table = (tmp_path / 'a.md').read_text()
    assert '| expert GEMMs | 0.1 |' in table and '| data wait | 0.1 | 10.0 % |' in table
    assert json.loads((tmp_path / 'a.json').read_text())['window_ms'] == 1.0
