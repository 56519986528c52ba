"""The MoE path on one GPU, on CPU: the Qwen3.5-MoE checkpoint builder, the runner's prefetch thread and ordered
encoder, the runner's guards on a video run (transformers + PEFT standing in for Unsloth's loader), the merged-expert
check, and the FLOP count of benchmarks/moe_throughput.py."""
import json
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError

import pytest

from swift_vora.backends.prefetch import Batch, EncodePrefetcher, OrderedEncoder
from swift_vora.backends.rank_samples import RankOrder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))


def _batch(i):
    return Batch(inputs={'i': i}, samples=1, tokens=10, supervised_per_sample=[1], rejected=0, encode_s=0.0)


# ---- prefetch ---------------------------------------------------------------------------------------------------
def test_prefetch_hands_batches_over_in_order_and_counts_the_wait():
    made = iter(range(100))

    def slow():
        time.sleep(0.05)
        return _batch(next(made))

    prefetch = EncodePrefetcher(slow, depth=2, first=_batch(-1))
    try:
        got = [prefetch.next().inputs['i'] for _ in range(5)]
    finally:
        prefetch.close()
    assert got == [-1, 0, 1, 2, 3]
    assert prefetch.wait_s > 0.05  # the loop was faster than the encoder: the wait is what it cost


def test_prefetch_raises_the_encoders_error_in_the_training_thread():
    calls = {'n': 0}

    def failing():
        calls['n'] += 1
        if calls['n'] == 2:
            raise SystemExit('every sample was rejected by the template')
        return _batch(calls['n'])

    prefetch = EncodePrefetcher(failing, depth=2)
    assert prefetch.next().inputs['i'] == 1
    with pytest.raises(SystemExit, match='every sample was rejected'):
        prefetch.next()
    assert not prefetch.thread.is_alive()


def test_prefetch_close_stops_a_producer_blocked_on_a_full_queue():
    prefetch = EncodePrefetcher(lambda: _batch(0), depth=1)
    time.sleep(0.2)  # the producer fills the queue and blocks
    prefetch.close(timeout=3)
    assert not prefetch.thread.is_alive()
    assert threading.active_count() >= 1


def test_sample_order_visits_every_row_once_per_epoch():
    order = RankOrder(7, seed=3)
    first, second = [order.next() for _ in range(7)], [order.next() for _ in range(7)]
    assert [p.epoch for p in first + second] == [0] * 7 + [1] * 7
    first, second = [p.index for p in first], [p.index for p in second]
    assert sorted(first) == sorted(second) == list(range(7)) and first != second  # a new shuffle each epoch
    again = RankOrder(7, seed=3)
    assert [again.next().index for _ in range(7)] == first  # seeded: a rerun sees the same order


class Rejected(ValueError):
    """Stands in for swift_vora.template.SampleRejected."""


class FakeTemplate:
    """An encode that takes a random time, rejects every fifth row, and fails if two encodes share it at once."""

    def __init__(self, seed, seconds=0.02):
        self.rng, self.seconds, self.active, self.lock = random.Random(seed), seconds, 0, threading.Lock()
        self.calls = 0

    def encode(self, row):
        with self.lock:
            self.active += 1
            self.calls += 1
            assert self.active == 1, 'two encodes at once on one template'
            pause = self.rng.uniform(0, self.seconds)
        try:
            time.sleep(pause)
            if row % 5 == 0:
                raise Rejected(f'row {row}')
            return {'row': row}
        finally:
            with self.lock:
                self.active -= 1


def _encoded(threads, n=60, seed=7):
    order = RankOrder(23, seed=seed)
    encoder = OrderedEncoder([FakeTemplate(i).encode for i in range(threads)], lambda: order.next().index,
                             rejected=(Rejected, ))
    try:
        got = [encoder.next() for _ in range(n)]
    finally:
        encoder.close()
    return [(g.row, g.sample, str(g.rejection) if g.rejection else None) for g in got]


def test_ordered_encoder_hands_samples_and_rejections_back_in_drawn_order_whatever_the_thread_count():
    serial = _encoded(1)
    order = RankOrder(23, seed=7)
    assert [row for row, _, _ in serial] == [order.next().index for _ in range(60)]  # the seeded order, untouched
    assert {row for row, _, rejected in serial if rejected} == {row for row, _, _ in serial if row % 5 == 0} != set()
    assert all(sample == {'row': row} for row, sample, rejected in serial if not rejected)
    assert _encoded(4) == serial  # random encode times: finished out of order, handed back in order
    assert _encoded(3) == serial


def test_ordered_encoder_never_runs_two_encodes_on_one_template_and_uses_them_all():
    templates = [FakeTemplate(i, seconds=0.03) for i in range(4)]
    running, peak, lock = [0], [0], threading.Lock()

    def counted(template):
        def encode(row):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            try:
                return template.encode(row)  # asserts it is not re-entered
            finally:
                with lock:
                    running[0] -= 1
        return encode

    encoder = OrderedEncoder([counted(t) for t in templates], iter(range(1000)).__next__, ahead=8,
                             rejected=(Rejected, ))
    try:
        got = [encoder.next() for _ in range(80)]
    finally:
        encoder.close()
    assert [g.row for g in got] == list(range(80))
    assert peak[0] > 1 and all(t.calls > 0 for t in templates)  # it did run in parallel, on every template


def test_ordered_encoder_raises_an_unexpected_encode_error_in_the_consumer_at_its_turn():
    def encode(row):
        time.sleep(0.05 if row < 3 else 0)  # the failing row finishes first
        if row == 3:
            raise KeyError('video_grid_thw')
        return row

    encoder = OrderedEncoder([encode] * 4, iter(range(100)).__next__, rejected=(Rejected, ))
    try:
        assert [encoder.next().sample for _ in range(3)] == [0, 1, 2]
        with pytest.raises(KeyError, match='video_grid_thw'):
            encoder.next()
    finally:
        encoder.close()
    serial = OrderedEncoder([encode], iter(range(100)).__next__, rejected=(Rejected, ))
    assert [serial.next().sample for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError):
        serial.next()


def test_ordered_encoder_close_cancels_pending_encodes_and_unblocks_the_prefetch_thread():
    started = []

    def slow(row):
        started.append(row)
        time.sleep(0.5)
        return row

    encoder = OrderedEncoder([slow, slow], iter(range(100)).__next__, ahead=8)
    prefetch = EncodePrefetcher(lambda: _batch(encoder.next().sample), depth=1)
    assert prefetch.next().inputs['i'] == 0  # 8 drawn, 2 running at a time
    t0 = time.perf_counter()
    encoder.close()  # the runner's order: the encoder first, then the prefetcher
    prefetch.close(timeout=3)
    assert time.perf_counter() - t0 < 1.2  # the running encodes (0.5 s), not the 6 queued ones (1.5 s more)
    assert not prefetch.thread.is_alive()
    time.sleep(0.6)
    assert len(started) <= 4  # the queued ones never started
    with pytest.raises(RuntimeError, match='closed'):
        encoder.next()
    queued = OrderedEncoder([slow, slow], iter(range(100)).__next__, ahead=8)
    release, errors = threading.Event(), []
    for _ in range(2):  # both workers busy elsewhere: the consumer waits on an encode that has not started
        queued.pool.submit(release.wait, 5)

    def consume():
        try:
            queued.next()
        except CancelledError as error:
            errors.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    queued.close(timeout=3)
    consumer.join(3)
    release.set()
    assert time.perf_counter() - t0 < 1.0 and not consumer.is_alive() and errors  # told, not left waiting


def test_ordered_encoder_runs_encodes_in_parallel():
    def sleepy(row):
        time.sleep(0.2)
        return row

    encoder = OrderedEncoder([sleepy] * 4, iter(range(100)).__next__, ahead=8)
    t0 = time.perf_counter()
    try:
        assert [encoder.next().sample for _ in range(8)] == list(range(8))
    finally:
        encoder.close()
    assert time.perf_counter() - t0 < 1.0  # 4 threads: ~0.4 s; one after the other: 1.6 s


