"""Probing: a real video reports its length within one frame; unusable files say why and where."""
import pytest

from swift_vora.data.probe import VideoProbeError, probe_duration, probe_video


@pytest.mark.parametrize('backend', ['decord', 'opencv'])
def test_probe_synthetic_mp4_duration_within_one_frame(make_video, backend):
    path = make_video('clip.mp4', frames=35, fps=10.0, size=(32, 24))
    info = probe_video(path, backend=backend)
    assert info.backend == backend
    assert abs(info.duration - 3.5) <= 1 / 10.0
    assert info.frames == 35
    assert info.fps == pytest.approx(10.0, rel=1e-3)
    assert (info.width, info.height) == (32, 24)


def test_probe_duration_matches_probe_video(make_video):
    path = make_video('a.mp4', frames=20, fps=4.0)
    assert probe_duration(path) == probe_video(path).duration
    assert abs(probe_duration(str(path)) - 5.0) <= 0.25


def test_missing_file(tmp_path):
    path = tmp_path / 'nope.mp4'
    with pytest.raises(VideoProbeError) as err:
        probe_duration(path)
    assert isinstance(err.value, ValueError)
    assert err.value.path == str(path)
    assert str(path) in str(err.value) and 'not found' in str(err.value)


def test_empty_file(tmp_path):
    path = tmp_path / 'empty.mp4'
    path.write_bytes(b'')
    with pytest.raises(VideoProbeError, match=r'empty \(0 bytes\)') as err:
        probe_video(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize('backend', ['decord', 'opencv'])
def test_undecodable_file(tmp_path, backend):
    path = tmp_path / 'junk.mp4'
    path.write_bytes(b'this is not a video' * 50)
    with pytest.raises(VideoProbeError, match='cannot be decoded') as err:
        probe_video(path, backend=backend)
    assert str(path) in str(err.value)


def test_directory_is_not_a_video(tmp_path):
    with pytest.raises(VideoProbeError, match='not a regular file'):
        probe_video(tmp_path)


def test_unknown_backend_is_a_usage_error(make_video):
    with pytest.raises(ValueError, match='unknown video backend'):
        probe_video(make_video(), backend='ffmpeg-cli')
