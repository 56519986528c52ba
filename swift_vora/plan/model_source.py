"""Where a model's config.json comes from, so that `plan` and `train --dry-run` work before any download.

`resolve_config(MODEL)` accepts a model directory, a config.json, a Hub model id (`Qwen/Qwen3-VL-2B-Instruct`) or
a path that does not exist yet (`/models/Qwen3-VL-2B-Instruct`, a recipe's download target), and looks, in order:
  1. at the path itself (a directory's config.json, or the JSON file given);
  2. in the local Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
     `$XDG_CACHE_HOME/huggingface/hub` (default `~/.cache/huggingface/hub`), as
     `models--ORG--NAME/snapshots/<revision>/config.json` (the revision `refs/main` points at, else the newest);
  3. in the local ModelScope cache: `$MODELSCOPE_CACHE`, else `~/.cache/modelscope/hub`, as `models/ORG/NAME/` or
     `ORG/NAME/` (ModelScope writes a '.' in a name as '___');
  4. in the configurations shipped with swift-vora (`swift_vora/plan/model_configs/`, see the README there).
A model id is matched exactly (case-insensitive), then by its name under any organisation; a path that does not
exist is matched by its last component (the model's name). Nothing is downloaded and no weights are read. The
plan reports the source it used. `load_model_spec(MODEL)` is the one reading of a model: found here, described by
model_spec.py.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from .model_spec import ConfigError, ModelSpec, model_spec

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'model_configs')
_ID = re.compile(r'^[A-Za-z0-9][\w.\-]*/[\w.\-]+$')


@dataclass
class ConfigSource:
    kind: str  # path | hf_cache | modelscope_cache | shipped
    path: str  # the config.json that was read
    requested: str  # what the user gave (--model / model.path)
    model_id: str = ''  # ORG/NAME when known
    # whether `train` can load the model as given: a local directory / file, or a Hub id whose weights are in the
    # Hugging Face cache (swift loads those offline); False: the weights are still to be downloaded
    local_model: bool = True

    def describe(self) -> str:
        if self.kind == 'path':
            return f'{self.path} (local)'
        where = {'hf_cache': 'the Hugging Face cache', 'modelscope_cache': 'the ModelScope cache',
                 'shipped': 'the configuration shipped with swift-vora'}[self.kind]
        s = f'{self.model_id or self.requested} from {where} ({self.path})'
        if not self.local_model:
            s += (f'; no weights at {self.requested!r} yet: download the model there before training'
                  if self.requested != self.model_id else '; its weights are not downloaded yet')
        return s

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d['description'] = self.describe()
        return d


def _model_name(model: str) -> str:
    m = model.rstrip('/\\')
    if m.endswith('config.json'):
        m = os.path.dirname(m)
    return os.path.basename(m.rstrip('/\\'))


def hf_hub_dirs(environ=None) -> List[str]:
    """Hugging Face hub cache directories, as huggingface_hub resolves them (the first that is set wins)."""
    env = os.environ if environ is None else environ
    if env.get('HF_HUB_CACHE'):
        return [os.path.expanduser(env['HF_HUB_CACHE'])]
    if env.get('HF_HOME'):
        return [os.path.join(os.path.expanduser(env['HF_HOME']), 'hub')]
    xdg = env.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return [os.path.join(xdg, 'huggingface', 'hub')]


def modelscope_dirs(environ=None) -> List[str]:
    env = os.environ if environ is None else environ
    if env.get('MODELSCOPE_CACHE'):
        root = os.path.expanduser(env['MODELSCOPE_CACHE'])
        return [os.path.join(root, 'hub'), root]
    return [os.path.join(os.path.expanduser('~'), '.cache', 'modelscope', 'hub')]


def _hf_snapshot_config(repo_dir: str) -> Optional[str]:
    ref = os.path.join(repo_dir, 'refs', 'main')
    if os.path.isfile(ref):
        with open(ref, encoding='utf-8') as f:
            rev = f.read().strip()
        p = os.path.join(repo_dir, 'snapshots', rev, 'config.json')
        if os.path.isfile(p):
            return p
    found = glob.glob(os.path.join(glob.escape(repo_dir), 'snapshots', '*', 'config.json'))
    return max(found, key=os.path.getmtime) if found else None


def _same(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def _has_weights(snapshot: str) -> bool:
    return bool(glob.glob(os.path.join(glob.escape(snapshot), '*.safetensors')))


def find_in_hf_cache(model_id: str, name: str, environ=None) -> Optional[Tuple[str, str]]:
    """(config.json, ORG/NAME) from the HF cache for an id, or for a bare name under any organisation."""
    for hub in hf_hub_dirs(environ):
        if not os.path.isdir(hub):
            continue
        for entry in sorted(os.listdir(hub)):
            if not entry.startswith('models--'):
                continue
            parts = entry[len('models--'):].split('--', 1)
            if len(parts) != 2:
                continue
            repo_id = '/'.join(parts)
            if (model_id and _same(repo_id, model_id)) or (not model_id and _same(parts[1], name)):
                cfg = _hf_snapshot_config(os.path.join(hub, entry))
                if cfg:
                    return cfg, repo_id
    return None


def find_in_modelscope_cache(model_id: str, name: str, environ=None) -> Optional[Tuple[str, str]]:
    wanted = {name.lower(), name.replace('.', '___').lower()}
    for root in modelscope_dirs(environ):
        for base in (os.path.join(root, 'models'), root):
            if not os.path.isdir(base):
                continue
            for org in sorted(os.listdir(base)):
                org_dir = os.path.join(base, org)
                if not os.path.isdir(org_dir) or (model_id and not _same(org, model_id.split('/')[0])):
                    continue
                for entry in sorted(os.listdir(org_dir)):
                    if entry.lower() in wanted and os.path.isfile(os.path.join(org_dir, entry, 'config.json')):
                        return os.path.join(org_dir, entry, 'config.json'), f'{org}/{entry.replace("___", ".")}'
    return None


def shipped_configs() -> Dict[str, str]:
    """ORG/NAME -> path of every configuration shipped with the package (files named ORG--NAME.json)."""
    out = {}
    for p in sorted(glob.glob(os.path.join(glob.escape(SHIPPED_DIR), '*--*.json'))):
        org, name = os.path.basename(p)[:-len('.json')].split('--', 1)
        out[f'{org}/{name}'] = p
    return out


def find_shipped(model_id: str, name: str) -> Optional[Tuple[str, str]]:
    for repo_id, p in shipped_configs().items():
        if (model_id and _same(repo_id, model_id)) or (not model_id and _same(repo_id.split('/')[1], name)):
            return p, repo_id
    return None


def resolve_config(model: str, environ=None) -> Tuple[Dict[str, Any], ConfigSource]:
    """(config dict, its source) for MODEL; FileNotFoundError names every place that was searched."""
    if not isinstance(model, str) or not model:
        raise FileNotFoundError('no model given (a directory, a config.json or a model id such as '
                                'Qwen/Qwen3-VL-2B-Instruct)')
    p = os.path.expanduser(model)
    if os.path.isdir(p):
        cfg_path = os.path.join(p, 'config.json')
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f'no config.json in the model directory {model!r}')
        return read_config_file(cfg_path), ConfigSource('path', cfg_path, model)
    if os.path.isfile(p):
        return read_config_file(p), ConfigSource('path', p, model)
    looks_like_id = bool(_ID.match(model)) and not model.startswith(('.', '~'))
    name = _model_name(model)
    # an id matches exactly first; then, like a path that is not there yet, by its name under any organisation
    for model_id in ([model, ''] if looks_like_id else ['']):
        for kind, found in (('hf_cache', find_in_hf_cache(model_id, name, environ)),
                            ('modelscope_cache', find_in_modelscope_cache(model_id, name, environ)),
                            ('shipped', find_shipped(model_id, name))):
            if found:
                cfg_path, repo_id = found
                loadable = kind == 'hf_cache' and _same(repo_id, model) and _has_weights(os.path.dirname(cfg_path))
                return read_config_file(cfg_path), ConfigSource(kind, cfg_path, model, repo_id, local_model=loadable)
    known = ', '.join(shipped_configs())
    raise FileNotFoundError(
        f'no config.json for {model!r}: not a local directory or file, not in the Hugging Face cache '
        f'({", ".join(hf_hub_dirs(environ))}) or the ModelScope cache ({", ".join(modelscope_dirs(environ))}), and '
        f'not one of the configurations shipped with swift-vora ({known}). Pass the model directory, its '
        f'config.json, or download the config (e.g. `huggingface-cli download ORG/NAME config.json`).')


def load_config(path: str) -> Dict[str, Any]:
    """Read `config.json` from a model directory, or a JSON file given directly. No weights are touched.

    Only local paths; `model_source.resolve_config` also finds model ids in the caches and the shipped configs."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, 'config.json')
    if not os.path.isfile(p):
        raise FileNotFoundError(f'no config.json at {path!r}')
    return read_config_file(p)