# ---- the checkpoint builder -------------------------------------------------------------------------------------
def test_35b_a3b_config_is_the_published_shape_cut_to_n_layers():
    from swift_vora.tiny_model import qwen3_5_moe_config
    full = json.load(open(os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')))['text_config']
    c = qwen3_5_moe_config('35b-a3b', 8)
    t = c.text_config
    assert t.num_hidden_layers == 8 and t.layer_types == full['layer_types'][:8]
    assert t.layer_types.count('full_attention') == 2  # the 3:1 Gated DeltaNet / attention pattern kept
    for key in ('hidden_size', 'num_experts', 'num_experts_per_tok', 'moe_intermediate_size',
                'shared_expert_intermediate_size', 'vocab_size', 'head_dim', 'num_attention_heads',
                'num_key_value_heads', 'linear_num_value_heads'):
        assert getattr(t, key) == full[key], key
    assert c.vision_config.out_hidden_size == t.hidden_size  # the merger feeds the text model
    assert t.rope_parameters['mrope_section'] == [11, 11, 10]
    with pytest.raises(ValueError, match='num_layers'):
        qwen3_5_moe_config('35b-a3b', 41)
    with pytest.raises(ValueError, match='shape'):
        qwen3_5_moe_config('30b')


def test_planner_counts_the_model_the_benchmark_builds(tmp_path):
    """The plan for the 8-layer 35B-A3B shape counts the parameters of that model as transformers builds it."""
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    from swift_vora.plan.model_source import load_model_spec
    from swift_vora.tiny_model import qwen3_5_moe_config
    config = qwen3_5_moe_config('35b-a3b', 8)
    config.save_pretrained(tmp_path)
    with torch.device('meta'):
        built = sum(p.numel() for p in Qwen3_5MoeForConditionalGeneration(config).parameters())
    spec = load_model_spec(str(tmp_path))
    assert abs(spec.total_params / built - 1) < 0.01, (spec.total_params, built)


@pytest.fixture(scope='module')
def tiny_q35(tmp_path_factory):
    from swift_vora.tiny_model import build_qwen3_5_moe
    out = str(tmp_path_factory.mktemp('tiny_qwen3_5_moe'))
    counts = build_qwen3_5_moe(out, shape='tiny')
    return out, counts


def test_builder_writes_a_checkpoint_the_qwen3_5_template_ids_match(tiny_q35):
    from transformers import AutoConfig, AutoProcessor
    out, counts = tiny_q35
    config = AutoConfig.from_pretrained(out)
    tok = AutoProcessor.from_pretrained(out).tokenizer
    assert tok.convert_tokens_to_ids('<|video_pad|>') == config.video_token_id == 248057
    assert tok.convert_tokens_to_ids('<|vision_start|>') == config.vision_start_token_id
    assert counts['total'] == counts['language'] + counts['vision'] and 0 < counts['experts'] < counts['language']


# ---- the runner on a video MoE, with its guards --------------------------------------------------------------------
@pytest.mark.slow
def test_runner_trains_qwen3_5_moe_on_video_with_every_guard(tiny_q35, tmp_path, offline_env):
    from swift_vora.synthetic import make_dataset
    model, _ = tiny_q35
    ann = make_dataset(str(tmp_path / 'data'), 2, duration=16.0)
    out = tmp_path / 'out'
    cmd = [sys.executable, '-m', 'swift_vora.backends.unsloth_runner', os.path.join(REPO, 'recipes', 'h200x1.yaml'),
           f'model.path={model}', f'data.dataset={ann}', 'data.window=8', 'data.stride=8', 'video.fps=1',
           'video.max_frames=8', 'video.pair_tokens=16', 'video.min_pair_tokens=4', 'train.max_steps=2',
           'train.micro_batch=1', 'train.grad_accum=2', 'train.dtype=float32', f'train.output_dir={out}',
           'train.lora_rank=4', 'train.warmup_ratio=0',  # both steps update (a warm-up starts at zero, as in swift sft)
           'swift_args.weight_decay=0.02',  # a swift sft optimizer argument, taken by the runner too
           'unsloth.save_merged=false', 'unsloth.gradient_checkpointing=false', '--loader', 'peft']
    proc = subprocess.run(cmd, env=offline_env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [json.loads(line) for line in (out / 'train_log.jsonl').read_text().splitlines()]
    assert [s['step'] for s in steps] == [1, 2] and steps[-1]['samples'] == 4
    assert steps[-1]['tokens'] > 4 * 48 and 'data_wait_s' in steps[-1]  # 48 video tokens per 8-frame clip
    lora = json.loads((out / 'lora_update.json').read_text())
    assert lora['updated'] == lora['tensors'] > 0 and lora['expert_updated'] == lora['expert_tensors'] > 0
    verify = json.loads((out / 'verify_adapter.json').read_text())
    assert verify['ok'] and verify['matched'] == verify['tensors'] == lora['tensors']
    supervision = json.loads((out / 'supervision.rank0.json').read_text())
    assert supervision['per_batch']['count'] == 4 and supervision['per_batch']['zero'] == 0
    phases = [json.loads(line)['phase'] for line in (out / 'memory_phases.rank0.jsonl').read_text().splitlines()]
    assert {'model_loaded', 'forward', 'backward', 'optimizer_step', 'save', 'train_end'} <= set(phases)
    fingerprint = json.loads((out / 'fingerprint.json').read_text())
    assert fingerprint['trainer'] == 'swift_vora.backends.unsloth_runner' and fingerprint['loader'] == 'peft'
    result = json.loads((out / 'unsloth_run_result.json').read_text())
    assert result['expert_lora_tensors'] == lora['expert_tensors']
    assert 'torch_chunk_gated_delta_rule' in result['linear_attention_kernel']  # no fla here: transformers' own
    assert result['encode_threads'] == 4 and 'encoding samples on 4 thread(s)' in proc.stdout  # the default
    # as swift sft builds it (transformers' default adamw_torch_fused, ms-swift's defaults, a cosine schedule)
    assert result['optimizer']['fused'] and result['optimizer']['schedule'] == 'cosine'
    assert result['optimizer']['weight_decay'] == 0.02 and result['optimizer']['decayed_tensors'] > 0
    assert result['optimizer']['set_by_recipe'] == ['weight_decay'] and result['optimizer']['max_grad_norm'] == 1.0


# the optimizer arguments a recipe may give the runner through swift_args, as it would give them to swift sft
SET_BY_RECIPE = {'weight_decay': 0.01, 'adam_beta2': 0.999, 'adam_epsilon': 1e-6, 'warmup_steps': 3,
                 'lr_scheduler_type': 'cosine_with_min_lr', 'lr_scheduler_kwargs': {'min_lr': 1e-6}}


@pytest.mark.parametrize('given', [{}, SET_BY_RECIPE], ids=['ms_swift_defaults', 'set_by_recipe'])
def test_runner_optimizer_and_schedule_are_the_ones_swift_sft_builds_at_the_same_recipe(tmp_path, given):
    """The runner trains with the update `swift sft` would at the same learning rate, warm-up and optimizer
    arguments: HF Trainer's own optimizer and scheduler, built from ms-swift's TrainingArguments, against the
    runner's, on one module with an adapter, a frozen weight, a bias and a norm -- the groups, the settings, the
    learning rate of every step and the parameters after three updates; with ms-swift's defaults and with the
    arguments a recipe sets."""
    import torch
    from swift.trainers.arguments import TrainingArguments
    from transformers import Trainer

    from swift_vora.backends.unsloth_runner import optimizer_and_schedule

    class Adapted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.proj = torch.nn.Linear(8, 8)
            self.proj.weight.requires_grad_(False)  # the frozen base weight; its bias trains, undecayed
            self.norm = torch.nn.LayerNorm(8)
            self.lora_A = torch.nn.Parameter(torch.randn(4, 8))
            self.lora_B = torch.nn.Parameter(torch.randn(3, 8, 4))  # a stack of expert factors

    steps, lr = 40, 1e-4
    warmup_ratio = 0 if 'warmup_steps' in given else 0.05  # ms-swift takes one of the two
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=lr, warmup_ratio=warmup_ratio, max_steps=steps,
                             report_to=[], use_cpu=True, **given)
    theirs_model = Adapted()
    trainer = Trainer(model=theirs_model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    ours_model = Adapted()
    ours, schedule, record = optimizer_and_schedule(torch, ours_model, lr, warmup_ratio, steps, dict(given))

    assert record['fused'] and ours.defaults['fused'] and trainer.optimizer.defaults['fused']
    if given:
        assert (record['weight_decay'], record['betas'], record['eps']) == (0.01, [0.9, 0.999], 1e-6)
        assert (record['schedule'], record['warmup_steps']) == ('cosine_with_min_lr', 3)
        assert record['set_by_recipe'] == sorted(given)
    else:
        assert (record['weight_decay'], record['betas'], record['schedule']) == (0.1, [0.9, 0.95], 'cosine')
        assert record['warmup_steps'] == 2 and record['set_by_recipe'] == []
    assert record['max_grad_norm'] == args.max_grad_norm == 1.0
    assert (record['decayed_tensors'], record['undecayed_tensors']) == (2, 3)
    names = {id(p): n for n, p in theirs_model.named_parameters()}
    our_names = {id(p): n for n, p in ours_model.named_parameters()}
    their_groups = sorted((g['weight_decay'], sorted(names[id(p)] for p in g['params']))
                          for g in trainer.optimizer.param_groups if g['params'])
    our_groups = sorted((g['weight_decay'], sorted(our_names[id(p)] for p in g['params'])) for g in ours.param_groups)
    assert our_groups == their_groups == [(0.0, ['norm.bias', 'norm.weight', 'proj.bias']),
                                          (record['weight_decay'], ['lora_A', 'lora_B'])]
    for key in ('betas', 'eps'):
        assert ours.defaults[key] == trainer.optimizer.defaults[key]

    grads = [{n: torch.randn_like(p) for n, p in ours_model.named_parameters() if p.requires_grad} for _ in range(3)]
    their_lrs, our_lrs = [], []
    for step in range(steps):
        for model, opt, sched, lrs in ((theirs_model, trainer.optimizer, trainer.lr_scheduler, their_lrs),
                                       (ours_model, ours, schedule, our_lrs)):
            lrs.append(sched.get_last_lr()[0])
            if step < len(grads):  # three updates, then the schedule alone
                for n, p in model.named_parameters():
                    p.grad = grads[step][n].clone() if p.requires_grad else None
                opt.step()
            sched.step()
        if step == len(grads) - 1:
            moved = dict(ours_model.named_parameters())
            for n, p in theirs_model.named_parameters():
                torch.testing.assert_close(moved[n], p, rtol=0, atol=0)
            assert not torch.equal(moved['lora_A'], Adapted().lora_A)  # the second and third updates moved it
    assert our_lrs == their_lrs and our_lrs[0] == 0.0 and max(our_lrs) == lr  # the warm-up starts from zero, as there
    if given:  # the schedule's floor, from lr_scheduler_kwargs (plain cosine ends near 2e-7 here)
        assert min(our_lrs[record['warmup_steps']:]) >= 1e-6


def test_runner_clips_gradients_as_hf_trainer_does_and_not_at_a_norm_of_zero():
    """max_grad_norm as swift sft takes it: the gradients scaled to that norm; 0 (or none) leaves them unclipped."""
    import torch

    from swift_vora.backends.unsloth_runner import clip_gradients
    for max_norm, expected in ((1.0, 1.0), (0.0, 6.0), (None, 6.0), (10.0, 6.0)):
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.full((4, ), 3.0)  # norm 6
        clip_gradients(torch, [p], max_norm)
        assert float(p.grad.norm()) == pytest.approx(expected)


def test_runner_forward_runs_the_lora_gemms_in_16_bit_under_autocast_with_fp32_adapters(tiny_q35, tmp_path):
    """The runner's forward is under autocast, as HF Trainer runs `swift sft`: without it every LoRA layer of a bf16
    model computes in fp32 on fp32 copies of its input (the casts and fp32 GEMMs of the full-depth profile)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from swift_vora.backends.unsloth import UnslothRunConfig
    from swift_vora.backends.unsloth_runner import forward_autocast
    model_dir, _ = tiny_q35
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=r'.*language_model.*\.(q_proj|in_proj_qkv|up_proj)$'))
    adapters = [m for n, m in model.named_modules() if n.endswith('lora_A.default')]
    assert adapters and all(m.weight.dtype == torch.float32 for m in adapters)  # PEFT's fp32 adapters
    seen = []
    for m in adapters:
        m.register_forward_hook(lambda mod, args, out: seen.append((args[0].dtype, out.dtype)))
    ids = torch.randint(0, 1000, (1, 24))

    def forward(autocast):
        cfg = UnslothRunConfig(model_path=model_dir, model_type='qwen3_5_moe', dataset=[], output_dir=str(tmp_path),
                               dtype='bfloat16', loader='peft', autocast=autocast)
        info = {}
        dtype = forward_autocast(cfg, model, info)
        seen.clear()
        with torch.autocast('cpu', dtype=dtype, enabled=dtype is not None):
            model(input_ids=ids, labels=ids).loss.backward()
        return dtype, info, set(seen)

    assert forward(False) == (None, {'autocast': None}, {(torch.float32, torch.float32)})  # what the runner did
    dtype, info, dtypes = forward(True)
    assert dtype == torch.bfloat16 and info['autocast'] == 'bfloat16' and info['lora_input_cast_off'] == len(adapters)
    assert dtypes == {(torch.bfloat16, torch.bfloat16)}
    assert all(m.weight.dtype == torch.float32 and m.weight.grad.dtype == torch.float32 for m in adapters)
    cfg32 = UnslothRunConfig(model_path=model_dir, model_type='qwen3_5_moe', dataset=[], output_dir=str(tmp_path),
                             dtype='float32', loader='peft')
    assert forward_autocast(cfg32, model, {}) is None  # nothing to autocast to


# ---- merged experts == base + B@A ------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def expert_adapter(tiny_q35, tmp_path_factory):
    """A PEFT adapter on the tiny Qwen3.5-MoE's fused experts with non-zero, random B (as after training)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText
    model_dir, _ = tiny_q35
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=r'.*language_model.*\.(q_proj|o_proj)$',
                      target_parameters=['mlp.experts.gate_up_proj', 'mlp.experts.down_proj'])
    model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'lora_B' in name:
                p.normal_(0, 0.05)
    out = str(tmp_path_factory.mktemp('adapter'))
    model.save_pretrained(out)
    return model_dir, out


def test_merge_for_vllm_checks_sampled_experts_against_base_plus_delta(expert_adapter, tmp_path):
    from swift_vora.backends.merge import merge
    base, adapter = expert_adapter
    report = merge(adapter, str(tmp_path / 'merged'), base=base)
    check = report['expert_check']
    assert check['ok'] and check['checked'] >= 6 and check['elements_telling'] > 0
    saved = json.loads((tmp_path / 'merged' / 'swift_vora_merge_check.json').read_text())
    assert saved['trained'] and all(c['ok'] for c in saved['checks'])


def test_expert_check_catches_swapped_experts(expert_adapter, tmp_path):
    """A merge that put expert 0's weights on expert 1 (a layout bug) loads fine; the check must fail."""
    import torch
    from safetensors.torch import load_file, save_file

    from swift_vora.backends.expert_merge_check import check_expert_merge
    from swift_vora.backends.merge import merge
    base, adapter = expert_adapter
    merged = tmp_path / 'merged'
    merge(adapter, str(merged), base=base)
    weights = load_file(str(merged / 'model.safetensors'))
    # transformers writes the hub layout, one tensor per expert; swap expert 0 and 1 of layer 0's gate projection
    key0, key1 = (next(k for k in weights if k.endswith(f'layers.0.mlp.experts.{e}.gate_proj.weight')) for e in (0, 1))
    first = weights[key0].clone()
    weights[key0], weights[key1] = weights[key1].clone(), first
    save_file(weights, str(merged / 'model.safetensors'), metadata={'format': 'pt'})
    report = check_expert_merge(adapter, base, str(merged))
    assert not report['ok']
    bad = {(c['tensor'], c['expert']) for c in report['checks'] if not c['ok']}
    assert bad == {('model.language_model.layers.0.mlp.experts.gate_up_proj', 0)}  # expert 1 is not sampled
    assert torch.equal(load_file(str(merged / 'model.safetensors'))[key1], first)


def test_expert_check_holds_one_model_at_a_time_each_where_it_fits(expert_adapter, tmp_path, monkeypatch):
    """At full depth the base (65 GiB in bf16, 140 GB in float32) and the merged copy cannot both be in the H200
    machine's RAM beside the checkpoint's tmpfs: the check loads the base, keeps only the sampled experts, lets it go,
    then loads the merged model -- each on the device the adapter reload would choose (`load_device`)."""
    import gc
    import weakref

    import transformers

    from swift_vora.backends import expert_merge_check
    from swift_vora.backends.merge import merge
    from swift_vora.guards import verify_adapter
    base, adapter = expert_adapter
    merged = tmp_path / 'merged'
    merge(adapter, str(merged), base=base)
    cls = getattr(transformers, json.loads((merged / 'config.json').read_text())['architectures'][0])
    loaded, asked = [], []
    real = cls.from_pretrained.__func__

    def from_pretrained(klass, path, **kwargs):
        gc.collect()
        alive = [p for p, ref in loaded if ref() is not None]
        assert alive == [], f'{alive} still in memory while {path} loads'
        model = real(klass, path, **kwargs)
        loaded.append((path, weakref.ref(model)))
        return model
    monkeypatch.setattr(cls, 'from_pretrained', classmethod(from_pretrained))
    monkeypatch.setattr(verify_adapter, 'load_device', lambda path: asked.append(path))  # None: host RAM
    report = expert_merge_check.check_expert_merge(adapter, base, str(merged))
    assert report['ok'] and report['trained'] and report['checked'] >= 6
    assert [p for p, _ in loaded] == asked == [base, str(merged)]
    assert report['loaded_on'] == {'base': 'cpu', 'merged': 'cpu'}


# ---- benchmarks/moe_throughput.py: the FLOP count ----------------------------------------------------------------
def test_active_lora_parameters_equal_peft_when_every_expert_is_active():
    """With top-k = all experts, the LoRA parameters a token passes through are all of them: PEFT's own count."""
    import moe_throughput as mt
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3_5MoeForConditionalGeneration

    from swift_vora.tiny_model import qwen3_5_moe_config
    config = qwen3_5_moe_config('tiny')
    config.text_config.num_experts_per_tok = config.text_config.num_experts
    with torch.device('meta'):
        model = Qwen3_5MoeForConditionalGeneration(config)
    lora = LoraConfig(r=mt.LORA_RANK, lora_alpha=mt.LORA_ALPHA,
                      target_modules=r'.*language_model.*\.(' + '|'.join(mt.TARGET_MODULES) + r')$',
                      target_parameters=mt.TARGET_PARAMETERS)
    model = get_peft_model(model, lora)
    peft_count = sum(p.numel() for n, p in model.named_parameters() if 'lora_' in n)
    assert mt.lora_params_active(config.text_config.to_dict()) == peft_count


@pytest.mark.slow
def test_moe_benchmark_smoke_runs_both_paths_and_the_flagship_checks(tmp_path):
    """CPU: the tiny Qwen3.5-MoE through the runner (PEFT stand-in, every guard, merge + expert check) and plain
    `swift sft` with --target_parameters; the results JSON carries the keys the issue names."""
    cmd = [sys.executable, os.path.join(REPO, 'benchmarks', 'moe_throughput.py'), '--smoke', '--work', str(tmp_path),
           '--variants', 'vora_unsloth,swift_peft', '--flagship', '--profile-step', '3', '--out', str(tmp_path / 'out'),
           '--flagship-work', str(tmp_path / 'flagship'), '--spill-dir', str(tmp_path / 'spill')]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = [p for p in (tmp_path / 'out').iterdir() if p.name.startswith('moe-h200-')]
    (path,) = [p for p in written if not p.name.endswith('-partial.json')]
    (partial,) = [p for p in written if p.name.endswith('-partial.json')]  # what a call cut short would return
    assert json.loads(partial.read_text())['partial'] is True
    data = json.loads(path.read_text())
    assert 'partial' not in data
    for key in ('model', 'tokens_per_sample', 'video_tokens_per_sample', 'variants', 'swift_vora_variant',
                'baseline_variant', 'speedup'):  # memory_ratio and plan_error need GPU peaks
        assert data.get(key) is not None, key
    assert {'total_params', 'active_params', 'layers'} <= set(data['model'])
    ours, base = data['variants']['vora_unsloth'], data['variants']['swift_peft']
    for v in (ours, base):
        assert v['samples_per_s'] > 0 and v['tokens_per_s'] > 0 and v['flops_per_sample'] > 0 and v['mfu'] >= 0
    assert abs(ours['tokens_per_sample'] - base['tokens_per_sample']) <= 0.1 * base['tokens_per_sample']
    # --profile-step 3: one step past the 2 measured ones, under torch.profiler, and not in the figures
    assert ours['profile']['step'] == 3 and ours['profile']['wall_s'] > 0 and ours['steps'] == 2
    assert data['side_by_side'] is True and 'memory_ratio_floor' not in data  # the floor needs GPU peaks
    flagship = ours['flagship']
    assert flagship['verify_adapter']['ok'] and flagship['merge_exit_code'] == 0 and flagship['merge_check']['ok']
    # the flagship wrote in its own folder; the disk had room for a merged copy, so no shard moved
    assert (tmp_path / 'flagship' / 'vora_unsloth' / 'merge.log').is_file()
    assert flagship['merge_room']['fits'] and flagship['merge_room']['spill']['moved'] == []
    # the MoE levers' records reach the result (what a lever variant's twin comparison checks first)
    assert ours['runner']['moe_gather'] == {'setting': 'index', 'patched': []}
    assert ours['runner']['moe_router'] == {'setting': '0'}
    assert ours['runner']['moe_gate_grad'] == {'setting': 'eager', 'patched': []}
    assert ours['runner']['gdn_qk_heads'] == {'setting': 'repeat'}  # the query/key lever's record: off here
    assert flagship['lora_update']['expert_updated'] == flagship['lora_update']['expert_tensors'] > 0


def test_the_flagship_measurement_is_written_before_its_checks(tmp_path, monkeypatch):
    """At full depth the flagship's merge check takes minutes after the measured steps: the speed reaches the partial
    file before it starts, so a call whose device time ends during the check still returns the measurement."""
    import types

    import moe_throughput as mt
    order = []
    monkeypatch.setattr(mt.tp, 'run_logged', lambda *a, **k: None)
    monkeypatch.setattr(mt.tp, 'wait_logged', lambda *a, **k: 0)
    monkeypatch.setattr(mt, 'summarize_runner', lambda name, *a: {'variant': name, 'tokens_per_s': 12500.0})
    monkeypatch.setattr(mt, 'flagship_room', lambda *a: {'fits': True})

    class CutShort(BaseException):
        """the machine taken back during the check"""

    def checks(*a):
        order.append('checks')
        raise CutShort

    monkeypatch.setattr(mt, 'flagship_checks', checks)
    args = types.SimpleNamespace(flagship_work=str(tmp_path / 'flagship'), spill_dir=None, profile_step=None,
                                 fla_path='', variant_timeout=None, spy_after=None, steps=12, grad_accum=1,
                                 hardware=None, workers=0, smoke=True, shape='tiny', layers=None)
    b = mt.budget(True)
    inputs = {'model': str(tmp_path / 'model'), 'annotations': str(tmp_path / 'a.jsonl')}
    with pytest.raises(CutShort):
        mt.run_vora('vora_unsloth', args, b, inputs, str(tmp_path), flagship=True, fla=False,
                    measured=lambda so_far: order.append(('measured', so_far['tokens_per_s'], so_far['flagship'])))
    assert order[0][:2] == ('measured', 12500.0) and order[0][2].startswith('checks running') and order[1] == 'checks'
    order.clear()
    mt.run_vora('vora_unsloth', args, b, inputs, str(tmp_path), flagship=False, fla=False,
                measured=lambda so_far: order.append('measured'))
    assert order == []  # a speed run's partial is written after it, as every variant's


def test_moe_headline_keeps_the_defaults_apart_from_an_opt_in_lever():
    """Call j's `speedup` was the opt-in rank-scale lever's (the fastest variant); what a user gets from the shipped
    recipe is `speedup_default` / `plan_error_default`, from the defaults' own run of the same call."""
    import moe_throughput as mt
    planned = {'gpu_peak_gib': 102.0, 'gpu_reserved_gib': 100.0}
    payload = {'model': {'layers': 8, 'layer_types': ['x'] * 8}, 'variants': {
        'swift_peft': {'tokens_per_s': 1000.0, 'peak_reserved_gib': 80.0},
        mt.DEFAULT_VARIANT: {'tokens_per_s': 10500.0, 'peak_reserved_gib': 92.0, 'planned': planned},
        mt.DEFAULT_VARIANT + '_rank_scale': {'tokens_per_s': 10600.0, 'peak_reserved_gib': 90.0, 'planned': planned}}}
    mt.headline(payload, {}, {'total': 10 * 2**30})
    assert payload['swift_vora_variant'] == mt.DEFAULT_VARIANT + '_rank_scale' and payload['speedup'] == 10.6
    assert payload['default_variant'] == mt.DEFAULT_VARIANT and payload['speedup_default'] == 10.5
    assert payload['plan_error'] == -0.1 and payload['plan_error_default'] == -0.08
    without = {'model': {}, 'variants': {'swift_peft': {'tokens_per_s': 1000.0},
                                         'vora_unsloth': {'tokens_per_s': 5000.0}}}
    mt.headline(without, {}, {'total': 1})
    assert 'speedup_default' not in without and without['speedup'] == 5.0


# ---- what the launch sets for Unsloth ------------------------------------------------------------------------------
def test_unsloth_block_compile_is_off_unless_the_user_sets_it():
    from swift_vora.backends.unsloth import unsloth_env
    assert unsloth_env(environ={})['UNSLOTH_BLOCK_COMPILE'] == '0'
    assert 'UNSLOTH_BLOCK_COMPILE' not in unsloth_env(environ={'UNSLOTH_BLOCK_COMPILE': '1'})


def test_fla_kernel_on_hopper_with_an_affected_triton_is_reported(monkeypatch):
    import types

    import torch

    from swift_vora.backends.unsloth_runner import linear_attention_risk
    kernel = 'fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule'
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: (9, 0))
    for version, reported in (('3.6.0', True), ('3.7.1', False), ('3.3.1', False)):
        monkeypatch.setitem(sys.modules, 'triton', types.SimpleNamespace(__version__=version))
        assert bool(linear_attention_risk(kernel)) is reported, version
    monkeypatch.setitem(sys.modules, 'triton', types.SimpleNamespace(__version__='3.6.0'))
    assert linear_attention_risk('transformers torch_chunk_gated_delta_rule (PyTorch reference)') is None
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: (8, 0))  # A100: not affected
    assert linear_attention_risk(kernel) is None


