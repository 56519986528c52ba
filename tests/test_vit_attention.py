"""The batched, sync-once vision attention gives transformers' own outputs (swift_vora/speed/vit_attention.py)."""
import pytest
import torch
from transformers.models.qwen3_vl import modeling_qwen3_vl as M
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

from swift_vora import patches
from swift_vora.speed import vit_attention


def vision_model(attn):
    config = Qwen3VLVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32,
                                 patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                 deepstack_visual_indexes=[0], num_position_embeddings=64)
    config._attn_implementation = attn
    torch.manual_seed(0)
    return M.Qwen3VLVisionModel._from_config(config).eval()


def run(model, grid):
    torch.manual_seed(1)
    patches = int(sum(t * h * w for t, h, w in grid.tolist()))
    pixels = torch.randn(patches, 3 * 2 * 16 * 16)
    with torch.no_grad():
        out = model(pixels, grid_thw=grid)
    return out.pooler_output if hasattr(out, 'pooler_output') and out.pooler_output is not None else out[0]


@pytest.fixture
def original_forward():
    """transformers' forward, restored after the test whatever the patch state was."""
    cls = M.Qwen3VLVisionAttention
    current = cls.forward
    original = patches.upstream(current)
    yield original
    cls.forward = current


@pytest.mark.parametrize('attn', ['sdpa', 'eager'])
@pytest.mark.parametrize('grid', [
    [[4, 4, 6]],  # one video: 4 frame groups of 24 patches -> one batched call
    [[2, 4, 4], [3, 4, 6]],  # two videos of different sizes -> groups of 16 and 24 patches: per-group calls
], ids=['one_video', 'two_sizes'])
def test_same_outputs_as_transformers(attn, grid, original_forward, monkeypatch):
    grid = torch.tensor(grid)
    M.Qwen3VLVisionAttention.forward = original_forward
    expected = run(vision_model(attn), grid)
    monkeypatch.delenv(vit_attention.ENV, raising=False)
    assert 'Qwen3VLVisionAttention' in vit_attention.patch_vision_attention()
    assert M.Qwen3VLVisionAttention.forward is not original_forward
    got = run(vision_model(attn), grid)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_split_sizes_read_once_per_tensor():
    cu = torch.tensor([0, 24, 48, 72])
    assert vit_attention.split_sizes(cu) == [24, 24, 24]
    cu[1] = 10  # a cached tensor is not read again (all layers of one forward share it)
    assert vit_attention.split_sizes(cu) == [24, 24, 24]
    assert vit_attention.split_sizes(torch.tensor([0, 10, 30])) == [10, 20]


def test_env_keeps_transformers_forward(original_forward, monkeypatch):
    M.Qwen3VLVisionAttention.forward = original_forward
    monkeypatch.setenv(vit_attention.ENV, 'transformers')
    assert vit_attention.patch_vision_attention() == []
    assert M.Qwen3VLVisionAttention.forward is original_forward
    monkeypatch.setenv(vit_attention.ENV, 'transformer')  # a typo must not silently patch
    with pytest.raises(ValueError, match="SWIFT_VORA_VIT_ATTENTION='transformer'"):
        vit_attention.patch_vision_attention()
    assert M.Qwen3VLVisionAttention.forward is original_forward


@pytest.mark.parametrize('same', [True, False], ids=['agrees', 'differs'])
def test_a_forward_rewritten_by_another_library_is_replaced_only_after_a_live_check(original_forward, monkeypatch,
                                                                                     same):
    """Unsloth's compiler rewrites the vision attention after import, so the source check skips our patch: in the
    Unsloth runner it is installed behind a check on the first live call -- kept when it computes what the rewritten
    forward computes, dropped (the rewritten one stays) when it does not."""
    def rewritten(self, *args, **kwargs):  # another library's forward: not transformers' source, not ours
        out = original_forward(self, *args, **kwargs)
        return out if same else 2 * out

    monkeypatch.delenv(vit_attention.ENV, raising=False)
    grid = torch.tensor([[4, 4, 6]])
    M.Qwen3VLVisionAttention.forward = rewritten
    model = vision_model('sdpa')
    expected = run(model, grid)
    report = vit_attention.adopt_over_rewrite(model)
    assert report == {'Qwen3VLVisionAttention': {'state': 'installed, waiting for its first call',
                                                 'class_module': M.__name__}}
    first = run(model, grid)  # the first call returns the rewritten forward's output either way
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
    entry = report['Qwen3VLVisionAttention']
    if same:
        assert entry['state'] == 'batched' and entry['relative_difference'] < 1e-4
        assert patches.patched_by(M.Qwen3VLVisionAttention.forward) == 'vit_attention_qwen3_vl'
        torch.testing.assert_close(run(model, grid), expected, rtol=1e-5, atol=1e-5)
    else:
        assert entry['state'] == 'kept the rewritten forward' and entry['relative_difference'] > 0.3
        assert M.Qwen3VLVisionAttention.forward is rewritten
    assert vit_attention.adopt_over_rewrite(model) == ({} if same else {
        'Qwen3VLVisionAttention': {'state': 'installed, waiting for its first call', 'class_module': M.__name__}})