MAX_CONFIG_CHARS = 16 * 1024 * 1024


def read_config_file(p: str) -> Dict[str, Any]:
    """Parse one config.json; a syntax error or a non-object names the file (and the line)."""
    from .. import jsonl
    try:
        with open(p, encoding='utf-8') as f:
            text = f.read(MAX_CONFIG_CHARS + 1)  # bounded: a config.json is kilobytes, the path may name anything
        if len(text) > MAX_CONFIG_CHARS:
            raise ConfigError(f'{p}: larger than {MAX_CONFIG_CHARS} characters; not a config.json')
        cfg = jsonl.loads(text)  # a number too large for a float is read as infinite, and refused where it is used
    except RecursionError:
        raise ConfigError(f'{p}: nested too deeply to be a config.json') from None
    except json.JSONDecodeError as e:
        raise ConfigError(f'{p}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})') from e
    except UnicodeDecodeError as e:
        raise ConfigError(f'{p}: not UTF-8 text ({e.reason})') from e
    if not isinstance(cfg, dict):
        raise ConfigError(f'{p}: config is not a JSON object')
    return cfg


def load_model_spec(path: str) -> ModelSpec:
    """The ModelSpec of a model directory, a config.json, a model id or a known model name: config.json found as
    `resolve_config` finds it, read once, described by model_spec.py; the spec names its source."""
    cfg, source = resolve_config(path)
    spec = model_spec(cfg, where=source.path or path)
    spec.source = source
    return spec