def test_fla_with_unsloths_hopper_tile_step_down_is_not_reported(monkeypatch):
    """unsloth_zoo's vendored fla (and an installed fla it patched) avoids #640's BK=64 tile: no false alarm."""
    import types

    import torch

    from swift_vora.backends.unsloth_runner import fla_hopper_workaround, linear_attention_risk
    kernel = 'fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule'
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: (9, 0))
    monkeypatch.setitem(sys.modules, 'triton', types.SimpleNamespace(__version__='3.6.0'))
    plain = types.SimpleNamespace(chunk_bwd_dqkwg=lambda *a: None)
    monkeypatch.setitem(sys.modules, 'fla.ops.common.chunk_o', plain)
    assert fla_hopper_workaround() is None and linear_attention_risk(kernel)  # upstream fla < 0.6: reported
    vendored = types.SimpleNamespace(_is_hopper_tensor=lambda k: True, chunk_bwd_dqkwg=lambda *a: None)
    monkeypatch.setitem(sys.modules, 'fla.ops.common.chunk_o', vendored)
    assert 'vendored' in fla_hopper_workaround() and linear_attention_risk(kernel) is None

    def patched(*a):
        return None
    patched._unsloth_hopper_dqkwg_patched = True
    monkeypatch.setitem(sys.modules, 'fla.ops.common.chunk_o', types.SimpleNamespace(chunk_bwd_dqkwg=patched))
    assert 'patched' in fla_hopper_workaround() and linear_attention_risk(kernel) is None


