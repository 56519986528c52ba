"""Shared fixtures. Sections are owned by the module whose tests use them; append, never overwrite."""
import os

import pytest

OFFLINE_ENV = {'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1',
               'MODELSCOPE_OFFLINE': '1', 'USE_HF': '1', 'TOKENIZERS_PARALLELISM': 'false'}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen3-VL checkpoint (built once per test session, offline)."""
    from swift_vora.tiny_model import build_tiny_qwen3_vl
    return build_tiny_qwen3_vl(str(tmp_path_factory.mktemp('tiny_qwen3_vl')))


@pytest.fixture(scope='session')
def tiny_moe_model_dir(tmp_path_factory):
    """A tiny random Qwen3-VL-MoE checkpoint (built once per test session, offline)."""
    from swift_vora.tiny_model import build_tiny_qwen3_vl
    return build_tiny_qwen3_vl(str(tmp_path_factory.mktemp('tiny_qwen3_vl_moe')), moe=True)


@pytest.fixture(scope='session')
def offline_env():
    """Environment for subprocesses: offline hub flags on top of the current environment."""
    return {**os.environ, **OFFLINE_ENV}


# --- swift_vora.data tests: synthetic videos -------------------------------------------------------
import pytest as _data_pytest


@_data_pytest.fixture
def make_video(tmp_path):
    """Factory: `make_video(name, frames=35, fps=10.0, size=(32, 24))` writes a small mp4v file under
    tmp_path (duration = frames / fps) and returns its path."""
    def _make(name='clip.mp4', frames=35, fps=10.0, size=(32, 24)):
        import cv2
        import numpy as np

        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*'mp4v'), fps, size)
        assert writer.isOpened(), f'OpenCV cannot write {path}'
        for i in range(frames):
            writer.write(np.full((size[1], size[0], 3), (i * 7) % 256, np.uint8))
        writer.release()
        return path
    return _make
