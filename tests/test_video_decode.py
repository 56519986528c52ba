"""The decoder-thread limit for qwen_vl_utils' decord reader: default one thread, explicit arguments kept, the
frames unchanged, 0 restores decord's own class."""
import decord
import numpy as np
import pytest

from swift_vora import patches
from swift_vora.speed import video_decode


@pytest.fixture
def restore_decord():
    """Start from decord's own class (the plugin may have patched it already in this process: the template tests
    encode videos in-process) and put back whatever was there."""
    before = decord.VideoReader
    decord.VideoReader = patches.upstream(before)
    yield
    decord.VideoReader = before


def test_default_is_one_thread_and_frames_are_the_same(make_video, restore_decord, monkeypatch):
    path = str(make_video('clip.mp4', frames=40, fps=10.0, size=(64, 48)))
    reference = decord.VideoReader(path).get_batch([0, 13, 39]).asnumpy()
    seen = []
    original_init = decord.VideoReader.__init__

    def spy(self, uri, ctx=decord.cpu(0), width=-1, height=-1, num_threads=0, fault_tol=-1):
        seen.append(num_threads)
        original_init(self, uri, ctx, width, height, num_threads, fault_tol)

    monkeypatch.setattr(decord.VideoReader, '__init__', spy)
    monkeypatch.delenv(video_decode.ENV, raising=False)
    assert video_decode.limit_decord_threads() == 1
    assert video_decode.limit_decord_threads() == 1  # idempotent: one subclass, not a chain
    assert patches.upstream(decord.VideoReader).__init__ is spy
    reader = decord.VideoReader(path)  # how qwen_vl_utils opens a video
    assert isinstance(reader, patches.upstream(decord.VideoReader))
    np.testing.assert_array_equal(reader.get_batch([0, 13, 39]).asnumpy(), reference)
    decord.VideoReader(path, num_threads=3)
    decord.VideoReader(path, decord.cpu(0), -1, -1, 2)
    assert seen == [1, 3, 2]


def test_zero_restores_decord_and_bad_values_name_the_variable(restore_decord):
    original = decord.VideoReader
    video_decode.limit_decord_threads({video_decode.ENV: '2'})
    assert decord.VideoReader is not original and decord.VideoReader.default_threads == 2
    assert video_decode.limit_decord_threads({video_decode.ENV: '0'}) == 0
    assert decord.VideoReader is original
    for bad in ('two', '-1'):
        with pytest.raises(ValueError, match=video_decode.ENV):
            video_decode.decoder_threads({video_decode.ENV: bad})