def test_step_profiler_profiles_only_the_asked_step(tmp_path, monkeypatch):
    """SWIFT_VORA_PROFILE_STEP=2: step 2's ops (and only its) land in torch_profile.txt / .json."""
    import torch

    from swift_vora.backends.step_profile import StepProfiler
    monkeypatch.setenv('SWIFT_VORA_PROFILE_STEP', '2')
    profiler = StepProfiler(str(tmp_path))
    x = torch.randn(64, 64)
    for n in (1, 2, 3):
        with profiler.step(n):
            (x @ x if n == 2 else x + x).sum()
        if n == 1:
            assert profiler.written is None and not (tmp_path / 'torch_profile.json').exists()
    data = json.loads((tmp_path / 'torch_profile.json').read_text())
    assert data['step'] == 2 and data['wall_s'] > 0
    names = [e['name'] for e in data['events']]
    assert 'aten::mm' in names and 'aten::add' not in names  # step 3's add was not recorded
    assert (tmp_path / 'torch_profile.txt').read_text().startswith('optimizer step 2:')
    # where each op came from: this test's line calls the matmul; its shapes are the two 64 x 64 operands
    stacks = (tmp_path / 'torch_profile_stacks.txt').read_text()
    assert 'aten::mm' in stacks and 'test_moe_unsloth.py' in stacks
    assert '[[64, 64], [64, 64]]' in (tmp_path / 'torch_profile_shapes.txt').read_text()
    monkeypatch.setenv('SWIFT_VORA_PROFILE_STEP', 'two')
    with pytest.raises(ValueError, match='SWIFT_VORA_PROFILE_STEP'):
        StepProfiler(str(tmp_path))


