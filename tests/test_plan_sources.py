"""Planning before any download: where config.json comes from, the one default sample, the hardware profiles."""
import json
import os
import subprocess
import sys

import pytest

from swift_vora.budget import VideoBudget
from swift_vora.cli.plan import plan_from_argv
from swift_vora.plan import hardware, probe
from swift_vora.plan.model_source import resolve_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED_2B = os.path.join(REPO, 'swift_vora', 'plan', 'model_configs', 'Qwen--Qwen3-VL-2B-Instruct.json')


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    """No Hugging Face or ModelScope cache: what a fresh machine has."""
    for var in ('HF_HOME', 'HF_HUB_CACHE', 'XDG_CACHE_HOME', 'MODELSCOPE_CACHE'):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hf'))
    monkeypatch.setenv('MODELSCOPE_CACHE', str(tmp_path / 'ms'))
    for var in [k for k in os.environ if k.startswith('SWIFT_VORA_')]:
        monkeypatch.delenv(var)
    return tmp_path


def small_config(hidden=64):
    with open(SHIPPED_2B) as f:
        d = json.load(f)
    d['text_config']['hidden_size'] = hidden
    return d


def hf_cache_entry(hub, repo_id, config, revision='abc123', main=True):
    repo = hub / ('models--' + repo_id.replace('/', '--'))
    snap = repo / 'snapshots' / revision
    snap.mkdir(parents=True)
    (snap / 'config.json').write_text(json.dumps(config))
    if main:
        (repo / 'refs').mkdir(exist_ok=True)
        (repo / 'refs' / 'main').write_text(revision)
    return snap / 'config.json'


def test_model_id_and_missing_path_resolve_to_the_shipped_config(empty_caches):
    cfg, src = resolve_config('Qwen/Qwen3-VL-2B-Instruct')
    assert src.kind == 'shipped' and src.model_id == 'Qwen/Qwen3-VL-2B-Instruct' and cfg['model_type'] == 'qwen3_vl'
    cfg, src = resolve_config('/models/Qwen3-VL-2B-Instruct')  # a recipe's download target, not there yet
    assert src.kind == 'shipped' and not src.local_model and '/models/Qwen3-VL-2B-Instruct' in src.describe()


def test_hf_cache_wins_over_the_shipped_config(empty_caches, monkeypatch):
    hub = empty_caches / 'hf'
    path = hf_cache_entry(hub, 'Qwen/Qwen3-VL-2B-Instruct', small_config(96))
    hf_cache_entry(hub, 'Qwen/Qwen3-VL-2B-Instruct', small_config(32), revision='old', main=False)
    cfg, src = resolve_config('Qwen/Qwen3-VL-2B-Instruct')
    assert src.kind == 'hf_cache' and src.path == str(path) and cfg['text_config']['hidden_size'] == 96
    cfg, src = resolve_config('/models/qwen3-vl-2b-instruct')  # by name, case-insensitive
    assert src.kind == 'hf_cache'
    # HF_HOME/hub is used when HF_HUB_CACHE is not set
    monkeypatch.delenv('HF_HUB_CACHE')
    monkeypatch.setenv('HF_HOME', str(empty_caches / 'home'))
    hf_cache_entry(empty_caches / 'home' / 'hub', 'acme/Tiny-VL', small_config(48))
    cfg, src = resolve_config('acme/Tiny-VL')
    assert src.kind == 'hf_cache' and cfg['text_config']['hidden_size'] == 48


def test_modelscope_cache_with_dotted_names(empty_caches):
    d = empty_caches / 'ms' / 'hub' / 'models' / 'Qwen' / 'Qwen3___6-35B-A3B'
    d.mkdir(parents=True)
    (d / 'config.json').write_text(json.dumps(small_config(80)))
    cfg, src = resolve_config('Qwen/Qwen3.6-35B-A3B')
    assert src.kind == 'modelscope_cache' and src.model_id == 'Qwen/Qwen3.6-35B-A3B'


def test_local_directory_first_and_errors(empty_caches, tmp_path):
    d = tmp_path / 'Qwen3-VL-2B-Instruct'
    d.mkdir()
    with pytest.raises(FileNotFoundError, match='no config.json in the model directory'):
        resolve_config(str(d))
    (d / 'config.json').write_text(json.dumps(small_config(40)))
    cfg, src = resolve_config(str(d))
    assert src.kind == 'path' and src.local_model and cfg['text_config']['hidden_size'] == 40
    with pytest.raises(FileNotFoundError, match="no config.json for 'nobody/Nothing'.*Qwen/Qwen3-VL-2B-Instruct"):
        resolve_config('nobody/Nothing')
    bad = tmp_path / 'bad.json'
    bad.write_text('{"model_type": "llama",\n oops}')
    from swift_vora.plan.model_spec import ConfigError
    with pytest.raises(ConfigError, match=r'bad.json: not valid JSON \(line 2'):
        resolve_config(str(bad))


