"""Shared fixtures. Sections are owned by the module whose tests use them; append, never overwrite."""
import os

import pytest

from swift_vora.offline import OFFLINE_ENV as _SWIFT_OFFLINE_ENV

OFFLINE_ENV = {**_SWIFT_OFFLINE_ENV, 'TOKENIZERS_PARALLELISM': 'false'}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def no_budget_left_behind():
    """A command run in-process must leave the SWIFT_VORA_* environment as it found it: a value left behind reads as
    one the user exported (a later template trains on the wrong budget; a later eval keeps the first checkpoint's)."""
    before = {k: v for k, v in os.environ.items() if k.startswith('SWIFT_VORA_')}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith('SWIFT_VORA_')}
    if after != before:
        for key in set(after) - set(before):
            del os.environ[key]
        os.environ.update(before)
        pytest.fail(f'the test left SWIFT_VORA_* changed in os.environ: before {before}, after {after}')


@pytest.fixture(scope='session')
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen3-VL checkpoint (built once per test session, offline)."""
    from swift_vora.tiny_model import build_tiny_qwen3_vl
    return build_tiny_qwen3_vl(str(tmp_path_factory.mktemp('tiny_qwen3_vl')))


@pytest.fixture(scope='session')
def qwen3_vl_tiny_dir(tmp_path_factory):
    """`build_qwen3_vl(..., 'tiny')`: the 2-layer Qwen3-VL the speed levers' tests train (compile_layers,
    selective_checkpoint, partial_checkpoint)."""
    from swift_vora.tiny_model import build_qwen3_vl
    return build_qwen3_vl(str(tmp_path_factory.mktemp('qwen3vl')), 'tiny')


@pytest.fixture
def reentrant_checkpoint(monkeypatch):
    """Every checkpoint call reentrant, as ms-swift makes it on one process (test_compile_layers.py)."""
    from test_compile_layers import force_reentrant_checkpoint
    force_reentrant_checkpoint(monkeypatch)


@pytest.fixture(scope='session')
def tiny_qwen3_5_moe_dir(tmp_path_factory):
    """A tiny random Qwen3.5-MoE checkpoint (built once per test session, offline; its users only read it)."""
    from swift_vora.tiny_model import build_qwen3_5_moe
    out = str(tmp_path_factory.mktemp('tiny_qwen3_5_moe'))
    build_qwen3_5_moe(out, shape='tiny')
    return out


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
@pytest.fixture
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


# --- swift_vora.backends tests: a LoRA checkpoint trained through `swift-vora train recipes/cpu-tiny.yaml` ---
@pytest.fixture(scope='session')
def tiny_annotations(tmp_path_factory):
    """Synthetic clips with known answers and their annotation file (2 videos x 16 s)."""
    from swift_vora.synthetic import make_dataset
    return make_dataset(str(tmp_path_factory.mktemp('tiny_data')), 2, duration=16.0)


@pytest.fixture(scope='session')
def cpu_tiny_run(tiny_model_dir, tiny_annotations, tmp_path_factory, offline_env):
    """Runs the real launch path once: `swift-vora train recipes/cpu-tiny.yaml` (plan -> swift sft, 2 steps).
    Returns {'rc', 'output_dir', 'checkpoint', 'log'}."""
    import glob
    import subprocess
    import sys
    out = str(tmp_path_factory.mktemp('cpu_tiny_run'))
    argv = [sys.executable, '-m', 'swift_vora', 'train', os.path.join(REPO_ROOT, 'recipes', 'cpu-tiny.yaml'),
            f'model.path={tiny_model_dir}', f'data.dataset={tiny_annotations}', f'train.output_dir={out}']
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=offline_env, capture_output=True, text=True, timeout=600)
    found = sorted(glob.glob(os.path.join(out, 'v*', 'checkpoint-*')))
    return {'rc': proc.returncode, 'output_dir': out, 'checkpoint': found[-1] if found else None,
            'log': proc.stdout[-4000:] + proc.stderr[-4000:]}


# --- swift_vora.guards tests: real `swift sft` runs with the guards (issue 5) -----------------------------------
@pytest.fixture(scope='session')
def guard_sft():
    """Runner: `guard_sft(model_dir, rows, out_dir, env=None, nproc=1, extra=())` runs the reference
    `swift sft --custom_register_path swift_vora ...` (LoRA, 1 epoch, batch 1, CPU/gloo) from the repository root
    and returns {'rc', 'log', 'run_dir'} (run_dir: the v*-* directory ms-swift created, or None)."""
    import glob
    import subprocess
    import sys

    def _text_rows(path, n, answer='[[1.0, 3.0]]'):
        import json
        with open(path, 'w') as f:
            for i in range(n):
                f.write(json.dumps({'messages': [{'role': 'user', 'content': f'Query: item {i}'},
                                                 {'role': 'assistant', 'content': answer}],
                                    'chat_template_kwargs': {'sample_id': f't{i}'}}) + '\n')
        return str(path)

    def run(model_dir, rows, out_dir, env=None, nproc=1, extra=(), template='video_ora', timeout=300):
        swift = os.path.join(os.path.dirname(sys.executable), 'swift')
        argv = [swift, 'sft'] if os.path.exists(swift) else [sys.executable, '-m', 'swift.cli.main', 'sft']
        argv += ['--custom_register_path', 'swift_vora', '--model', str(model_dir), '--model_type', 'qwen3_vl',
                 '--template', template, '--dataset', str(rows), '--tuner_type', 'lora', '--target_modules',
                 'all-linear', '--num_train_epochs', '1', '--per_device_train_batch_size', '1',
                 '--gradient_accumulation_steps', '1', '--output_dir', str(out_dir), '--check_model', 'false',
                 '--fp16', 'false', '--bf16', 'false', '--torch_dtype', 'float32', '--dataloader_num_workers', '0',
                 '--save_steps', '100', '--logging_steps', '1', '--report_to', 'none', '--split_dataset_ratio', '0',
                 *extra]
        full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
        full_env.setdefault('PYTHONFAULTHANDLER', '1')  # a rank that dies in C++ prints every thread's Python stack
        if nproc > 1:
            argv += ['--ddp_backend', 'gloo']
            full_env['NPROC_PER_NODE'] = str(nproc)
            full_env.setdefault('MASTER_PORT', str(29500 + os.getpid() % 1000))
        proc = subprocess.run(argv, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
        runs = sorted(glob.glob(os.path.join(str(out_dir), 'v*-*')))
        return {'rc': proc.returncode, 'log': proc.stdout + proc.stderr, 'run_dir': runs[-1] if runs else None}

    run.text_rows = _text_rows
    return run


@pytest.fixture(scope='session')
def guards_ddp_run(tiny_model_dir, guard_sft, tmp_path_factory):
    """One 2-process (gloo) LoRA run with all guards on: 3 samples over 2 ranks (the tail case). The load check
    runs without ZeRO-3 too (`SWIFT_VORA_ZERO3_LOAD=always`), to exercise it inside the real trainer."""
    tmp = tmp_path_factory.mktemp('guards_ddp')
    rows = guard_sft.text_rows(tmp / 'rows.jsonl', 3)
    return guard_sft(tiny_model_dir, rows, tmp / 'out', nproc=2, env={'SWIFT_VORA_ZERO3_LOAD': 'always'})


# --- bad-input tests (tests/test_bad_input*.py; the harness is tests/cli_harness.py) -----------------------
@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A directory holding one valid file of each input kind; the working directory is moved there."""
    from cli_harness import write_inputs
    monkeypatch.chdir(tmp_path)
    return write_inputs(tmp_path)


