"""Guard `fingerprint`: what ran -- interpreter, packages, commit/dirty, plugin and recipe hashes, argv, env."""
import json
import os
import subprocess

import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])


def _git(*args, cwd):
    subprocess.run(['git', *args], cwd=cwd, check=True, capture_output=True)


def test_git_state_and_plugin_hash_follow_the_code(tmp_path):
    from swift_vora.guards.fingerprint import git_state, plugin_hashes
    pkg = tmp_path / 'repo' / 'pkg'
    pkg.mkdir(parents=True)
    (pkg / 'mod.py').write_text('X = 1\n')
    _git('init', '-q', cwd=tmp_path / 'repo')
    _git('add', '.', cwd=tmp_path / 'repo')
    _git('-c', 'user.email=t@t', '-c', 'user.name=t', 'commit', '-qm', 'x', cwd=tmp_path / 'repo')
    clean, before = git_state(str(pkg)), plugin_hashes(str(pkg))
    assert clean['commit'] and clean['dirty'] is False
    # Reproduce what a run record without a fingerprint misses: the same commit, different code.
    (pkg / 'mod.py').write_text('X = 2\n')
    dirty, after = git_state(str(pkg)), plugin_hashes(str(pkg))
    assert dirty['commit'] == clean['commit'] and dirty['dirty'] is True and dirty['dirty_files'] == ['pkg/mod.py']
    assert after['combined_sha256'] != before['combined_sha256']
    assert git_state(str(tmp_path))['commit'] is None  # outside git: said, not guessed


def test_fingerprint_contents(tmp_path, monkeypatch):
    from swift_vora.guards.fingerprint import build_fingerprint, sha256_file
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text('model: x\n')
    monkeypatch.setenv('SWIFT_VORA_RECIPE', str(recipe))
    monkeypatch.setenv('SWIFT_VORA_RECIPE_OVERRIDES', json.dumps(['video.max_frames=4']))
    monkeypatch.setenv('VIDEO_MAX_TOKEN_NUM', '128')
    monkeypatch.setenv('NCCL_DEBUG', 'INFO')
    monkeypatch.setenv('HF_TOKEN', 'hf_secret_value')
    monkeypatch.setenv('TOKENIZERS_PARALLELISM', 'false')
    monkeypatch.setenv('UNRELATED_VAR', '1')
    fp = build_fingerprint()
    assert fp['python']['executable'] and fp['python']['version']
    assert fp['packages']['ms-swift'] and fp['packages']['torch'] and fp['packages']['transformers']
    assert fp['recipe'] == {'path': str(recipe), 'sha256': sha256_file(str(recipe)),
                            'overrides': ['video.max_frames=4']}
    env = fp['env']
    assert env['VIDEO_MAX_TOKEN_NUM'] == '128' and env['NCCL_DEBUG'] == 'INFO'
    assert env['HF_TOKEN'] == '<redacted>' and env['TOKENIZERS_PARALLELISM'] == 'false'
    assert 'UNRELATED_VAR' not in env and 'hf_secret_value' not in json.dumps(fp)
    plugin = fp['swift_vora']['plugin']
    assert 'guards/fingerprint.py' in plugin['files'] and len(plugin['combined_sha256']) == 64
    git = fp['swift_vora']['git']
    assert git['repo'] is None or os.path.isdir(git['repo'])
    from swift_vora.patches import PATCHES
    assert set(fp['patches']) == {p.name for p in PATCHES}
    vit = fp['patches']['vit_attention_qwen3_vl']
    assert vit['package'] == 'transformers' and vit['version'] == fp['packages']['transformers']
    assert vit['known'] is True and vit['policy'] == 'skip'


@pytest.mark.slow
def test_fingerprint_written_by_a_run(guards_ddp_run):
    assert guards_ddp_run['rc'] == 0, guards_ddp_run['log'][-3000:]
    fp = json.load(open(os.path.join(guards_ddp_run['run_dir'], 'fingerprint.json')))
    assert fp['world_size'] == 2 and fp['env']['NPROC_PER_NODE'] == '2'
    assert '--custom_register_path' in fp['command_line']
    assert 'swift-vora fingerprint: python' in guards_ddp_run['log']
    # the plugin import applied the vision attention and the default callbacks in the training process
    assert fp['patches']['default_callbacks']['applied'] and fp['patches']['vit_attention_qwen3_vl']['applied']
