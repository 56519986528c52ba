"""Decoding without decord: the PyAV reader registered with qwen_vl_utils samples the same frames, at the same
indices and timestamps, as decord does for the same clip; without decord the template's reader is PyAV."""
import sys

import numpy as np
import pytest
import torch
from qwen_vl_utils import vision_process

from swift_vora.video_reader import FORCE_ENV, PYAV, prepare_video_reader, read_video_pyav, video_header

CLIPS = [  # what the template asks for: a window and a frame count, or an fps
    {'video_start': 1.25, 'video_end': 4.8, 'nframes': 8},
    {'nframes': 16},
    {'video_start': 6.0, 'video_end': 9.4, 'fps': 2.0},
]


@pytest.fixture
def h264_video(tmp_path):
    """10 s of H.264 at 25 fps with B-frames and a keyframe every 2 s (seeking lands before the wanted frame)."""
    import av
    path = tmp_path / 'h264.mp4'
    try:
        with av.open(str(path), 'w') as container:
            stream = container.add_stream('libx264', rate=25)
            stream.width, stream.height, stream.pix_fmt = 64, 48, 'yuv420p'
            stream.options = {'g': '50', 'bf': '3'}
            for i in range(250):
                image = np.full((48, 64, 3), (i * 3) % 256, np.uint8)
                image[:8, :8] = (255, 0, 0) if i % 2 else (0, 0, 255)
                for packet in stream.encode(av.VideoFrame.from_ndarray(image, format='rgb24')):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    except (av.FFmpegError, ValueError) as error:  # a PyAV build without libx264
        pytest.skip(f'this PyAV build cannot encode H.264 ({error})')
    return str(path)


@pytest.fixture
def mp4v_video(make_video):
    return str(make_video('mp4v.mp4', frames=95, fps=10.0, size=(64, 48)))


@pytest.fixture
def qwen_reader_state():
    """qwen_vl_utils chooses its reader once per process: put its choice back after each test."""
    before = vision_process.FORCE_QWENVL_VIDEO_READER
    yield
    vision_process.FORCE_QWENVL_VIDEO_READER = before
    vision_process.get_video_reader_backend.cache_clear()


@pytest.mark.parametrize('clip', CLIPS)
@pytest.mark.parametrize('kind', ['mp4v', 'h264'])
def test_pyav_and_decord_sample_the_same_frames_at_the_same_times(kind, clip, request):
    path = request.getfixturevalue(f'{kind}_video')
    frames_d, meta_d, fps_d = vision_process._read_video_decord({'video': path, **clip})
    frames_p, meta_p, fps_p = read_video_pyav({'video': path, **clip})
    assert meta_p['frames_indices'] == meta_d['frames_indices']
    assert meta_p['fps'] == meta_d['fps'] and meta_p['total_num_frames'] == meta_d['total_num_frames']
    timestamps = [i / meta_d['fps'] for i in meta_d['frames_indices']]  # what the processor prints per frame
    assert [i / meta_p['fps'] for i in meta_p['frames_indices']] == timestamps
    assert fps_p == fps_d and meta_p['video_backend'] == PYAV
    assert frames_p.dtype == frames_d.dtype == torch.uint8 and frames_p.shape == frames_d.shape
    assert torch.equal(frames_p, frames_d)  # the same ffmpeg decoder underneath: the same pixels


def test_video_header_is_the_same_with_either_reader(mp4v_video, h264_video):
    for path in (mp4v_video, h264_video):
        assert video_header(path, 'pyav') == video_header(path, 'decord')


def test_without_decord_qwen_vl_utils_reads_through_pyav(mp4v_video, monkeypatch, qwen_reader_state):
    clip = {'video': mp4v_video, **CLIPS[0]}
    reference = vision_process._read_video_decord(dict(clip))
    monkeypatch.delenv(FORCE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, 'decord', None)  # as on aarch64: decord does not import
    monkeypatch.setitem(sys.modules, 'torchcodec', None)
    assert prepare_video_reader() == PYAV
    assert vision_process.get_video_reader_backend() == PYAV
    video, metadata, fps = vision_process.VIDEO_READER_BACKENDS[vision_process.get_video_reader_backend()](dict(clip))
    assert torch.equal(video, reference[0]) and metadata['frames_indices'] == reference[1]['frames_indices']


def test_the_reader_named_in_force_qwenvl_video_reader_is_kept(monkeypatch, qwen_reader_state):
    monkeypatch.setenv(FORCE_ENV, PYAV)
    assert prepare_video_reader() == PYAV and vision_process.get_video_reader_backend() == PYAV
    monkeypatch.setenv(FORCE_ENV, 'decord')
    assert prepare_video_reader() == 'decord'
    monkeypatch.setenv(FORCE_ENV, 'ffmpeg')
    with pytest.raises(ValueError, match=f'{FORCE_ENV}=.ffmpeg.: qwen_vl_utils knows .*pyav'):
        prepare_video_reader()