@pytest.mark.parametrize('field', ['flat', 'nested'])
def test_merge_refuses_an_expert_lora_packed_the_way_peft_misreads(expert_adapter, tmp_path, field):
    """unsloth_zoo records a grouped_by_expert lora_B packing in adapter_config.json; PEFT would read it as rank_major
    (same shapes) and merge scrambled experts that its own delta agrees with: refused before any work, naming the
    file and the field."""
    import shutil

    from swift_vora.backends.merge import MergeError, merge
    base, adapter = expert_adapter
    copy = tmp_path / 'adapter'
    shutil.copytree(adapter, copy)
    config = json.loads((copy / 'adapter_config.json').read_text())
    if field == 'flat':
        config['lora_B_layout'] = 'grouped_by_expert'
    else:
        config['unsloth_fused_expert_lora'] = {'lora_A_layout': 'grouped_by_expert', 'parameters': {
            'mlp.experts.gate_up_proj': {'lora_B_layout': 'rank_major', 'num_experts': 4},
            'mlp.experts.down_proj': {'lora_B_layout': 'mixed', 'num_experts': 4}}}
    (copy / 'adapter_config.json').write_text(json.dumps(config))
    with pytest.raises(MergeError) as info:
        merge(str(copy), str(tmp_path / 'merged'), base=base)
    message = str(info.value)
    assert str(copy / 'adapter_config.json') in message
    assert ("lora_B_layout='grouped_by_expert'" if field == 'flat'
            else "parameters.mlp.experts.down_proj.lora_B_layout='mixed'") in message
    assert 'gate_up_proj' not in message  # the rank_major entry is fine
    assert not (tmp_path / 'merged').exists()
    config.pop('lora_B_layout', None)
    config['unsloth_fused_expert_lora'] = {'lora_B_layout': 'rank_major', 'parameters': {
        'mlp.experts.gate_up_proj': {'lora_B_layout': 'rank_major', 'num_experts': 4}}}
    config['lora_B_layout'] = 'rank_major'  # what the current unsloth_zoo writes: merged and checked as before
    (copy / 'adapter_config.json').write_text(json.dumps(config))
    assert merge(str(copy), str(tmp_path / 'merged'), base=base)['expert_check']['ok']


def test_moe_benchmark_variant_overrides_reach_the_recipe_before_the_runner_flags():
    """vora_unsloth_gpu_ckpt: its recipe override is one of the overrides `swift-vora train` reads, not an argument
    after the runner's own flags (where the smoke's runner would refuse it)."""
    import argparse
    import importlib.util
    path = os.path.join(REPO, 'benchmarks', 'moe_throughput.py')
    spec = importlib.util.spec_from_file_location('moe_throughput', path)
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)
    args = argparse.Namespace(steps=2, grad_accum=1, profile_step=None, smoke=True)
    gpu_ckpt = ['unsloth.gradient_checkpointing=true']
    cmd = moe.vora_command(args, moe.budget(True), '/m', '/a.jsonl', '/o', False, gpu_ckpt)
    assert cmd.index('unsloth.gradient_checkpointing=true') < cmd.index('--loader')
    args.smoke = False
    cmd = moe.vora_command(args, moe.budget(False), '/m', '/a.jsonl', '/o', False, gpu_ckpt)
    assert cmd[-1] == 'unsloth.gradient_checkpointing=true' and 'train.max_steps=2' in cmd


def test_prefetched_batches_are_pinned_for_a_cuda_device(monkeypatch):
    """The producer thread pins the batch's CPU tensors (direct, non-blocking copies in the training thread) when a
    CUDA device will receive them; other values pass through; without CUDA nothing is touched."""
    import torch

    from swift_vora.backends.prefetch import pin_tensors
    batch = {'input_ids': torch.ones(1, 4, dtype=torch.long), 'pixel_values_videos': torch.zeros(8, 6),
             'video_grid_thw': [[1, 2, 2]]}
    assert pin_tensors(batch) is batch  # no CUDA here: untouched
    pinned = []

    def fake_pin(self):
        pinned.append(tuple(self.shape))
        return self.clone()
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.Tensor, 'pin_memory', fake_pin)
    out = pin_tensors(batch)
    assert sorted(pinned) == [(1, 4), (8, 6)]
    assert out['video_grid_thw'] is batch['video_grid_thw'] and torch.equal(out['input_ids'], batch['input_ids'])


def test_runner_lora_check_names_the_adapters_that_never_changed(tmp_path, monkeypatch):
    """The Unsloth runner's lora_update check fails as the swift sft and Megatron guards do: what was counted, the
    tensors that never changed by name, and where to look; lora_update.json is written first."""
    import torch

    from swift_vora.backends.runner_guards import RunnerGuards
    from swift_vora.guards.common import GuardError

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.ModuleDict({'lora_A': torch.nn.Linear(4, 2, bias=False),
                                             'lora_B': torch.nn.Linear(2, 4, bias=False)})

    monkeypatch.setenv('SWIFT_VORA_LORA_CHECK_STEPS', '1')
    model = Tiny()
    guards = RunnerGuards(model, str(tmp_path))
    guards.tracker.snapshot()
    with torch.no_grad():
        model.proj['lora_B'].weight.add_(1.0)  # lora_B moved, lora_A did not
    with pytest.raises(GuardError, match=r'1 of 2 adapter tensors updated after 1 steps .*Never changed: '
                                         r'proj\.lora_A\.weight\. A frozen adapter trains nothing'):
        guards.after_step(1, lr=1e-4)
    report = json.load(open(tmp_path / 'lora_update.json'))
    assert report['not_updated'] == ['proj.lora_A.weight'] and report['by_kind']['B'] == {'updated': 1, 'total': 1}


def test_runner_lora_check_reports_not_checked_when_too_few_steps_updated(tmp_path):
    """A run that ends before two steps with a rate above zero (the warm-up's first step is at zero, as in swift sft)
    leaves a lora_update.json that says the check did not run and why -- not no report."""
    import torch

    from swift_vora.backends.runner_guards import RunnerGuards
    model = torch.nn.ModuleDict({'proj': torch.nn.ModuleDict({'lora_A': torch.nn.Linear(4, 2, bias=False),
                                                              'lora_B': torch.nn.Linear(2, 4, bias=False)})})
    guards = RunnerGuards(model, str(tmp_path))
    assert guards.check_steps == 2  # the default
    guards.tracker.snapshot()
    assert guards.after_step(1, lr=0.0) is None and guards.after_step(2, lr=1e-4) is None  # one counted of two
    report = guards.lora_not_checked()
    assert json.load(open(tmp_path / 'lora_update.json')) == report
    assert report['steps_counted'] == 1 and report['check_after_steps'] == 2 and report['tensors'] == 2
    assert report['note'] == 'training ended after 1 counted optimizer step(s), fewer than 2: not checked'


