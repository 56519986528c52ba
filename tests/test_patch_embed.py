"""The vision patch embedding as one GEMM gives transformers' Conv3d results (swift_vora/speed/patch_embed.py)."""
import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from transformers.models.qwen3_vl import modeling_qwen3_vl as M
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

from swift_vora import patches
from swift_vora.speed import patch_embed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def patched(monkeypatch):
    """The wrapped Qwen3-VL patch embedding; transformers' forward restored after the test."""
    cls = M.Qwen3VLVisionPatchEmbed
    current = cls.forward
    monkeypatch.delenv(patch_embed.ENV, raising=False)
    assert 'Qwen3VLVisionPatchEmbed' in patch_embed.patch_patch_embeddings()
    yield cls
    cls.forward = current


def vision_config(**kw):
    return Qwen3VLVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32,
                               patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                               deepstack_visual_indexes=[0], num_position_embeddings=64, **kw)


def embed_pair(dtype=torch.float32):
    torch.manual_seed(0)
    ref = M.Qwen3VLVisionPatchEmbed(vision_config()).to(dtype)
    return ref, copy.deepcopy(ref)


def test_same_outputs_and_gradients_as_the_conv_in_fp32(patched):
    ref, ours = embed_pair(torch.float32)
    conv_forward = patches.upstream(patched.forward)
    pixels = torch.randn(40, 3 * 2 * 16 * 16)
    x_ref, x_ours = pixels.clone().requires_grad_(), pixels.clone().requires_grad_()
    expected = conv_forward(ref, x_ref)
    got = ours(x_ours)
    assert isinstance(ours.proj, nn.Conv3d) and type(ours.proj) is patch_embed.gemm_conv_class()  # same tree
    assert type(ref.proj) is nn.Conv3d
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.proj.weight.grad, ref.proj.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours.proj.bias.grad, ref.proj.bias.grad, rtol=1e-5, atol=1e-4)


def test_in_bf16_no_less_accurate_than_the_conv(patched):
    """bf16 rounds differently in a GEMM and in a convolution (the order of the sums): each is compared with the
    fp32 result of the same inputs, and ours may not be further from it than transformers' Conv3d (a weight gradient
    sums 40 rows; comparing the two bf16 results directly failed on one machine's CPU by one bf16 step)."""
    ref, ours = embed_pair(torch.bfloat16)
    exact = copy.deepcopy(ref).float()
    conv_forward = patches.upstream(patched.forward)
    pixels = torch.randn(40, 3 * 2 * 16 * 16, dtype=torch.bfloat16)
    xs = [pixels.clone().requires_grad_() for _ in range(2)] + [pixels.float().requires_grad_()]
    outs = [conv_forward(ref, xs[0]), ours(xs[1]), conv_forward(exact, xs[2])]
    grad = torch.randn_like(outs[0])
    for out in outs:
        out.backward(grad.to(out.dtype))
    for name, (conv, gemm, truth) in {
            'output': [o.detach() for o in outs], 'input grad': [x.grad for x in xs],
            'weight grad': [m.proj.weight.grad for m in (ref, ours, exact)],
            'bias grad': [m.proj.bias.grad for m in (ref, ours, exact)]}.items():
        err_conv = (conv.float() - truth).abs().max().item()
        err_gemm = (gemm.float() - truth).abs().max().item()
        assert err_gemm <= max(1.5 * err_conv, 1e-2 * truth.abs().max().item()), (name, err_gemm, err_conv)


def test_whole_vision_tower_unchanged_and_weights_keep_their_names(patched):
    config = vision_config()
    config._attn_implementation = 'sdpa'
    torch.manual_seed(0)
    model = M.Qwen3VLVisionModel._from_config(config).eval()
    grid = torch.tensor([[4, 4, 6]])
    pixels = torch.randn(4 * 4 * 6, 3 * 2 * 16 * 16)
    names = list(model.state_dict())
    with torch.no_grad():
        got = model(pixels, grid_thw=grid).pooler_output
        patched.forward = patches.upstream(patched.forward)  # transformers' Conv3d path, same weights
        model.patch_embed.proj.__class__ = nn.Conv3d
        expected = model(pixels, grid_thw=grid).pooler_output
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert list(model.state_dict()) == names and 'patch_embed.proj.weight' in names


