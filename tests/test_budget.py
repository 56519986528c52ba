from swift_vora.budget import VideoBudget


def test_frames_follow_fps_and_are_even_and_capped():
    b = VideoBudget(fps=2.0, min_frames=4, max_frames=64)
    assert b.frames_for(10.0) == 20
    assert b.frames_for(10.7) == 20  # floor to a whole frame pair
    assert b.frames_for(1.0) == 4  # min_frames
    assert b.frames_for(600.0) == 64  # max_frames


def test_total_video_token_cap_cuts_frames():
    b = VideoBudget(fps=2.0, max_frames=64, pair_tokens=100, max_video_tokens=1000)
    assert b.frames_for(60.0) == 20  # 10 pairs x 100 tokens


def test_env_then_row_overrides():
    b = VideoBudget.from_env({'SWIFT_VORA_FPS': '1.5', 'SWIFT_VORA_MAX_FRAMES': '16',
                              'SWIFT_VORA_MAX_VIDEO_TOKENS': 'none'})
    assert (b.fps, b.max_frames, b.max_video_tokens) == (1.5, 16, None)
    row = b.updated({'fps': 4, 'video_start': 3.0, 'pair_tokens': '64'})
    assert (row.fps, row.pair_tokens, row.max_frames) == (4.0, 64, 16)
    assert VideoBudget.from_env(b.to_env()) == b
