"""Guard `fingerprint`: what exactly ran, in the log and in `OUTPUT_DIR/fingerprint.json`.

Interpreter (path, version), package versions, the git commit and dirty state of the swift_vora checkout
(found from the package's own path, so it is the code that was imported; `git` is run with a list argv, no
shell), SHA-256 of every plugin file and of the recipe (`SWIFT_VORA_RECIPE`, with the overrides applied over it from
`SWIFT_VORA_RECIPE_OVERRIDES`; `swift-vora train` sets both), every upstream patch with the installed version, whether
swift_vora/patches.py knows it and whether it was applied, the command line, host and
world size, and the environment variables that change behaviour (video budget, swift_vora settings, CUDA /
NCCL / allocator, launcher, offline switches). Values of variables whose names look secret (TOKEN, KEY,
SECRET, PASSWORD) are never written.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional

from swift.callbacks import TrainerCallback

from .. import patches, switches
from ..plan.probe import package_versions  # the one metadata lookup, shared with `swift-vora doctor`
from .common import logger, now, output_dir, rank, world_size, write_json

NAME = 'fingerprint'
RECIPE_ENV = 'SWIFT_VORA_RECIPE'
OVERRIDES_ENV = 'SWIFT_VORA_RECIPE_OVERRIDES'
PACKAGES = ['swift-vora', 'ms-swift', 'torch', 'transformers', 'peft', 'accelerate', 'deepspeed', 'datasets',
            'tokenizers', 'safetensors', 'qwen-vl-utils', 'decord', 'av', 'torchcodec', 'torchvision', 'flash-attn',
            'liger-kernel', 'numpy', 'megatron-core', 'mcore-bridge', 'transformer-engine', 'unsloth', 'vllm']
ENV_PREFIXES = ('VIDEO_', 'FPS', 'SWIFT_VORA_', 'NCCL_', 'CUDA_', 'PYTORCH_', 'TORCH_', 'NPROC_PER_NODE', 'NNODES',
                'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE',
                'OMP_NUM_THREADS', 'MAX_PIXELS', 'MIN_PIXELS', 'MAX_RATIO', 'IMAGE_FACTOR', 'FRAME_FACTOR',
                'SPATIAL_MERGE_SIZE', 'QWENVL_', 'FORCE_QWENVL_VIDEO_READER', 'HF_', 'TRANSFORMERS_', 'USE_HF',
                'MODELSCOPE_', 'DS_', 'ACCELERATE_', 'TOKENIZERS_PARALLELISM', 'UNSLOTH_', 'MEGATRON_', 'NVTE_',
                'TRITON_', 'VLLM_', 'SWIFT_', 'MAX_', 'MIN_', 'ENABLE_AUDIO_OUTPUT')
SECRET_MARKERS = {'TOKEN', 'KEY', 'SECRET', 'PASSWORD', 'PASSWD', 'CREDENTIAL', 'CREDENTIALS', 'AUTH'}


def sha256_file(path: str) -> Optional[str]:
    try:
        digest = hashlib.sha256()
        with open(path, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 20), b''):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


def _git(args: List[str], cwd: str, raw: bool = False) -> Optional[str]:
    try:
        result = subprocess.run(['git', *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout if raw else result.stdout.strip()


def git_state(path: str) -> Dict[str, Any]:
    """Commit, branch and dirty state of the git checkout holding `path` (None fields outside git)."""
    root = _git(['rev-parse', '--show-toplevel'], path)
    if not root:
        return {'repo': None, 'commit': None, 'dirty': None, 'note': f'{path} is not in a git checkout'}
    status = _git(['status', '--porcelain', '--untracked-files=no'], root, raw=True)
    dirty_files = [line[3:] for line in (status or '').splitlines() if line.strip()]
    return {'repo': root, 'commit': _git(['rev-parse', 'HEAD'], root),
            'branch': _git(['rev-parse', '--abbrev-ref', 'HEAD'], root), 'dirty': bool(dirty_files),
            'dirty_files': dirty_files[:100]}


def plugin_hashes(package_dir: str) -> Dict[str, Any]:
    files = {}
    for root, dirs, names in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(names):
            if name.endswith(('.py', '.json', '.yaml', '.yml', '.jinja', '.txt')):
                path = os.path.join(root, name)
                files[os.path.relpath(path, package_dir)] = sha256_file(path)
    combined = hashlib.sha256(''.join(f'{k}={v}\n' for k, v in sorted(files.items())).encode()).hexdigest()
    return {'package_dir': package_dir, 'combined_sha256': combined, 'files': files}


def behaviour_env(environ=None) -> Dict[str, str]:
    environ = os.environ if environ is None else environ
    out = {}
    for key in sorted(environ):
        if not key.startswith(ENV_PREFIXES):
            continue
        parts = key.upper().split('_')
        if parts[-1] in SECRET_MARKERS or 'SECRET' in parts or 'PASSWORD' in parts:  # HF_TOKEN, not ..._TOKEN_NUM
            out[key] = '<redacted>'
        else:
            out[key] = environ[key]
    return out


def recipe_overrides(environ=None) -> Optional[List[str]]:
    """The `key=value` overrides `swift-vora train` applied over the recipe file (JSON list in the env)."""
    text = switches.read(OVERRIDES_ENV, environ)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [text]  # recorded as found rather than dropped
    return [str(v) for v in value] if isinstance(value, list) else [text]


def build_fingerprint(extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    import swift_vora
    package_dir = os.path.dirname(os.path.abspath(swift_vora.__file__))
    recipe = switches.read(RECIPE_ENV)
    fingerprint: Dict[str, Any] = {
        'created': now(),
        'python': {'executable': sys.executable, 'version': sys.version.split()[0], 'implementation':
                   platform.python_implementation(), 'prefix': sys.prefix},
        'platform': {'system': platform.platform(), 'machine': platform.machine(), 'host': socket.gethostname()},
        'packages': package_versions(PACKAGES),
        'swift_vora': {'version': getattr(swift_vora, '__version__', None), 'git': git_state(package_dir),
                       'plugin': plugin_hashes(package_dir)},
        'recipe': {'path': recipe, 'sha256': sha256_file(recipe) if recipe else None,
                   'overrides': recipe_overrides()},
        'command_line': list(sys.argv),
        'env': behaviour_env(),
        # each upstream patch: the installed version, whether the inventory knows it, its policy, applied or not
        'patches': patches.report(),
    }
    try:
        import torch
        fingerprint['torch'] = {'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version()
                                if torch.backends.cudnn.is_available() else None,
                                'cuda_available': torch.cuda.is_available(),
                                'devices': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    except Exception as error:  # noqa: BLE001 -- recorded, not fatal
        fingerprint['torch'] = {'error': repr(error)}
    if extra:
        fingerprint.update(extra)
    return fingerprint


class FingerprintGuard(TrainerCallback):

    def on_init_end(self, args, state, control, **kwargs):
        extra = {'world_size': world_size(), 'output_dir': output_dir(self.trainer),
                 'trainer': type(self.trainer).__name__, 'tuner_type': getattr(args, 'tuner_type', None)}
        fp = build_fingerprint(extra)
        git = fp['swift_vora']['git']
        pk = fp['packages']
        logger.info(f'swift-vora fingerprint: python {fp["python"]["version"]} ({fp["python"]["executable"]}); '
                    f'ms-swift {pk["ms-swift"]}, torch {pk["torch"]}, transformers {pk["transformers"]}, peft '
                    f'{pk["peft"]}, deepspeed {pk["deepspeed"]}; swift_vora {fp["swift_vora"]["version"]} commit '
                    f'{(git.get("commit") or "none")[:12]}{" DIRTY" if git.get("dirty") else ""}, plugin sha256 '
                    f'{fp["swift_vora"]["plugin"]["combined_sha256"][:12]}; recipe {fp["recipe"]["path"]}; '
                    f'{len(fp["env"])} behaviour env vars.')
        if rank() == 0:
            path = os.path.join(output_dir(self.trainer), 'fingerprint.json')
            write_json(path, fp)
            logger.info(f'swift-vora fingerprint: written to {path}')