def test_a_patched_model_copies_and_pickles(patched):
    _, ours = embed_pair()
    pixels = torch.randn(8, 3 * 2 * 16 * 16)
    out = ours(pixels)
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        torch.testing.assert_close(clone(pixels), out)
        assert type(clone.proj) is patch_embed.gemm_conv_class()


@pytest.mark.parametrize('conv', [
    nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(1, 4, 4)),  # overlapping in time
    nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), padding=(0, 1, 1)),
    nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), dilation=(1, 2, 2)),
    nn.Conv3d(4, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), groups=2),
], ids=['stride', 'padding', 'dilation', 'groups'])
def test_other_convolutions_keep_torch(conv):
    assert not patch_embed.is_patch_conv(conv)
    assert not patch_embed.use_gemm(conv)
    assert type(conv) is nn.Conv3d


def test_a_lora_wrapped_conv_is_left_to_peft(patched):
    from peft import LoraConfig, get_peft_model
    _, embed = embed_pair()
    model = get_peft_model(embed, LoraConfig(r=2, lora_alpha=2, target_modules=['proj']))
    pixels = torch.randn(8, 3 * 2 * 16 * 16)
    out = model(pixels)  # the wrapper's forward runs and finds PEFT's layer, not a plain Conv3d
    proj = model.base_model.model.proj
    assert not patch_embed.use_gemm(proj) and type(proj.base_layer) is nn.Conv3d
    assert out.shape == (8, 64)


def test_inputs_larger_than_one_patch_still_convolve():
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))
    x = torch.randn(2, 3, 4, 8, 8)  # 2 x 2 x 2 patches per input
    expected = conv(x)
    assert patch_embed.use_gemm(conv)
    torch.testing.assert_close(conv(x), expected)
    one = torch.randn(5, 3, 2, 4, 4)
    torch.testing.assert_close(conv(one), conv._conv_forward(one, conv.weight, conv.bias), rtol=1e-5, atol=1e-5)


def test_switch_off_keeps_transformers_forward(monkeypatch):
    cls = M.Qwen3VLVisionPatchEmbed
    before = cls.forward
    monkeypatch.setenv(patch_embed.ENV, 'conv')
    assert patch_embed.patch_patch_embeddings() == []
    assert cls.forward is before
    monkeypatch.setenv(patch_embed.ENV, 'linear')
    with pytest.raises(ValueError, match=patch_embed.ENV):
        patch_embed.enabled()


def test_every_listed_class_is_wrapped_once(monkeypatch):
    import importlib
    monkeypatch.delenv(patch_embed.ENV, raising=False)
    classes = [getattr(importlib.import_module(m), c) for m, c in patch_embed.CLASSES]
    before = {cls: cls.forward for cls in classes}
    try:
        assert patch_embed.patch_patch_embeddings() == [c for _, c in patch_embed.CLASSES]
        wrapped = {cls: cls.forward for cls in classes}
        patch_embed.patch_patch_embeddings()  # again: no second wrapper
        assert all(cls.forward is wrapped[cls] and patch_embed.is_patched(cls) for cls in classes)
    finally:
        for cls, forward in before.items():
            cls.forward = forward


