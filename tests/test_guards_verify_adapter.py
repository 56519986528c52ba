"""`swift-vora verify-adapter`: reload base + adapter in a fresh process and compare every saved tensor."""
import json
import os
import subprocess
import sys
import types

import peft
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter on the tiny model with non-zero B (as after training), saved by PEFT."""
    from transformers import Qwen3VLForConditionalGeneration
    out = tmp_path_factory.mktemp('adapter') / 'checkpoint-1'
    torch.manual_seed(0)
    model = peft.get_peft_model(Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_dir),
                                peft.LoraConfig(r=4, target_modules=['q_proj', 'v_proj']))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if 'lora_B' in name:
                param.normal_()
    model.save_pretrained(str(out))
    return str(out)


def _renamed_copy(adapter_dir, dst):
    """The adapter with module paths that no longer match the model (e.g. saved under another layout)."""
    import shutil

    from safetensors.torch import load_file, save_file
    shutil.copytree(adapter_dir, dst)
    path = os.path.join(dst, 'adapter_model.safetensors')
    tensors = load_file(path)
    save_file({k.replace('.language_model.', '.text_model.'): v for k, v in tensors.items()}, path)
    return str(dst)


def test_cli_in_a_fresh_process_ok(adapter_dir, tiny_model_dir):
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'}
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'verify-adapter', adapter_dir, '--json'], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # the base came from adapter_config.json (no --base)
    assert report['ok'] and report['tensors'] == report['matched'] == 8 and report['base'] == tiny_model_dir


def test_renamed_keys_load_silently_then_fail_verification(adapter_dir, tiny_model_dir, tmp_path, capsys):
    from transformers import Qwen3VLForConditionalGeneration

    from swift_vora.guards.cli import run_verify_adapter
    broken = _renamed_copy(adapter_dir, tmp_path / 'broken')
    # Reproduce: PEFT loads it without an error -- and every lora_B is still zero: the user gets the base model.
    model = peft.PeftModel.from_pretrained(Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_dir), broken)
    assert all(float(p.abs().sum()) == 0 for n, p in model.named_parameters() if 'lora_B' in n)
    # verify-adapter: exit 1, every saved tensor missing, every loaded adapter tensor not in the file.
    code = run_verify_adapter(types.SimpleNamespace(checkpoint=broken, base=tiny_model_dir, json=False))
    out = capsys.readouterr().out
    assert code == 1 and out.startswith('FAILED: 0 of 8 saved adapter tensors match')
    assert out.count('missing (saved, not in the loaded model)') == 8 and out.count('not in file') == 8


def test_usage_errors(tmp_path, capsys):
    from swift_vora.cli import main
    assert main(['verify-adapter', str(tmp_path)]) == 2
    assert 'adapter_model.safetensors does not exist' in capsys.readouterr().err


def test_truncated_adapter_file_is_a_usage_error_not_a_traceback(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    from swift_vora.cli import main
    path = tmp_path / 'adapter_model.safetensors'
    save_file({'lora_A': torch.zeros(64, 64)}, str(path))
    path.write_bytes(path.read_bytes()[:-100])  # a copy cut short
    assert main(['verify-adapter', str(tmp_path), '--json']) == 2
    captured = capsys.readouterr()
    assert 'truncated or damaged' in captured.err and 'Traceback' not in captured.err
    assert json.loads(captured.out)['exit_code'] == 2


@pytest.mark.slow
def test_training_runs_it_after_the_final_save(guards_ddp_run):
    assert guards_ddp_run['rc'] == 0, guards_ddp_run['log'][-3000:]
    report = json.load(open(os.path.join(guards_ddp_run['run_dir'], 'verify_adapter.json')))
    assert report['exit_code'] == 0 and report['ok'] and report['matched'] == report['tensors'] == 28
    assert 'swift-vora verify_adapter: 28 of 28 saved adapter tensors match after reload' in guards_ddp_run['log']


def _meminfo(tmp_path, available_gib):
    path = tmp_path / 'meminfo'
    path.write_text(f'MemTotal: {128 * 2**20} kB\nMemAvailable: {int(available_gib * 2**20)} kB\n')
    return str(path)


def test_reload_goes_to_the_gpu_only_when_the_host_has_no_room(tmp_path, monkeypatch, capsys):
    """A 35B MoE whose checkpoint sits in a RAM-backed tmpfs leaves no room for a second copy in host RAM: the
    reload then takes the GPU (freed by the trainer) instead of being killed by the OOM killer."""
    import torch

    from swift_vora.guards import verify_adapter as va
    base = tmp_path / 'base'
    base.mkdir()
    for i in range(2):
        with open(base / f'model-0000{i}.safetensors', 'wb') as f:
            f.truncate(3 * 2**30)  # sparse: 6 GiB of "weights", no disk used
    assert va.checkpoint_bytes(str(base)) == 6 * 2**30
    monkeypatch.setenv('SWIFT_VORA_CGROUP_ROOT', str(tmp_path / 'no-cgroup'))
    monkeypatch.setenv('SWIFT_VORA_MEMINFO', _meminfo(tmp_path, 60))
    assert va.load_device(str(base)) is None  # room in host RAM: transformers' default
    monkeypatch.setenv('SWIFT_VORA_MEMINFO', _meminfo(tmp_path, 5))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (100 * 2**30, 140 * 2**30))
    assert va.load_device(str(base)) == 'cuda'
    assert 'reloading on the GPU' in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (4 * 2**30, 140 * 2**30))
    assert va.load_device(str(base)) is None
    assert 'may run out of memory' in capsys.readouterr().err
    assert va.load_device('Qwen/some-hub-id') is None  # not a local folder: nothing to measure


def test_a_damaged_adapter_config_is_named(adapter_dir, tmp_path, capsys):
    import shutil

    from swift_vora.cli import main
    dst = tmp_path / 'checkpoint-1'
    shutil.copytree(adapter_dir, dst)
    (dst / 'adapter_config.json').write_text('{"base_model_name_or_path": ')  # cut off mid-write
    assert main(['verify-adapter', str(dst)]) == 2
    assert f"{dst / 'adapter_config.json'}: not valid JSON" in capsys.readouterr().err


def test_an_adapter_that_does_not_fit_its_base_is_a_usage_error_naming_both(adapter_dir, tiny_model_dir,
                                                                             monkeypatch, capsys):
    from swift_vora.cli import main

    def mismatch(*args, **kwargs):  # what PEFT raises for a base of other shapes
        raise RuntimeError('Error(s) in loading state_dict for PeftModelForCausalLM:\n\tsize mismatch for '
                           'base_model.model.q_proj.lora_A.default.weight')
    monkeypatch.setattr(peft.PeftModel, 'from_pretrained', mismatch)
    assert main(['verify-adapter', adapter_dir, '--base', tiny_model_dir]) == 2
    err = capsys.readouterr().err
    assert f'the adapter {adapter_dir} does not load on the base {tiny_model_dir}' in err and 'internal' not in err


def test_the_training_guard_stops_on_an_adapter_saved_without_safetensors(tmp_path, monkeypatch):
    from swift_vora.guards.common import GuardError
    from swift_vora.guards.verify_adapter import VerifyAdapterGuard
    ckpt = tmp_path / 'checkpoint-2'
    ckpt.mkdir()
    (ckpt / 'adapter_config.json').write_text('{}')
    (ckpt / 'adapter_model.bin').write_bytes(b'')  # save_safetensors false
    monkeypatch.setenv('RANK', '0')
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    guard = VerifyAdapterGuard(args, types.SimpleNamespace(args=args))
    state = types.SimpleNamespace(last_model_checkpoint=str(ckpt))
    with pytest.raises(GuardError, match='holds an adapter without adapter_model.safetensors'):
        guard.on_train_end(None, state, None)
    (ckpt / 'adapter_config.json').unlink()  # a full-parameter checkpoint: nothing to verify, said and skipped
    guard.on_train_end(None, state, None)
