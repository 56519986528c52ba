"""`--attn_impl vora_varlen`: packed rows attend within each document, and train exactly as padded batches do."""
import glob
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO_ROOT

from swift_vora.speed import packed_attention as pa

SWIFT = os.path.join(os.path.dirname(sys.executable), 'swift')


class Attn(torch.nn.Module):
    """What transformers' attention functions read from the module."""

    def __init__(self, causal=True, groups=2):
        super().__init__()
        self.is_causal = causal
        self.num_key_value_groups = groups
        self.training = False


def qkv(total, heads=4, kv_heads=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, total, dim, generator=g), torch.randn(1, kv_heads, total, dim, generator=g),
            torch.randn(1, kv_heads, total, dim, generator=g))


def reference(q, k, v, sizes, scaling):
    """Block-diagonal causal attention written out: softmax over each document's earlier tokens only."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    total = q.shape[2]
    doc = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    pos = torch.arange(total)
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    scores = (q @ k.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~allowed, float('-inf'))
    return (scores.softmax(-1) @ v).transpose(1, 2)  # [1, T, heads, dim]


def cu(sizes):
    return torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32)


def test_packed_row_attends_within_each_document_only():
    sizes = [5, 3, 7]
    q, k, v = qkv(sum(sizes))
    kwargs = {'cu_seq_lens_q': cu(sizes), 'cu_seq_lens_k': cu(sizes), 'max_length_q': 7, 'max_length_k': 7}
    out, _ = pa.varlen_attention_forward(Attn(), q, k, v, None, scaling=0.3, **kwargs)
    assert torch.allclose(out, reference(q, k, v, sizes, 0.3), atol=1e-5)
    # the same row read as one causal sequence differs: the documents would see each other
    whole = reference(q, k, v, [sum(sizes)], 0.3)
    assert not torch.allclose(out[:, 5:], whole[:, 5:], atol=1e-3)


def test_vision_tower_call_with_the_models_packed_kwargs_stays_sdpa():
    """The model's kwargs -- the text row's cu_seq_lens included -- reach the vision blocks, whose attention is
    not causal: that call must be plain sdpa over its own tokens."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    q, k, v = qkv(12, heads=2, kv_heads=2)
    module = Attn(causal=False, groups=1)
    kwargs = {'cu_seq_lens_q': cu([4, 8]), 'cu_seq_lens_k': cu([4, 8]), 'max_length_q': 8, 'max_length_k': 8}
    out, _ = pa.varlen_attention_forward(module, q, k, v, None, scaling=0.5, is_causal=False, **kwargs)
    expected, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.5, is_causal=False)
    assert torch.allclose(out, expected, atol=1e-6)


def test_unpacked_call_is_sdpa_with_its_mask():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    q, k, v = qkv(6)
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    mask[..., :2] = False  # left padding
    out, _ = pa.varlen_attention_forward(Attn(), q, k, v, mask, scaling=0.2)
    expected, _ = sdpa_attention_forward(Attn(), q, k, v, mask, scaling=0.2)
    assert torch.allclose(out, expected, atol=1e-6)


def test_offsets_that_do_not_cover_the_row_are_an_error():
    q, k, v = qkv(10)
    with pytest.raises(ValueError, match='covers 8 tokens, the attention call has 10'):
        pa.varlen_attention_forward(Attn(), q, k, v, None, cu_seq_lens_q=cu([3, 5]))


def test_document_sizes_are_read_once_per_forward():
    """Every decoder layer gets the same offsets tensor: its lengths are read from the device once, then cached."""
    from swift_vora.speed.vit_attention import _CACHE_ATTR
    q, k, v = qkv(5)
    lens = cu([2, 3])
    first, _ = pa.varlen_attention_forward(Attn(), q, k, v, None, scaling=0.3, cu_seq_lens_q=lens)
    assert getattr(lens, _CACHE_ATTR) == [2, 3]
    setattr(lens, _CACHE_ATTR, [5])  # a later layer would read the cache, not the tensor
    again, _ = pa.varlen_attention_forward(Attn(), q, k, v, None, scaling=0.3, cu_seq_lens_q=lens)
    assert torch.allclose(again, reference(q, k, v, [5], 0.3), atol=1e-5)
    assert torch.allclose(first, reference(q, k, v, [2, 3], 0.3), atol=1e-5)


def _kernel(signature):
    """A stand-in for torch's varlen flash kernel with one release's signature, computing with sdpa per
    document: it checks the layout ([T, heads, dim], int32 offsets) and the options we pass."""
    seen = {}

    def common(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, gqa):
        assert q.dim() == 3 and cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k
        assert isinstance(max_q, int)
        seen.update(causal=causal, gqa=gqa, heads=(q.shape[1], k.shape[1]))
        outs = []
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa).transpose(0, 1))
        return torch.cat(outs)

    if signature == 'is_causal':  # torch 2.10 / 2.11
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None,
                        scale=None):
            return common(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, is_causal, False)
    else:  # later: causal as a window, GQA as an option
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False):
            return common(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                          tuple(window_size) == (-1, 0), enable_gqa)
    return varlen_attn, seen


