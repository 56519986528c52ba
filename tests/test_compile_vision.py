"""Regional torch.compile of the frozen vision tower's blocks (swift_vora/speed/compile_layers.py,
`compile_vision_blocks`): the same vision features as transformers' blocks with swift-vora's batched attention, one
compiled graph shared by all blocks with no graph break (the frame-group sizes enter as ints), transformers' path
for what the compiled function does not take, and the switch a user sees."""
import types

import pytest
import torch
import torch._dynamo
from transformers.models.qwen3_vl import modeling_qwen3_vl as M
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

from swift_vora import patches
from swift_vora.speed import compile_layers, vit_attention
from swift_vora.tiny_model import build_qwen3_vl

ONE_VIDEO = [[4, 4, 6]]  # 4 frame groups of 24 patches: the compiled path
TWO_SIZES = [[2, 4, 4], [3, 4, 6]]  # groups of 16 and 24 patches: transformers' block with per-group attention


@pytest.fixture
def patched_attention(monkeypatch):
    """swift-vora's vision attention installed (as the plugin does at registration), restored afterwards."""
    cls = M.Qwen3VLVisionAttention
    current = cls.forward
    monkeypatch.delenv(vit_attention.ENV, raising=False)
    vit_attention.patch_vision_attention()
    yield
    cls.forward = current


def vision_model(depth=3):
    config = Qwen3VLVisionConfig(depth=depth, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32,
                                 patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                 deepstack_visual_indexes=[0], num_position_embeddings=64)
    config._attn_implementation = 'sdpa'
    torch.manual_seed(0)
    return M.Qwen3VLVisionModel._from_config(config).to(torch.bfloat16).train()


def features(model, grid, device='cpu'):
    """The frozen tower as training runs it: bf16 weights, bf16 autocast, no autograd."""
    grid = torch.tensor(grid, device=device)
    torch.manual_seed(1)
    pixels = torch.randn(int(sum(t * h * w for t, h, w in grid.tolist())), 3 * 2 * 16 * 16).to(device)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        out = model(pixels, grid_thw=grid)
    return [out.pooler_output.float(), *(f.float() for f in out.deepstack_features)]


@pytest.mark.parametrize('backend, device', [('aot_eager', 'cpu'), ('inductor', 'cpu'),
                                             pytest.param('inductor', 'cuda', marks=pytest.mark.gpu)])
def test_compiled_blocks_give_transformers_features(patched_attention, backend, device):
    if device == 'cuda' and not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU (run on the GPU machine: bash scripts/gpu/run_all.sh e2e)')
    model = vision_model().to(device)
    expected = {str(g): features(model, g, device) for g in (ONE_VIDEO, TWO_SIZES)}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert compile_layers.compile_vision_blocks(compile_layers.vision_blocks(model), backend=backend) == 3
    for grid in (ONE_VIDEO, TWO_SIZES, ONE_VIDEO):
        got = features(model, grid, device)
        for g, e in zip(got, expected[str(grid)]):
            if backend == 'aot_eager':  # the same ops in the same order
                assert torch.equal(g, e)
            else:  # inductor fuses the float32 norms and rotary embedding: bf16 rounding apart
                torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)
    # one graph for the three blocks and both calls of the one-video grid; the two-size grid took transformers' path
    counters = compile_layers.compile_counters()
    assert counters['unique_graphs'] == 1 and counters['graph_breaks'] == 0, counters


def test_compiled_path_is_taken_only_for_equal_groups(patched_attention, monkeypatch):
    model = vision_model(depth=2)
    calls = []
    monkeypatch.setattr(torch, 'compile', lambda fn, backend: lambda *a: calls.append(a[3:]) or fn(*a))
    compile_layers.compile_vision_blocks(compile_layers.vision_blocks(model))
    features(model, ONE_VIDEO)
    assert calls == [(4, 24), (4, 24)]  # (groups, length) per block
    features(model, TWO_SIZES)
    assert len(calls) == 2
    block = compile_layers.vision_blocks(model)[0]
    hidden = torch.randn(96, 64, dtype=torch.bfloat16)
    rotary = (torch.ones(96, 16), torch.zeros(96, 16))
    cu = torch.tensor([0, 24, 48, 72, 96], dtype=torch.int32)
    with torch.no_grad():  # the model-level kwargs every block receives in training: compiled path
        block(hidden, cu_seqlens=cu, position_embeddings=rotary, num_items_in_batch=torch.tensor(3), use_cache=False)
    assert calls[-1] == (4, 24) and len(calls) == 3
    handle = block.attn.register_forward_hook(lambda *a: None)  # transformers' output_attentions recording
    with torch.no_grad():
        block(hidden, cu_seqlens=cu, position_embeddings=rotary)
    assert len(calls) == 3
    handle.remove()
    for attn in ('flash_attention_2', 'flex_attention'):  # keep transformers' kernels and their arguments
        monkeypatch.setattr(model.config, '_attn_implementation', attn)
        assert vit_attention.batched_groups(block.attn, cu) is None


def test_unpatched_attention_is_not_compiled(monkeypatch):
    cls = M.Qwen3VLVisionAttention
    current = cls.forward
    try:
        cls.forward = patches.upstream(current)  # SWIFT_VORA_VIT_ATTENTION=transformers
        assert compile_layers.vision_blocks(vision_model(depth=2)) == []
    finally:
        cls.forward = current


def test_callback_compiles_vision_blocks_unless_switched_off(patched_attention, monkeypatch, tmp_path):
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(build_qwen3_vl(str(tmp_path / 'm'), 'tiny'),
                                                        dtype=torch.bfloat16)
    blocks = compile_layers.vision_blocks(model)
    assert [type(b).__name__ for b in blocks] == ['Qwen3VLVisionBlock'] * 2
    assert blocks[0] is model.model.visual.blocks[0]
    callback = compile_layers.CompileDecoderLayers.__new__(compile_layers.CompileDecoderLayers)
    monkeypatch.setenv(compile_layers.ENV, 'layers')
    monkeypatch.setenv(compile_layers.BACKEND_ENV, 'aot_eager')
    monkeypatch.setenv(compile_layers.VISION_ENV, 'off')
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=model)
    assert (callback.compiled, callback.compiled_vision) == (2, 0)
    assert all('forward' not in vars(b) for b in blocks)
    monkeypatch.delenv(compile_layers.VISION_ENV)
    callback.on_train_begin(types.SimpleNamespace(deepspeed=None), None, None, model=model)
    assert callback.compiled_vision == 2
    assert all('forward' in vars(b) for b in blocks)
