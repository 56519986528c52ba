"""Guard `verify_adapter`: the saved adapter is what a user gets back when loading it.

`verify_adapter(ckpt, base)` loads the base model with transformers (`from_pretrained` of the class named in
its config, as users do) and the adapter with `peft.PeftModel.from_pretrained`, then compares every tensor of
`adapter_model.safetensors` element-wise (in the saved dtype, NaN equals NaN) with the adapter tensors of the
loaded model (`peft.get_peft_model_state_dict`, i.e. under the saved names). A saved tensor that PEFT could not
place (module path renamed, wrong base) is *missing*; an adapter tensor of the loaded model that the file does
not hold was left at its initialisation (*not_in_file*). Any of these, or a different value, fails.

`swift-vora verify-adapter CKPT [--base MODEL] [--json]` runs it in a fresh process (cli.py). The training
guard runs that command in a subprocess on rank 0 after the final checkpoint is saved (`on_train_end`) and
stops (non-zero exit of the training command) when it fails. Base model: `--base`, else the checkpoint's
`adapter_config.json` (`base_model_name_or_path`), else ms-swift's `args.json` (`model`).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any, Dict, Optional

ADAPTER_FILE = 'adapter_model.safetensors'
TIMEOUT_ENV = 'SWIFT_VORA_VERIFY_TIMEOUT'


class VerifyError(Exception):
    """The checkpoint or base model cannot be found or loaded (usage-level problem)."""


def _read_json(path: str) -> dict:
    """A checkpoint's JSON file; VerifyError naming it when it is not a JSON object."""
    try:
        with open(path, encoding='utf-8') as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise VerifyError(f'{path}: not valid JSON ({e})') from None
    if not isinstance(value, dict):
        raise VerifyError(f'{path}: expected a JSON object, got {type(value).__name__}')
    return value


def find_base(ckpt: str) -> Optional[str]:
    config_path = os.path.join(ckpt, 'adapter_config.json')
    if os.path.isfile(config_path):
        base = _read_json(config_path).get('base_model_name_or_path')
        if base:
            return base
    for args_path in (os.path.join(ckpt, 'args.json'), os.path.join(os.path.dirname(os.path.abspath(ckpt)),
                                                                   'args.json')):
        if os.path.isfile(args_path):
            args = _read_json(args_path)
            base = args.get('model_dir') or args.get('model')
            if base:
                return base
    return None


def load_base_and_adapter(ckpt: str, base: str):
    import transformers
    from peft import PeftModel
    config = transformers.AutoConfig.from_pretrained(base, trust_remote_code=False)
    architectures = getattr(config, 'architectures', None) or []
    cls = getattr(transformers, architectures[0], None) if architectures else None
    if cls is None:
        cls = transformers.AutoModelForImageTextToText if hasattr(config, 'vision_config') else \
            transformers.AutoModelForCausalLM
    device = load_device(base)
    model = cls.from_pretrained(base, dtype='auto', **({'device_map': device} if device else {}))
    try:
        return PeftModel.from_pretrained(model, ckpt, is_trainable=False)
    except (RuntimeError, KeyError) as e:  # a base of other shapes: "size mismatch for ...lora_A.weight"
        raise VerifyError(f'the adapter {ckpt} does not load on the base {base}: {str(e).splitlines()[0][:400]} '
                          '(is it the model the adapter was trained on? --base names it)') from None


# Loading a checkpoint into host RAM holds its weights once more than the files (transformers copies them into the
# model's own tensors); ask for this much headroom before choosing a device.
LOAD_HEADROOM = 1.15


def checkpoint_bytes(base: str) -> int:
    """Bytes of the base model's weight files (0 when it is not a local folder: a hub id loads where it loads)."""
    if not os.path.isdir(base):
        return 0
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(base, '*.safetensors')))


