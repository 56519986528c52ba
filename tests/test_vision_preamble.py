"""The vision tower's preamble made on the prefetch thread gives the tower's own outputs, and is what the tower uses
(swift_vora/speed/vision_preamble.py)."""
import pytest
import torch
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M5
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeVisionConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl as M
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

from swift_vora.speed import vision_preamble, vit_attention

GRIDS = {'one_video': [[4, 4, 6]], 'two_sizes': [[2, 4, 4], [3, 4, 6]]}


def qwen3_vl_tower():
    config = Qwen3VLVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32,
                                 patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                 deepstack_visual_indexes=[0], num_position_embeddings=64)
    config._attn_implementation = 'sdpa'
    torch.manual_seed(0)
    return M.Qwen3VLVisionModel._from_config(config).eval()


def qwen3_5_moe_tower():
    config = Qwen3_5MoeVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32,
                                    patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                    num_position_embeddings=64)
    config._attn_implementation = 'sdpa'
    torch.manual_seed(0)
    return M5.Qwen3_5MoeVisionModel._from_config(config).eval()


def pixels(grid):
    torch.manual_seed(1)
    return torch.randn(int(sum(t * h * w for t, h, w in grid.tolist())), 3 * 2 * 16 * 16)


def run(tower, grid):
    with torch.no_grad():
        return tower(pixels(grid), grid_thw=grid).pooler_output


@pytest.mark.parametrize('build', [qwen3_vl_tower, qwen3_5_moe_tower], ids=['qwen3_vl', 'qwen3_5_moe'])
@pytest.mark.parametrize('grid', list(GRIDS.values()), ids=list(GRIDS))
def test_precomputed_preamble_gives_the_towers_own_outputs(build, grid):
    grid = torch.tensor(grid)
    tower = build()
    expected = run(tower, grid)
    hook, record = vision_preamble.install(tower, {vision_preamble.ENV: 'prefetch'})
    assert record['tower'] == type(tower).__name__
    hook.stage(grid, vision_preamble.precompute(tower, grid.clone()))  # made from a copy, as on the prefetch thread
    got = run(tower, grid)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert hook.summary()['forwards_fed'] == 1
    assert run(tower, grid).shape == expected.shape  # nothing staged: the tower computes its own again
    hook.remove()


def hooked_with_wrong_weights(tower, grid):
    """(the tower's own output, the hook, a preamble whose position-embedding weights are all zero)."""
    expected = run(tower, grid)
    hook, _ = vision_preamble.install(tower, {vision_preamble.ENV: 'prefetch'})
    staged = vision_preamble.precompute(tower, grid)
    staged['interp_weights'] = staged['interp_weights'] * 0  # no position embedding: an output that uses it changes
    return expected, hook, staged


def test_the_tower_uses_what_was_staged_and_vit_attention_its_split_sizes():
    grid = torch.tensor(GRIDS['one_video'])
    expected, hook, staged = hooked_with_wrong_weights(qwen3_5_moe_tower(), grid)
    assert staged[vision_preamble.SPLIT_SIZES_KEY] == [24] * 4
    hook.stage(grid, staged)
    assert not torch.allclose(run(hook.tower, grid), expected)
    assert getattr(staged['cu_seqlens'], vit_attention._CACHE_ATTR) == [24] * 4


def test_a_call_with_another_grid_tensor_computes_its_own():
    grid = torch.tensor(GRIDS['two_sizes'])
    expected, hook, staged = hooked_with_wrong_weights(qwen3_vl_tower(), grid)
    hook.stage(grid.clone(), staged)  # staged for another tensor (say, the images' grid)
    torch.testing.assert_close(run(hook.tower, grid), expected, rtol=0, atol=0)
    assert hook.summary()['unmatched'] == 1 and hook.summary()['forwards_fed'] == 0


def test_off_by_default_and_a_tower_with_other_calls_is_left_alone():
    tower = qwen3_vl_tower()
    assert vision_preamble.install(tower, {}) == (None, {'setting': 'model'})

    class Tower(torch.nn.Module):  # a forward that does not make the mirrored calls
        num_grid_per_side = 8

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList()

        def forward(self, hidden_states, grid_thw, **kwargs):
            return hidden_states

    hook, record = vision_preamble.install(Tower(), {vision_preamble.ENV: 'prefetch'})
    assert hook is None and 'does not call get_vision_interpolation_indices_and_weights' in record['not_installed']
    hook, record = vision_preamble.install(torch.nn.Linear(2, 2), {vision_preamble.ENV: 'prefetch'})
    assert hook is None and record['not_installed'].startswith('no vision tower')


def test_the_full_model_hands_the_tower_the_grid_tensor_it_was_given(tiny_qwen3_5_moe_dir):
    """Qwen3.5-MoE's get_video_features passes the caller's video_grid_thw to the tower as is: the runner stages
    the preamble for the tensor it passes to the model."""
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_5_moe_dir, dtype=torch.float32).eval()
    hook, record = vision_preamble.install(model, {vision_preamble.ENV: 'prefetch'})
    assert hook is not None, record
    tower = hook.tower
    p = tower.config.patch_size
    grid = torch.tensor([[2, 4, 4]])
    pix = torch.randn(32, tower.config.in_channels * tower.config.temporal_patch_size * p * p)
    with torch.no_grad():
        expected = model.model.get_video_features(pix, grid).pooler_output
        hook.stage(grid, vision_preamble.precompute(tower, grid.clone()))
        got = model.model.get_video_features(pix, grid).pooler_output
    assert hook.summary()['forwards_fed'] == 1
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