def test_moe_calls_derives_the_spread_and_speedups_from_the_result_files(tmp_path):
    """benchmarks/moe_calls.py: per-call median tokens/s, the spread across calls, the speed-up of each call's fastest
    swift-vora variant over its plain swift -- computed from the files, a call without plain swift gets none."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls

    def call(name, variants, partial=False, command=None):
        (tmp_path / name).write_text(json.dumps({'date': 'd', 'partial': partial, 'model': {'layers': 40},
                                                  'variants': variants, 'command': command}))

    call('moe-h200-full-a.json', {'swift_peft': {'tokens_per_s': 1000.0}, 'vora_unsloth': {'tokens_per_s': 5000.0},
                                  'vora_unsloth_mb4': {'tokens_per_s': 9000.0}, 'vora_x': {'failed': 'oom'}})
    call('moe-h200-full-b-partial.json', {'vora_unsloth_mb4': {'tokens_per_s': 9900.0}}, partial=True)
    # a call that finished leaves its partial file next to its final one: one call, not two
    call('moe-h200-full-c-d.json', {'swift_peft': {'tokens_per_s': 1100.0}}, command='run c')
    call('moe-h200-full-c-partial.json', {'swift_peft': {'tokens_per_s': 1100.0}}, partial=True, command='run c')
    s = moe_calls.summarize(moe_calls.load('moe-h200-full-[ab]*.json', str(tmp_path)))
    assert [c['file'] for c in moe_calls.load('moe-h200-full-c*.json', str(tmp_path))] == ['moe-h200-full-c-d.json']
    assert [c['file'] for c in s['calls']] == ['moe-h200-full-a.json', 'moe-h200-full-b-partial.json']
    assert s['variants']['vora_unsloth_mb4']['spread'] == 0.1 and s['variants']['swift_peft']['spread'] is None
    assert 'vora_x' not in s['variants']
    assert s['speedup_per_call'] == [{'file': 'moe-h200-full-a.json', 'ours': 'vora_unsloth_mb4',
                                      'speedup_median': 9.0,
                                      'by_variant': {'vora_unsloth': 5.0, 'vora_unsloth_mb4': 9.0}}]
    assert 'vora_unsloth_mb4 / swift_peft = 9.0x (median steps); in the same call vora_unsloth 5.0x' in \
        moe_calls.render(s)
    # plain swift of the fastest run's own call is side by side, not "across calls"
    assert s['speedup_across_calls'] == [{'ours': 'vora_unsloth_mb4', 'ours_file': 'moe-h200-full-b-partial.json',
                                          'plain_file': 'moe-h200-full-a.json', 'speedup_median': 9.9}]
    both = moe_calls.summarize(moe_calls.load('moe-h200-full-a.json', str(tmp_path)))
    assert both['speedup_across_calls'] == []
    assert '| vora_unsloth_mb4 | 9,000 | 9,900 | 10.0 % |' in moe_calls.render(s)


def test_moe_calls_keeps_runs_of_the_fp32_lora_runner_apart_from_autocast_runs(tmp_path):
    """A swift-vora variant of a file written before the runner's forward ran under autocast (or whose runner says
    `autocast: null`) is the fp32-LoRA setting: compared with `_fp32_lora` runs, never with the faster default."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    old = {'date': '2026-12-02', 'model': {'layers': 40},
           'variants': {'swift_peft': {'tokens_per_s': 1000.0}, 'vora_unsloth_mb4': {'tokens_per_s': 9500.0}}}
    new = {'date': '2026-12-03', 'model': {'layers': 40},
           'variants': {'vora_unsloth_mb4': {'tokens_per_s': 10600.0, 'runner': {'autocast': 'bfloat16',
                                                                                  'encode_threads': 4},
                                             'median_step_s': 3.0, 'losses': [10.0, 8.08]},
                        'vora_unsloth_mb4_fp32_lora': {'tokens_per_s': 9100.0, 'runner': {'autocast': None},
                                                       'median_step_s': 3.6, 'losses': [10.0, 8.0]},
                        'vora_unsloth_mb2': {'tokens_per_s': 8000.0, 'runner': {'autocast': None}}}}
    (tmp_path / 'moe-h200-full-a.json').write_text(json.dumps(old))
    (tmp_path / 'moe-h200-full-e.json').write_text(json.dumps(new))
    s = moe_calls.summarize(moe_calls.load('moe-h200-full-*.json', str(tmp_path)))
    assert [r['tokens_per_s'] for r in s['variants']['vora_unsloth_mb4_fp32_lora']['calls']] == [9500.0, 9100.0]
    assert [r['tokens_per_s'] for r in s['variants']['vora_unsloth_mb4']['calls']] == [10600.0]
    assert 'vora_unsloth_mb2_fp32_lora' in s['variants'] and 'vora_unsloth_mb2' not in s['variants']
    assert s['speedup_per_call'] == [{'file': 'moe-h200-full-a.json', 'ours': 'vora_unsloth_mb4_fp32_lora',
                                      'speedup_median': 9.5, 'by_variant': {'vora_unsloth_mb4_fp32_lora': 9.5}}]
    assert s['speedup_across_calls'] == [{'ours': 'vora_unsloth_mb4', 'ours_file': 'moe-h200-full-e.json',
                                          'plain_file': 'moe-h200-full-a.json', 'speedup_median': 10.6}]
    assert s['autocast_vs_fp32_lora'] == [{'file': 'moe-h200-full-e.json', 'variant': 'vora_unsloth_mb4', 'losses': 2,
                                           'loss_max_rel_diff_vs_fp32_lora': 0.01, 'median_step_ratio': 1.2}]


def test_moe_calls_reads_megatron_results_and_their_levers(tmp_path):
    """benchmarks/megatron_moe.py's files (the model as text): a Megatron lever against its twin of the same call,
    and the fastest Megatron variant over the Unsloth path -- side by side where both ran in one call, else against
    each call on the same GPU, said to be not side by side."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    h100 = {'gpu': 'NVIDIA H100 80GB HBM3'}
    step = {'losses': [12.0, 10.0]}
    files = {
        'megatron-a.json': {'machine': h100, 'variants': {
            'mg_mb2_cutlass': {'tokens_per_s': 7500.0, 'median_step_s': 4.0, **step},
            'mg_mb2_cutlass_nofusion': {'tokens_per_s': 6000.0, 'median_step_s': 5.0, **step}}},
        'megatron-b.json': {'machine': h100, 'variants': {'vora_unsloth_best': {'tokens_per_s': 30000.0}}},
        'megatron-c.json': {'machine': {'gpu': 'NVIDIA H200'}, 'variants': {
            'mg_mb2': {'tokens_per_s': 5000.0}, 'vora_unsloth_best': {'tokens_per_s': 40000.0}}},
        # the first Megatron file wrote its machine as text and its command as a list of words
        'megatron-d.json': {'machine': 'NVIDIA H200 x1', 'command': ['bash', 'megatron_smoke.sh'], 'variants': {
            'mg_mb2_cutlass': {'tokens_per_s': 4000.0, 'median_step_s': 2.0, **step},
            'mg_mb2_cutlass_gmm': {'tokens_per_s': 8000.0, 'median_step_s': 1.0, **step}}},
        'megatron-e.json': {'machine': h100, 'variants': {
            'mg_mb2_cutlass': {'tokens_per_s': 6000.0, 'median_step_s': 5.0, **step}}},
        'megatron-f.json': {'machine': h100, 'variants': {
            'mg_mb2_cutlass_pao': {'tokens_per_s': 15000.0, 'median_step_s': 2.0, **step}}},
        # the recipe as shipped runs what mg_mb4_te_ce_gmm_pao ran: the twin of its _glora lever in the same call
        'megatron-g.json': {'machine': h100, 'variants': {
            'mg_shipped': {'tokens_per_s': 13000.0, 'median_step_s': 3.0, **step},
            'mg_mb4_te_ce_gmm_pao_glora': {'tokens_per_s': 19500.0, 'median_step_s': 2.0, 'losses': [12.0, 10.1]}}},
    }
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps({'date': 'd', 'model': 'random Qwen3.5-MoE', **data}))
    s = moe_calls.summarize(moe_calls.load('megatron-*.json', str(tmp_path)))
    assert s['nofusion_vs_twin'] == [{'file': 'megatron-a.json', 'variant': 'mg_mb2_cutlass_nofusion',
                                      'twin': 'mg_mb2_cutlass', 'twin_file': 'megatron-a.json', 'same_call': True,
                                      'losses': 2, 'loss_max_rel_diff': 0.0, 'median_step_ratio': 0.8}]
    assert s['gmm_vs_twin'] == [{'file': 'megatron-d.json', 'variant': 'mg_mb2_cutlass_gmm', 'twin': 'mg_mb2_cutlass',
                                 'twin_file': 'megatron-d.json', 'same_call': True, 'losses': 2,
                                 'loss_max_rel_diff': 0.0, 'median_step_ratio': 2.0}]
    assert s['glora_vs_twin'] == [{'file': 'megatron-g.json', 'variant': 'mg_mb4_te_ce_gmm_pao_glora',
                                   'twin': 'mg_shipped', 'twin_file': 'megatron-g.json', 'same_call': True,
                                   'losses': 2, 'loss_max_rel_diff': 0.01, 'median_step_ratio': 1.5}]
    # a lever run in a call of its own: against its twin of each other call on the same GPU, said so
    assert [(t['twin_file'], t['same_call'], t['median_step_ratio']) for t in s['pao_vs_twin']] == [
        ('megatron-a.json', False, 2.0), ('megatron-e.json', False, 2.5)]
    assert ('megatron-f.json: mg_mb2_cutlass_pao (precision-aware optimizer) against mg_mb2_cutlass of '
            'megatron-a.json (same GPU, not side by side): 2.0x') in moe_calls.render(s)
    assert [r for r in s['megatron_over_unsloth'] if r['file'] in ('megatron-a.json', 'megatron-c.json')] == [
        {'file': 'megatron-a.json', 'megatron': 'mg_mb2_cutlass', 'unsloth_file': 'megatron-b.json', 'same_call': False,
         'ratio': 0.25},
        {'file': 'megatron-c.json', 'megatron': 'mg_mb2', 'unsloth_file': 'megatron-c.json', 'same_call': True,
         'ratio': 0.125}]  # megatron-d ran on no card an Unsloth run shares
    text = moe_calls.render(s)
    assert 'mg_mb2_cutlass / vora_unsloth_best of megatron-b.json (same GPU, not side by side) = 0.25x' in text
    assert 'mg_mb2 / vora_unsloth_best of the same call = 0.125x' in text


def test_moe_calls_keeps_autocast_runs_before_the_encode_pool_apart(tmp_path):
    """Call e ran under autocast but with one encode thread and Unsloth's per-frame vision attention (its runner
    reports no `encode_threads`): `_serial`, so the spread across calls never mixes that code change with noise."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    for name, runner, tps in (('e', {'autocast': 'bfloat16'}, 10644.0),
                              ('f', {'autocast': 'bfloat16', 'encode_threads': 4}, 11420.0)):
        (tmp_path / f'moe-h200-full-{name}.json').write_text(json.dumps(
            {'date': '2026-12-03', 'model': {'layers': 40},
             'variants': {'vora_unsloth_mb4': {'tokens_per_s': tps, 'runner': runner}}}))
    s = moe_calls.summarize(moe_calls.load('moe-h200-full-*.json', str(tmp_path)))
    assert [r['tokens_per_s'] for r in s['variants']['vora_unsloth_mb4_serial']['calls']] == [10644.0]
    assert [r['tokens_per_s'] for r in s['variants']['vora_unsloth_mb4']['calls']] == [11420.0]