ZERO3_SCRIPT = textwrap.dedent('''
    import json, sys
    import deepspeed
    import torch
    from torch import nn
    from transformers.models.qwen3_vl import modeling_qwen3_vl as M
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    from swift_vora.speed import patch_embed

    deepspeed.init_distributed(dist_backend='gloo')
    patch_embed.patch_patch_embeddings()
    config = {'train_micro_batch_size_per_gpu': 1, 'gradient_accumulation_steps': 1, 'steps_per_print': 10**9,
              'zero_optimization': {'stage': 3, 'stage3_param_persistence_threshold': 0}}


    class Tower(nn.Module):  # the patch embedding inside a model, as ZeRO-3 sees it in a vision tower
        def __init__(self):
            super().__init__()
            self.patch_embed = M.Qwen3VLVisionPatchEmbed(Qwen3VLVisionConfig(hidden_size=64, patch_size=16,
                                                                             temporal_patch_size=2))
            self.head = nn.Linear(64, 1)

        def forward(self, pixels):
            return self.head(self.patch_embed(pixels)).sum()


    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        tower = Tower()
    engine, _, _, _ = deepspeed.initialize(model=tower, config=config,
                                           optimizer=torch.optim.AdamW(tower.parameters(), lr=0.1))
    proj = tower.patch_embed.proj
    pixels = torch.randn(12, 3 * 2 * 16 * 16)
    loss = engine(pixels)  # the hooks gather proj's weight for its forward
    engine.backward(loss)
    with deepspeed.zero.GatheredParameters(list(tower.parameters())):
        w, b = proj.weight.detach().clone(), proj.bias.detach().clone()
        expected = tower.head(nn.functional.conv3d(pixels.view(-1, 3, 2, 16, 16), w, b).view(-1, 64)).sum()
    json.dump({'class': type(proj).__name__, 'partitioned': proj.weight.numel() == 0, 'loss': float(loss),
               'expected': float(expected)}, open(sys.argv[1], 'w'))
''')


@pytest.mark.slow
def test_zero3_gathers_the_weight_for_the_gemm(tmp_path):
    """Under DeepSpeed ZeRO-3 the Conv3d's weight is a 0-element partition until its module hook gathers it; the
    GEMM forward is reached through that hook (one CPU process, gloo)."""
    import deepspeed  # noqa: F401  (a test dependency: pyproject [test])
    script, out = tmp_path / 'zero3_patch_embed.py', tmp_path / 'result.json'
    script.write_text(ZERO3_SCRIPT)
    env = {**os.environ, 'DS_ACCELERATOR': 'cpu', 'OMP_NUM_THREADS': '1', 'PYTHONPATH': REPO, 'RANK': '0',
           'LOCAL_RANK': '0', 'WORLD_SIZE': '1', 'MASTER_ADDR': '127.0.0.1',
           'MASTER_PORT': str(29500 + os.getpid() % 200)}
    env.pop(patch_embed.ENV, None)
    proc = subprocess.run([sys.executable, str(script), str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = json.load(open(out))
    assert res['class'] == 'PatchGemmConv3d' and res['partitioned']
    assert res['loss'] == pytest.approx(res['expected'], rel=1e-5, abs=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize('dtype, tol', [(torch.bfloat16, 2e-2), (torch.float32, 5e-3)])  # cuDNN may use TF32
def test_cuda_gemm_matches_cudnn_conv_at_the_2b_shape(dtype, tol):
    """On the GPU, against the cuDNN convolution it replaces: the Qwen3-VL-2B patch embedding (1,536 values per
    patch -> 1,024) over one 64-frame clip's 23,040 patches, outputs and the gradients a trainable ViT would get."""
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU (run on the GPU machine: bash scripts/gpu/run_all.sh e2e -k patch_embed)')
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 1024, kernel_size=(2, 16, 16), stride=(2, 16, 16)).to('cuda', dtype)
    gemm = copy.deepcopy(conv)
    assert patch_embed.use_gemm(gemm)
    x = torch.randn(23040, 3, 2, 16, 16, device='cuda', dtype=dtype)
    outs, grads = [], []
    for module in (conv, gemm):
        out = module(x)
        outs.append(out)
        grads.append(torch.autograd.grad(out.float().square().mean(), (module.weight, module.bias)))
    torch.testing.assert_close(outs[1], outs[0], rtol=tol, atol=tol)
    for ours, theirs in zip(grads[1], grads[0]):
        torch.testing.assert_close(ours, theirs, rtol=tol * 5, atol=tol * 5)