def test_a_plan_of_a_models_config_json_commands_its_directory(empty_caches, tmp_path, monkeypatch):
    """`plan --model DIR/config.json` (or `config.json` inside the directory) prints a command whose `--model` is the
    directory: swift sft reads a model directory, never the file."""
    d = tmp_path / 'Qwen3-VL-2B-Instruct'
    d.mkdir()
    with open(SHIPPED_2B) as f:
        (d / 'config.json').write_text(f.read())

    def model_arg(path):
        command = plan_from_argv(['--model', path, '--hardware', 'h200x1']).command
        return command[command.index('--model') + 1]

    assert model_arg(str(d / 'config.json')) == model_arg(str(d)) == str(d)
    monkeypatch.chdir(d)
    assert model_arg('config.json') == '.'


def test_plan_json_and_text_say_where_the_config_came_from(empty_caches):
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, '-m', 'swift_vora', 'plan', '--model', 'Qwen/Qwen3-VL-2B-Instruct',
                        '--hardware', '3060x4', '--json'], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    src = json.loads(r.stdout)['config_source']
    assert src['kind'] == 'shipped' and src['path'].endswith('Qwen--Qwen3-VL-2B-Instruct.json')
    r = subprocess.run([sys.executable, '-m', 'swift_vora', 'plan', '--model', '/models/Qwen3-VL-2B-Instruct',
                        '--hardware', '3060x4'], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 0 and 'config   : Qwen/Qwen3-VL-2B-Instruct from the configuration shipped' in r.stdout


def test_train_dry_run_of_a_recipe_on_a_fresh_clone(empty_caches):
    """recipes/3060x4.yaml points at /models/Qwen3-VL-2B-Instruct, which a fresh machine does not have."""
    env = dict(os.environ, PYTHONPATH=REPO)
    assert not os.path.exists('/models/Qwen3-VL-2B-Instruct')
    r = subprocess.run([sys.executable, '-m', 'swift_vora', 'train', 'recipes/3060x4.yaml', '--dry-run', '--json',
                        '--trust-recipe-hardware'], capture_output=True, text=True, env=env, cwd=REPO)
    out = json.loads(r.stdout)  # planned and shown; its exit code is the launch's: the weights are not there
    assert out['plan']['verdict'] == 'fits' and out['plan']['config_source']['kind'] == 'shipped'
    assert '--model_type' in out['launch']['argv'] and 'qwen3_vl' in out['launch']['argv']
    assert r.returncode == 2 == out['exit_code'] and 'download the model first' in out['not_launched'][0], r.stderr
    # without --dry-run it stops before launching. The machine first: this one is not 4 x RTX 3060, and advising a
    # download for a recipe that cannot run here would be the wrong first word
    from swift_vora.plan.hardware import local, machine_mismatch, profile
    r = subprocess.run([sys.executable, '-m', 'swift_vora', 'train', 'recipes/3060x4.yaml'],
                       capture_output=True, text=True, env=env, cwd=REPO)
    if machine_mismatch(profile('3060x4'), local(use_torch=True), needs_bf16=True):
        assert r.returncode == 4 and 'is not this machine' in r.stderr and 'download' not in r.stderr
    # on a machine the recipe trusts, the weights: they are not there
    r = subprocess.run([sys.executable, '-m', 'swift_vora', 'train', 'recipes/3060x4.yaml', 'hardware_check=false'],
                       capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 2 and 'download the model first' in r.stderr


# ----- one default sample ------------------------------------------------------------------------------------
def test_plan_defaults_are_the_templates_budget(empty_caches):
    from swift_vora.backends.recipe import SCHEMA
    from swift_vora.data.windowing import WindowConfig
    b = VideoBudget()
    for key in ('fps', 'min_frames', 'max_frames', 'pair_tokens', 'min_pair_tokens', 'max_video_tokens'):
        assert SCHEMA[f'video.{key}'][1] == getattr(b, key), key
    p = plan_from_argv(['--model', 'Qwen/Qwen3-VL-2B-Instruct', '--hardware', 'h200x1'])
    t = p.tokens
    assert t['tokens_per_group'] == b.pair_tokens and t['frames'] == b.frames_for(WindowConfig().window)
    assert t['clip_seconds'] == WindowConfig().window


def test_one_name_per_knob_across_flags_and_environment(empty_caches, monkeypatch):
    base = ['--model', 'Qwen/Qwen3-VL-2B-Instruct', '--hardware', 'h200x1']
    new = plan_from_argv(base + ['--pair-tokens', '100', '--window', '20']).tokens
    old = plan_from_argv(base + ['--frame-tokens', '100', '--clip-seconds', '20']).tokens
    assert new == old and new['tokens_per_group'] == 100 and new['frames'] == 40
    monkeypatch.setenv('SWIFT_VORA_PAIR_TOKENS', '64')
    monkeypatch.setenv('SWIFT_VORA_MAX_FRAMES', '16')
    t = plan_from_argv(base).tokens
    assert (t['tokens_per_group'], t['frames']) == (64, 16)
    assert plan_from_argv(base + ['--max-frames', '8']).tokens['frames'] == 8  # a flag beats the environment
    # max_video_tokens caps frames and tokens per pair the way the template does
    t = plan_from_argv(base + ['--max-video-tokens', '256']).tokens
    assert t['vision_tokens'] <= 256


# ----- hardware ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name, gpus, gib', [
    ('a100-40x8', 8, 39.39), ('a100-80x8', 8, 79.15), ('h100x8', 8, 79.11), ('l40sx4', 4, 44.39),
    ('4090x1', 1, 23.65), ('4090x2', 2, 23.65), ('3090x1', 1, 23.69), ('3060x4', 4, 11.76), ('h200x1', 1, 139.8)])