@pytest.mark.parametrize('signature', ['is_causal', 'window_size'])
def test_flash_call_matches_the_kernel_signature_of_each_torch_release(signature):
    sizes = [4, 6]
    q, k, v = qkv(sum(sizes))
    kernel, seen = _kernel(signature)
    out = pa._flash_documents(q, k, v, cu(sizes), sum(sizes), 0.3, pa.varlen_kernel(kernel))  # longest: over
    assert torch.allclose(out, reference(q, k, v, sizes, 0.3), atol=1e-5)
    assert seen['causal']
    # GQA: passed as an option where the kernel has it, else the KV heads are repeated before the call
    assert seen['heads'] == ((4, 2) if signature == 'window_size' else (4, 4))
    assert seen['gqa'] == (signature == 'window_size')


@pytest.mark.gpu
def test_cuda_varlen_kernel_matches_sdpa_per_document_forward_and_backward():
    """On the GPU the packed row goes through torch's varlen flash kernel; its output and gradients must be those of
    sdpa run per document (bf16 tolerances), with GQA, offsets as ms-swift hands them and the longest document
    overestimated as the forward does."""
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU (run on the GPU machine: bash scripts/gpu/run_all.sh e2e)')
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    sizes = [700, 300, 1024]
    q, k, v = (t.to('cuda', torch.bfloat16).requires_grad_() for t in qkv(sum(sizes), heads=8, kv_heads=2, dim=64))
    module = Attn(groups=4)
    lens = cu(sizes).cuda()
    out, _ = pa.varlen_attention_forward(module, q, k, v, None, scaling=0.125, cu_seq_lens_q=lens,
                                         cu_seq_lens_k=lens, max_length_q=lens.diff().max(),
                                         max_length_k=lens.diff().max())
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    parts = zip(*(t.split(sizes, dim=2) for t in (q, k, v)))
    ref = torch.cat([sdpa_attention_forward(module, a, b, c, None, scaling=0.125, is_causal=True)[0]
                     for a, b, c in parts], dim=1)
    ref_grads = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    assert (out.float() - ref.float()).abs().max() < 2e-2
    for got, want in zip(grads, ref_grads):
        assert (got.float() - want.float()).norm() < 2e-2 * want.float().norm()


def test_flash_branch_traces_into_one_graph(monkeypatch):
    """On the GPU the decoder layers are compiled (train.compile=layers) with this attention inside: its flash
    branch must not break the graph (no host read, no signature lookup per call). Traced here with the branch
    forced and a stand-in kernel; fullgraph=True fails on any break."""
    sizes = [4, 6]
    q, k, v = qkv(sum(sizes))

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False):
        outs, start = [], 0
        for n in sizes:  # the sizes are the test's, the kernel reads the offsets on the device
            qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (query, key, value))
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=tuple(window_size) == (-1, 0), scale=scale, enable_gqa=enable_gqa))
            start += n
        return torch.cat([o.transpose(0, 1) for o in outs])

    monkeypatch.setattr(pa, '_KERNEL', pa.varlen_kernel(varlen_attn))
    monkeypatch.setattr(pa, '_flash_applies', lambda module, query, dropout: True)
    lens = cu(sizes)
    module = Attn()

    def layer(q, k, v, lens, longest):
        return pa.varlen_attention_forward(module, q, k, v, None, scaling=0.3, cu_seq_lens_q=lens,
                                           cu_seq_lens_k=lens, max_length_q=longest, max_length_k=longest)[0]

    torch._dynamo.reset()
    out = torch.compile(layer, backend='eager', fullgraph=True)(q, k, v, lens, lens.diff().max())
    assert torch.allclose(out, reference(q, k, v, sizes, 0.3), atol=1e-5)


def test_ms_swift_padding_free_check_accepts_vora_varlen_only():
    from swift.arguments.sft_args import SftArguments

    import swift_vora
    swift_vora.register()
    ours = SimpleNamespace(attn_impl='vora_varlen', padding_free=False, packing=True)
    SftArguments._check_padding_free(ours)
    assert ours.padding_free is True  # packing implies padding_free, as in ms-swift's own check
    with pytest.raises(ValueError, match='flash attention'):
        SftArguments._check_padding_free(SimpleNamespace(attn_impl='sdpa', padding_free=True, packing=False))