def test_step_profile_does_not_count_gpu_annotations_as_kernels(tmp_path):
    """Inductor wraps each compiled graph's kernels in a GPU user annotation ('## Call CompiledFxGraph ... ##'): its
    device time spans kernels already counted, so it is not a kernel (call f's profile read 100 % busy through it)."""
    from swift_vora.backends.step_profile import write_profile

    class Event:
        def __init__(self, key, us, annotation=False):
            self.key, self.self_device_time_total, self.count = key, us, 1
            self.device_type, self.self_cpu_time_total, self.is_user_annotation = 'DeviceType.CUDA', 0.0, annotation

    class Events(list):
        def table(self, **_):
            return '\n'.join(e.key for e in self)

    class Prof:
        def key_averages(self, **_):
            return Events([Event('gemm_kernel', 600_000.0), Event('## Call CompiledFxGraph abc ##', 400_000.0, True),
                           Event('## Call CompiledFxGraph def ##', 100_000.0)])

    data = json.loads(open(write_profile(Prof(), str(tmp_path), 13, 1.0)).read())
    assert data['device_kernel_s'] == 0.6 and data['device_busy_fraction'] == 0.6
    assert [e['name'] for e in data['events'] if e['kernel']] == ['gemm_kernel']
    # a file written before: the annotations flagged as kernels, recounted
    from swift_vora.backends.step_profile import recount
    old = {'wall_s': 1.0, 'device_kernel_s': 1.1, 'events': [
        {'name': 'gemm_kernel', 'device_us': 600_000.0, 'kernel': True},
        {'name': '## Call CompiledFxGraph abc ##', 'device_us': 400_000.0, 'kernel': True},
        {'name': '## Call CompiledFxGraph def ##', 'device_us': 100_000.0, 'kernel': True}]}
    assert recount(old) == {'device_kernel_s': 0.6, 'annotation_s': 0.5, 'device_busy_fraction': 0.6}


def test_moe_calls_compares_the_rank_scale_lever_with_its_twin_of_the_same_call(tmp_path):
    """`*_rank_scale` (SWIFT_VORA_MOE_LORA_SCALE=rank) against the same variant without it, in its own call: the step
    ratio and the logged losses step by step (the lever must not change what is learned)."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    runner = {'autocast': 'bfloat16', 'encode_threads': 4}
    call = {'date': '2026-12-04', 'model': {'layers': 40},
            'variants': {'vora_unsloth_mb4': {'tokens_per_s': 11400.0, 'runner': runner, 'median_step_s': 2.75,
                                              'losses': [10.0, 8.0]},
                         'vora_unsloth_mb4_rank_scale': {'tokens_per_s': 11750.0, 'runner': runner,
                                                         'median_step_s': 2.5, 'losses': [10.0, 8.0]}}}
    (tmp_path / 'moe-h200-full-j.json').write_text(json.dumps(call))
    s = moe_calls.summarize(moe_calls.load('moe-h200-full-*.json', str(tmp_path)))
    assert s['rank_scale_vs_default'] == [{'file': 'moe-h200-full-j.json', 'variant': 'vora_unsloth_mb4_rank_scale',
                                           'twin': 'vora_unsloth_mb4', 'twin_file': 'moe-h200-full-j.json',
                                           'same_call': True, 'losses': 2, 'loss_max_rel_diff': 0.0,
                                           'median_step_ratio': 1.1}]
    assert 'vora_unsloth_mb4_rank_scale against vora_unsloth_mb4: 1.1x' in moe_calls.render(s)


def test_moe_calls_compares_the_host_levers_with_their_twin_and_drops_the_mean_of_the_old_step_clock(tmp_path):
    """`*_nosync` (the vision preamble on the prefetch thread, one step in flight) against the same variant without
    them in one call; and a lagged run from before the runner timed held steps on the GPU (no `step_clock`: call l)
    keeps its median but not its mean, which was one step short over the window."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    each = {'autocast': 'bfloat16', 'encode_threads': 4, 'step_sync': 'each'}
    lagged = {**each, 'step_sync': 'lagged', 'step_clock': 'gpu_end'}
    call_m = {'date': '2026-12-05', 'model': {'layers': 40}, 'variants': {
        'vora_unsloth_mb4_ck32_rank_scale': {'tokens_per_s': 11900.0, 'runner': each, 'median_step_s': 2.6,
                                             'mean_step_s': 2.62, 'losses': [13.0, 12.0]},
        'vora_unsloth_mb4_ck32_rank_scale_nosync': {'tokens_per_s': 12350.0, 'runner': lagged, 'median_step_s': 2.5,
                                                    'mean_step_s': 2.52, 'losses': [13.0, 12.06]}}}
    call_l = {'date': '2026-12-04', 'partial': True, 'model': {'layers': 40}, 'variants': {
        'vora_unsloth_mb4_ck32_rank_scale_nosync': {'tokens_per_s': 12335.7, 'median_step_s': 2.526,
                                                    'mean_step_s': 2.31, 'losses': [13.08],
                                                    'runner': {**each, 'step_sync': 'lagged'}}}}  # no step_clock
    (tmp_path / 'moe-h200-full-l-partial.json').write_text(json.dumps(call_l))
    (tmp_path / 'moe-h200-full-m.json').write_text(json.dumps(call_m))
    s = moe_calls.summarize(moe_calls.load('moe-h200-full-*.json', str(tmp_path)))
    assert s['host_levers_vs_twin'] == [{'file': 'moe-h200-full-m.json',
                                         'variant': 'vora_unsloth_mb4_ck32_rank_scale_nosync',
                                         'twin': 'vora_unsloth_mb4_ck32_rank_scale',
                                         'twin_file': 'moe-h200-full-m.json', 'same_call': True, 'losses': 2,
                                         'loss_max_rel_diff': 0.005, 'median_step_ratio': 1.04}]
    assert '(host levers) against vora_unsloth_mb4_ck32_rank_scale: 1.04x' in moe_calls.render(s)
    runs = {r['file']: r for r in s['variants']['vora_unsloth_mb4_ck32_rank_scale_nosync']['calls']}
    assert runs['moe-h200-full-l-partial.json']['median_step_s'] == 2.526
    assert runs['moe-h200-full-l-partial.json']['mean_step_s'] is None
    assert 'call l' in runs['moe-h200-full-l-partial.json']['mean_step_note']
    assert runs['moe-h200-full-m.json']['mean_step_s'] == 2.52