def test_profiles_use_the_memory_torch_reports(name, gpus, gib):
    hw = hardware.resolve(name)
    assert (hw.num_gpus, hw.gpu_mem_gib) == (gpus, gib) and hw.host_ram_gib > 0 and hw.host_ram_source


def test_plan_accepts_every_profile(empty_caches):
    for name in hardware.PROFILES:
        p = plan_from_argv(['--model', 'Qwen/Qwen3-VL-8B-Instruct', '--hardware', name])
        assert p.verdict in ('fits', 'does_not_fit') and p.gpu_capacity_gib == hardware.PROFILES[name][1]


def test_local_hardware_from_nvidia_smi_uses_torchs_total(monkeypatch):
    class R:
        stdout = '0, NVIDIA A100-SXM4-40GB, 40960, 40000\n1, NVIDIA A100-SXM4-40GB, 40960, 40000\n'

    monkeypatch.setenv('SWIFT_VORA_PROBE_TORCH', '0')
    monkeypatch.setattr(probe.shutil, 'which', lambda name: '/usr/bin/nvidia-smi')
    monkeypatch.setattr(probe.subprocess, 'run', lambda *a, **k: R())
    hw = hardware.resolve('local')
    assert hw.num_gpus == 2 and hw.gpu_mem_gib == 39.39 and 'driver-reserved' in hw.notes[0]
    assert hardware.torch_gib_from_smi('NVIDIA GeForce RTX 4090', 48.0) is None  # a 48 GB card is not a 24 GB 4090
    assert hardware.torch_gib_from_smi('Some New GPU', 90.0) is None


def test_cached_weights_make_a_model_id_trainable_and_names_fall_back(empty_caches):
    hub = empty_caches / 'hf'
    path = hf_cache_entry(hub, 'acme/Tiny-VL', small_config(48))
    assert not resolve_config('acme/Tiny-VL')[1].local_model  # config only: weights still to download
    (path.parent / 'model.safetensors').write_bytes(b'')
    assert resolve_config('acme/Tiny-VL')[1].local_model
    assert not resolve_config('/models/Tiny-VL')[1].local_model  # swift could not load that path
    # another organisation's upload of the same model resolves by name, and says which repository it used
    cfg, src = resolve_config('someone/Qwen3-VL-2B-Instruct')
    assert src.kind == 'shipped' and src.model_id == 'Qwen/Qwen3-VL-2B-Instruct'


def test_unusable_config_is_invalid_input_for_plan_and_train(tmp_path):
    """exit 1 with the file and the field named, never a traceback (a stub config or a non-string model_type)."""
    env = dict(os.environ, PYTHONPATH=REPO)
    for content, field in (({'model_type': 'qwen3_vl'}, "'hidden_size'"), ({'model_type': 7}, "'model_type'")):
        d = tmp_path / f'm{len(field)}'
        d.mkdir()
        (d / 'config.json').write_text(json.dumps(content))
        for argv in (['plan', '--model', str(d), '--hardware', 'h200x1'],
                     ['train', 'recipes/3060x4.yaml', f'model.path={d}', 'model.type=null', '--dry-run']):
            r = subprocess.run([sys.executable, '-m', 'swift_vora', *argv], capture_output=True, text=True, env=env,
                               cwd=REPO)
            assert r.returncode == 1, (argv, r.stderr)
            assert str(d / 'config.json') in r.stderr and field in r.stderr and 'Traceback' not in r.stderr


def test_a_bad_budget_in_the_environment_names_the_variable(empty_caches, monkeypatch):
    from swift_vora.cli.plan import PlanUsageError
    base = ['--model', 'Qwen/Qwen3-VL-2B-Instruct', '--hardware', 'h200x1']
    monkeypatch.setenv('SWIFT_VORA_PAIR_TOKENS', 'abc')
    with pytest.raises(PlanUsageError, match="SWIFT_VORA_PAIR_TOKENS='abc'"):
        plan_from_argv(base)
    monkeypatch.delenv('SWIFT_VORA_PAIR_TOKENS')
    monkeypatch.setenv('SWIFT_VORA_WINDOW', 'soon')
    with pytest.raises(PlanUsageError, match="SWIFT_VORA_WINDOW='soon'"):
        plan_from_argv(base)