def host_bytes_available() -> Optional[int]:
    """Host memory this process can still take: the kernel's MemAvailable, lowered to what the container's cgroup
    limit leaves (a model in a RAM-backed tmpfs is already counted as used)."""
    from ..plan.probe import probe_meminfo, probe_memory
    available = probe_meminfo().get('mem_available_bytes')
    cgroup = probe_memory()
    if cgroup.get('limit_bytes') and cgroup.get('usage_bytes') is not None:
        left = cgroup['limit_bytes'] - cgroup['usage_bytes']
        available = left if available is None else min(available, left)
    return available


def load_device(base: str) -> Optional[str]:
    """Where the reload puts the base model: host RAM (None, transformers' default) when it has room, else the GPU
    when its free memory does (a 35B MoE whose checkpoint sits in a tmpfs leaves no room for a second copy in RAM),
    else host RAM anyway -- the load then fails with the reason below in its log."""
    size = checkpoint_bytes(base)
    if not size:
        return None
    host = host_bytes_available()
    if host is None or size * LOAD_HEADROOM <= host:
        return None
    try:
        import torch
        if torch.cuda.is_available() and size * LOAD_HEADROOM <= torch.cuda.mem_get_info()[0]:
            print(f'verify-adapter: {base} holds {size / 2**30:.1f} GiB of weights and the host has '
                  f'{host / 2**30:.1f} GiB available: reloading on the GPU', file=sys.stderr)
            return 'cuda'
    except (ImportError, RuntimeError):
        pass
    print(f'verify-adapter: {base} holds {size / 2**30:.1f} GiB of weights; the host has {host / 2**30:.1f} GiB '
          f'available and no GPU has room: the reload may run out of memory', file=sys.stderr)
    return None


def verify_adapter(ckpt: str, base: Optional[str] = None) -> Dict[str, Any]:
    from peft import get_peft_model_state_dict
    from safetensors import safe_open

    from .common import tensors_equal

    ckpt = os.path.abspath(ckpt)
    path = os.path.join(ckpt, ADAPTER_FILE)
    if not os.path.isfile(path):
        raise VerifyError(f'{path} does not exist (not a LoRA/PEFT checkpoint directory?)')
    from safetensors import SafetensorError
    try:  # a truncated or damaged file is reported as such, before the base model is loaded
        with safe_open(path, framework='pt') as f:
            list(f.keys())
    except (SafetensorError, OSError) as exc:
        raise VerifyError(f'{path}: not a readable safetensors file ({exc}); the checkpoint is truncated or '
                          'damaged') from None
    base = base or find_base(ckpt)
    if not base:
        raise VerifyError(f'no base model: pass --base (neither {ckpt}/adapter_config.json nor args.json names one)')
    model = load_base_and_adapter(ckpt, base)
    live = get_peft_model_state_dict(model, adapter_name='default')
    report: Dict[str, Any] = {'checkpoint': ckpt, 'base': base, 'file': path, 'matched': 0, 'mismatched': [],
                              'missing': [], 'not_in_file': []}
    with safe_open(path, framework='pt') as f:
        keys = sorted(f.keys())
        report['tensors'] = len(keys)
        for key in keys:
            saved = f.get_tensor(key)
            if key not in live:
                report['missing'].append(key)
                continue
            value = live[key].detach().to(device='cpu', dtype=saved.dtype)
            if tuple(value.shape) != tuple(saved.shape):
                report['mismatched'].append({'key': key, 'reason': f'shape {list(value.shape)} != saved '
                                                                   f'{list(saved.shape)}'})
                continue
            same, max_diff = tensors_equal(value, saved)
            if same:
                report['matched'] += 1
            else:
                report['mismatched'].append({'key': key, 'max_abs_diff': max_diff})
    report['not_in_file'] = sorted(set(live) - set(keys))
    report['ok'] = bool(keys) and not (report['mismatched'] or report['missing'] or report['not_in_file'])
    return report