@pytest.mark.slow
def test_runner_with_the_vision_preamble_on_the_prefetch_thread_trains_the_same(tiny_q35, tmp_path, offline_env):
    """SWIFT_VORA_VISION_PREAMBLE=prefetch: every forward's vision tower is fed the preamble made on the prefetch
    thread (none computed again), and the losses are the tower's own preamble's, to the bit."""
    from swift_vora.synthetic import make_dataset
    model, _ = tiny_q35
    ann = make_dataset(str(tmp_path / 'data'), 2, duration=16.0)
    runs = {}
    for setting in ('model', 'prefetch'):
        out = tmp_path / setting
        cmd = [sys.executable, '-m', 'swift_vora.backends.unsloth_runner',
               os.path.join(REPO, 'recipes', 'h200x1.yaml'), f'model.path={model}', f'data.dataset={ann}',
               'data.window=8', 'data.stride=8', 'video.fps=1', 'video.max_frames=8', 'video.pair_tokens=16',
               'video.min_pair_tokens=4', 'train.max_steps=2', 'train.micro_batch=2', 'train.grad_accum=1',
               'train.dtype=float32', f'train.output_dir={out}', 'train.lora_rank=4', 'unsloth.save_merged=false',
               'unsloth.gradient_checkpointing=false', '--loader', 'peft']
        env = {**offline_env, 'SWIFT_VORA_VISION_PREAMBLE': setting, 'SWIFT_VORA_GUARDS': 'supervision'}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[setting] = (json.loads((out / 'unsloth_run_result.json').read_text()),
                         [json.loads(line)['loss'] for line in (out / 'train_log.jsonl').read_text().splitlines()])
    (plain, plain_losses), (fed, fed_losses) = runs['model'], runs['prefetch']
    assert plain['vision_preamble'] == {'setting': 'model'}
    assert fed['vision_preamble'] == {'setting': 'prefetch', 'tower': 'Qwen3_5MoeVisionModel', 'forwards_fed': 2,
                                      'unmatched': 0}
    assert fed['step_sync'] == 'each'  # lagged is CUDA-only
    assert len(fed_losses) == 2 and fed_losses == plain_losses


def test_moe_calls_compares_the_fused_router_with_its_twin_alone_and_on_top_of_the_gather(tmp_path):
    """`*_router` (UNSLOTH_MOE_FUSED_ROUTER=1) against the same name without the suffix in its call -- the rank-scale
    variant, or its gather lever for `*_gather_router` -- and the benchmark runs each with exactly its twin's switches
    plus Unsloth's; likewise `*_fold`, `*_gategrad` and `*_gva` (SWIFT_VORA_GDN_QK_HEADS=grouped) on top of their
    twin's."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    import moe_throughput
    base = 'vora_unsloth_mb4_ck32_rank_scale'
    for lever, twin, switch in ((base + '_router', base, {'UNSLOTH_MOE_FUSED_ROUTER': '1'}),
                                (base + '_gather_router', base + '_gather', {'UNSLOTH_MOE_FUSED_ROUTER': '1'}),
                                (base + '_fold', base, {'SWIFT_VORA_MOE_DOWN_LORA': 'fold'}),
                                (base + '_gather_router_fold', base + '_gather_router',
                                 {'SWIFT_VORA_MOE_DOWN_LORA': 'fold'}),
                                (base + '_gategrad', base, {'SWIFT_VORA_MOE_GATE_GRAD': 'fused'}),
                                (base + '_gather_router_fold_gategrad', base + '_gather_router_fold',
                                 {'SWIFT_VORA_MOE_GATE_GRAD': 'fused'}),
                                (base + '_gva', base, {'SWIFT_VORA_GDN_QK_HEADS': 'grouped'}),
                                (base + '_gather_router_gategrad_gva', base + '_gather_router_gategrad',
                                 {'SWIFT_VORA_GDN_QK_HEADS': 'grouped'})):
        built_on, env = moe_throughput.LEVERS_ON_RANK_SCALE[lever]
        twin_env = moe_throughput.LEVERS_ON_RANK_SCALE.get(twin, (twin, {}))[1]
        assert built_on == base and env == {**twin_env, **switch}, lever
    runner = {'autocast': 'bfloat16', 'encode_threads': 4, 'step_sync': 'each'}
    rows = {name: {'tokens_per_s': rate, 'runner': runner, 'median_step_s': step, 'losses': [13.0, 12.0]}
            for name, rate, step in ((base, 12200.0, 2.55), (base + '_gather', 12450.0, 2.5),
                                     (base + '_router', 12400.0, 2.51), (base + '_gather_router', 12700.0, 2.45),
                                     (base + '_gva', 12350.0, 2.52))}
    (tmp_path / 'moe-h200-full-p.json').write_text(json.dumps({'date': '2026-12-06', 'model': {'layers': 40},
                                                               'variants': rows}))
    s = moe_calls.summarize(moe_calls.load('moe-h200-full-*.json', str(tmp_path)))
    assert [(r['variant'], r['twin'], r['median_step_ratio']) for r in s['router_vs_twin']] == [
        (base + '_router', base, 1.016), (base + '_gather_router', base + '_gather', 1.02)]
    assert [(r['variant'], r['twin']) for r in s['gather_vs_twin']] == [(base + '_gather', base)]
    assert '(fused router) against ' + base + '_gather: 1.02x' in moe_calls.render(s)
    assert [(r['variant'], r['twin'], r['median_step_ratio']) for r in s['gva_vs_twin']] == [
        (base + '_gva', base, 1.012)]


def test_moe_benchmark_dry_run_plans_each_variant_with_its_switches_and_refuses_an_unknown_one(tmp_path):
    """`--dry-run` (CPU): what a device call would launch, planned by `swift-vora train --dry-run` on the 35B-A3B
    config at full depth -- each lever's switches on top of its twin's overrides -- and exit 1 for a name the
    benchmark does not know, before any device time is spent on it."""
    base = [sys.executable, os.path.join(REPO, 'benchmarks', 'moe_throughput.py'), '--dry-run', '--layers', '40',
            '--work', str(tmp_path)]
    proc = subprocess.run(base + ['--variants', 'vora_unsloth_mb4_ck32_rank_scale_fold,swift_peft'],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith('== ')]
    assert lines[0].startswith('== vora_unsloth_mb4_ck32_rank_scale_fold: unsloth_split_lora fits ')
    assert '"SWIFT_VORA_MOE_DOWN_LORA": "fold"' in lines[0] and 'train.checkpoint_layers=32' in lines[0]
    assert lines[1] == '== swift_peft: plain swift sft (not planned by swift-vora)'
    proc = subprocess.run(base + ['--variants', 'vora_unsloth_mb4_ck32_rank_scale_folded'], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 1 and 'unknown variant' in proc.stdout


def test_moe_benchmark_checks_the_variant_flagship_variant_names_and_refuses_one_it_does_not_run(tmp_path):
    """`--flagship-variant`: the guards, the merged export and its check go to a lever setting, so one full-depth run
    measures it and checks it; a checked run the call would not run, or a name that is no swift-vora variant, is
    refused before anything is built."""
    base = [sys.executable, os.path.join(REPO, 'benchmarks', 'moe_throughput.py'), '--dry-run', '--layers', '40',
            '--work', str(tmp_path), '--flagship']
    lever = 'vora_unsloth_mb4_ck32_rank_scale'
    proc = subprocess.run(base + ['--variants', f'{lever},swift_peft', '--flagship-variant', lever],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith('== ')]
    assert lines[0].startswith(f'== {lever}: unsloth_split_lora fits ') and lines[0].endswith('; flagship')
    proc = subprocess.run(base + ['--variants', 'vora_unsloth,swift_peft', '--flagship-variant', lever],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 2 and f'--flagship checks {lever}, which --variants does not run' in proc.stderr
    proc = subprocess.run(base + ['--variants', 'swift_peft', '--flagship-variant', 'swift_peft'],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 2 and 'not a swift-vora variant' in proc.stderr


def test_moe_benchmark_dry_run_refuses_a_plan_above_the_card_the_call_got(tmp_path):
    """The recipe plans the full-depth run for an H200; a device call that lands on an H100 (79.2 GiB) must refuse
    it before building a 65 GiB checkpoint on that card (`--gpu-gib`, what the GPU preflight passes), and keep it on
    a card it fits."""
    base = [sys.executable, os.path.join(REPO, 'benchmarks', 'moe_throughput.py'), '--dry-run', '--layers', '40',
            '--work', str(tmp_path), '--variants', 'vora_unsloth_mb4_ck32_rank_scale']
    proc = subprocess.run(base + ['--gpu-gib', '79.2'], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert 'does not fit this 79.2 GiB card' in proc.stdout and 'nothing was built' in proc.stdout
    proc = subprocess.run(base + ['--gpu-gib', '139.8'], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_benchmark_rebuilds_a_checkpoint_left_at_another_depth(tmp_path):
    """Calls on one warm machine share the model folder: a 3-layer full-SFT call after an 8-layer LoRA call must
    train 3 layers, not find the 8 left behind (it planned them, did not fit an H100 and launched nothing)."""
    import moe_throughput as mt
    model = str(tmp_path / 'model')
    mt.build_model(model, 'tiny', 2, 'cpu')
    again = mt.build_model(model, 'tiny', 2, 'cpu')
    assert again['layers'] == 2 and 'build_s' not in again  # the same depth is reused, not rebuilt
    mt.build_model(model, 'tiny', 3, 'cpu')
    with open(os.path.join(model, 'config.json')) as f:
        assert json.load(f)['text_config']['num_hidden_layers'] == 3