# --- speed/moe_lora_scale.py and speed/moe_gather.py (tests/test_moe_lora_scale.py, tests/test_moe_gather.py) ---
@pytest.fixture
def load_cached_moe_utils(tmp_path, monkeypatch):
    """Loads a stand-in for unsloth_zoo's MoE module from its source as unsloth_zoo loads its compile-cache copy (a
    module from a file, `unsloth_cached_moe_utils` in sys.modules for the test): what the MoE levers patch."""
    import importlib.util
    import sys

    def load(source: str):
        path = tmp_path / 'moe_utils_stand_in.py'
        path.write_text(source)
        spec = importlib.util.spec_from_file_location('unsloth_cached_moe_utils', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, 'unsloth_cached_moe_utils', module)
        return module
    return load


@pytest.fixture
def load_pinned_moe_forward(load_cached_moe_utils, monkeypatch):
    """load_cached_moe_utils, then the stand-in's forward_native_grouped_mm pinned as the source the named rewrite
    patches were checked against (tests/test_moe_lora_scale.py, tests/test_moe_down_fold.py), every patch
    applicable."""
    import inspect

    from swift_vora import patches

    def load(source: str, *names: str):
        module = load_cached_moe_utils(source)
        digest = patches.source_hash(inspect.getsource(module.forward_native_grouped_mm))
        for name in names:
            monkeypatch.setitem(patches.BY_NAME, name, patches.BY_NAME[name]._replace(sources={'test': digest}))
        monkeypatch.setattr(patches, 'applicable', lambda name: True)
        return module
    return load