def summary_line(report: Dict[str, Any]) -> str:
    line = (f'{report["matched"]} of {report["tensors"]} saved adapter tensors match after reload '
            f'({report["checkpoint"]})')
    for key in ('mismatched', 'missing', 'not_in_file'):
        if report.get(key):
            items = [i if isinstance(i, str) else i['key'] for i in report[key]]
            line += f'; {key}: {len(items)} {items[:5]}{" ..." if len(items) > 5 else ""}'
    return line


# ---- training guard: run the command after the final save -------------------------------------------------
def latest_checkpoint(output_dir: str) -> Optional[str]:
    found = [p for p in glob.glob(os.path.join(output_dir, 'checkpoint-*')) if os.path.isdir(p)]

    def step(p):
        try:
            return int(p.rsplit('-', 1)[1])
        except ValueError:
            return -1

    return max(found, key=step) if found else None


def run_verify_subprocess(ckpt: str, base: Optional[str], timeout: Optional[float] = None) -> Dict[str, Any]:
    argv = [sys.executable, '-m', 'swift_vora', 'verify-adapter', ckpt, '--json']
    if base:
        argv += ['--base', base]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        report = {}
    report['exit_code'] = result.returncode
    if result.returncode not in (0, 1) or not report.get('tensors'):
        report['stderr_tail'] = result.stderr[-3000:]
    return report


def verify_and_report(ckpt: str, base: Optional[str], out_dir: str, timeout: Optional[float]) -> Dict[str, Any]:
    """The guard's whole check, for the swift callback and the Unsloth runner alike: reload in a fresh process,
    write `verify_adapter.json` into `out_dir`, raise GuardError unless every saved tensor matches."""
    from .common import GuardError, logger, write_json
    report = run_verify_subprocess(ckpt, base, timeout=timeout)
    write_json(os.path.join(out_dir, 'verify_adapter.json'), report)
    if report.get('exit_code') != 0:
        detail = summary_line(report) if report.get('tensors') else report.get('stderr_tail', '')
        raise GuardError('verify_adapter', f'`swift-vora verify-adapter {ckpt}` failed (exit '
                                           f'{report.get("exit_code")}): {detail}')
    logger.info(f'swift-vora verify_adapter: {summary_line(report)}.')
    return report


def _make_callback():
    from swift.callbacks import TrainerCallback

    from .common import GuardError, logger, output_dir, rank, unwrap_model
    from .zero3_load import model_dir_of

    class VerifyAdapterGuard(TrainerCallback):

        def on_train_end(self, args, state, control, **kwargs):
            if rank() != 0:
                return
            ckpt = getattr(state, 'last_model_checkpoint', None) or latest_checkpoint(output_dir(self.trainer))
            if ckpt and not os.path.isfile(os.path.join(ckpt, ADAPTER_FILE)) \
                    and os.path.isfile(os.path.join(ckpt, 'adapter_config.json')):
                # an adapter saved another way (save_safetensors false: adapter_model.bin): never verified silently
                raise GuardError('verify_adapter', f'{ckpt} holds an adapter without {ADAPTER_FILE} (saved with '
                                 'save_safetensors false?): it cannot be reloaded and compared; train with '
                                 'save_safetensors true, or turn the guard off (SWIFT_VORA_GUARD_VERIFY_ADAPTER=0)')
            if not ckpt or not os.path.isfile(os.path.join(ckpt, ADAPTER_FILE)):
                logger.info(f'swift-vora verify_adapter: no adapter checkpoint to verify ({ckpt}).')
                return
            base = model_dir_of(unwrap_model(self.trainer))
            from .. import switches
            timeout = switches.read(TIMEOUT_ENV)
            logger.info(f'swift-vora verify_adapter: reloading {ckpt} on {base} in a fresh process ...')
            verify_and_report(ckpt, base, output_dir(self.trainer), timeout)

    return VerifyAdapterGuard


def __getattr__(name):  # the callback class needs ms-swift; the CLI path must not import it
    if name == 'VerifyAdapterGuard':
        cls = _make_callback()
        globals()['VerifyAdapterGuard'] = cls
        return cls
    raise AttributeError(name)