def test_registered_with_transformers():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    assert pa.register()
    assert AttentionInterface._global_mapping[pa.NAME] is pa.varlen_attention_forward
    assert pa.NAME in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def _sft(model_dir, annotations, out, extra, env, model_type='qwen3_vl'):
    argv = [SWIFT, 'sft', '--custom_register_path', 'swift_vora', '--model', str(model_dir), '--model_type',
            model_type, '--template', 'video_ora', '--dataset', str(annotations), '--tuner_type', 'lora',
            '--target_modules', 'all-linear', '--max_steps', '2', '--per_device_train_batch_size', '2',
            '--gradient_accumulation_steps', '1', '--output_dir', str(out), '--check_model', 'false',
            '--fp16', 'false', '--bf16', 'false', '--torch_dtype', 'float32', '--dataloader_num_workers', '0',
            '--logging_steps', '1', '--report_to', 'none', '--split_dataset_ratio', '0', '--save_strategy', 'no',
            '--learning_rate', '1e-3', '--lora_dropout', '0', *extra]
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [log] = glob.glob(os.path.join(str(out), 'v*', 'logging.jsonl'))
    records = [json.loads(line) for line in open(log)]
    steps = [r for r in records if 'loss' in r]
    return [r['loss'] for r in steps], [r['grad_norm'] for r in steps], proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize('model', ['dense', 'moe'])
def test_packed_training_equals_padded_training(model, tiny_model_dir, tiny_moe_model_dir, offline_env, tmp_path):
    """Two `swift sft` runs on the same video windows, two samples per micro-batch: padded with sdpa, and packed
    into one row (`--padding_free true --attn_impl vora_varlen`). Same losses, step after step: the packed row
    attends within each clip, the vision tower runs as before, and the supervision is the same (Qwen3-VL and
    Qwen3-VL-MoE: the experts route per token, so packing leaves them as they were)."""
    model_dir, model_type = (tiny_model_dir, 'qwen3_vl') if model == 'dense' else (tiny_moe_model_dir, 'qwen3_vl_moe')
    from swift_vora.synthetic import make_dataset
    annotations = make_dataset(str(tmp_path / 'videos'), 2, duration=16.0, seed=5)
    env = {**offline_env, 'SWIFT_VORA_FPS': '1', 'SWIFT_VORA_MAX_FRAMES': '8', 'SWIFT_VORA_PAIR_TOKENS': '16',
           'SWIFT_VORA_MIN_PAIR_TOKENS': '4', 'SWIFT_VORA_WINDOW': '8', 'SWIFT_VORA_GUARDS': 'none',
           'SWIFT_VORA_ENCODE_LOG': str(tmp_path / 'encode.jsonl')}
    padded_loss, padded_grad, _ = _sft(model_dir, annotations, tmp_path / 'padded', ['--attn_impl', 'sdpa'], env,
                                       model_type)
    packed_loss, packed_grad, log = _sft(model_dir, annotations, tmp_path / 'packed',
                                         ['--attn_impl', 'vora_varlen', '--padding_free', 'true'], env, model_type)
    assert "attn_impl: vora_varlen" in log
    lengths = {r['total_tokens'] for r in map(json.loads, open(tmp_path / 'encode.jsonl')) if r['mode'] == 'train'}
    assert len(lengths) > 1, 'the windows must differ in length, or padding is not exercised'
    assert len(padded_loss) == len(packed_loss) == 2
    # LoRA dropout off: its masks depend on the tensor shapes, which packing changes. At this tolerance one packed
    # row read as a single causal sequence fails (step-1 grad norm 0.8 % off, loss 2.5e-5 off).
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    assert packed_grad == pytest.approx(padded_grad, rel=1e-5)


@pytest.mark.slow
def test_dataset_packing_trains_and_the_adapter_infers_elsewhere(tiny_model_dir, offline_env, tmp_path):
    """`--packing true` (rows filled from the whole dataset, train.packing=dataset) trains with vora_varlen, and
    `swift infer` on the checkpoint -- from another directory, the attention name in its args.json -- generates
    through the same registration (unpacked calls are sdpa)."""
    from swift_vora.synthetic import make_dataset
    annotations = make_dataset(str(tmp_path / 'videos'), 2, duration=16.0, seed=5)
    env = {**offline_env, 'SWIFT_VORA_FPS': '1', 'SWIFT_VORA_MAX_FRAMES': '8', 'SWIFT_VORA_PAIR_TOKENS': '16',
           'SWIFT_VORA_MIN_PAIR_TOKENS': '4', 'SWIFT_VORA_WINDOW': '8', 'SWIFT_VORA_GUARDS': 'none'}
    _sft(tiny_model_dir, annotations, tmp_path / 'out', ['--attn_impl', 'vora_varlen', '--packing', 'true',
                                                         '--max_length', '2048', '--max_steps', '1',
                                                         '--save_strategy', 'steps', '--save_steps', '1'], env)
    [checkpoint] = glob.glob(str(tmp_path / 'out' / 'v*' / 'checkpoint-1'))
    assert json.load(open(os.path.join(checkpoint, 'args.json')))['attn_impl'] == 'vora_varlen'
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    proc = subprocess.run([SWIFT, 'infer', '--adapters', checkpoint, '--val_dataset', str(annotations),
                           '--infer_backend', 'transformers', '--max_new_tokens', '4', '--result_path',
                           str(elsewhere / 'pred.jsonl')], cwd=str(elsewhere), env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(open(elsewhere / 'pred.jsonl').readlines()) == 4  # 2 videos x 2 windows of 8 s
