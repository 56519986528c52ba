"""The video budget a checkpoint was trained with travels with it, and inference uses it unless told otherwise.

What the model saw in training -- frames per second, the frame and token caps, the window it was cut into -- decides
what it can answer: a checkpoint trained on 8 frames of 4x6 patches and asked about 16 frames of 8x10 answers junk.
So every checkpoint a video_ora training writes carries `swift_vora_budget.json`:

    {"switches": {"SWIFT_VORA_FPS": "1.0", "SWIFT_VORA_MAX_FRAMES": "8", ...},   # the values in effect
     "answer": {"max_chars": 29, "max_new_tokens": 74},                           # for generation's default
     "recorded_by": "swift-vora 0.1.0", "source": "swift sft"}

and `apply_to_environment` puts it into the environment of `swift infer` / `swift deploy` / `swift export` /
`swift sft --adapters` (the plugin does it when ms-swift builds the template, see swift_registry.py) and of
`swift-vora eval`: a switch the caller did not set takes the trained value (logged); one the caller set to another
value is honoured, with a warning naming both. ms-swift copies the file into a merged model (`swift export
--merge_lora`: it is one of the model's `additional_saved_files`), `merge_for_vllm.sh` for every other source.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Mapping, MutableMapping, Optional

from . import switches

FILE = 'swift_vora_budget.json'
# What changes the tokens a sample becomes: the video budget and the windowing of the source videos.
SWITCHES = ('SWIFT_VORA_FPS', 'SWIFT_VORA_MIN_FRAMES', 'SWIFT_VORA_MAX_FRAMES', 'SWIFT_VORA_PAIR_TOKENS',
            'SWIFT_VORA_MIN_PAIR_TOKENS', 'SWIFT_VORA_MAX_VIDEO_TOKENS', 'SWIFT_VORA_WINDOW', 'SWIFT_VORA_STRIDE',
            'SWIFT_VORA_MIN_EVENT')
# Answer tokens: the longest answer of the training data, twice (a clip may hold more events than any trained one),
# plus room for the end-of-turn tokens. An answer is digits, brackets, commas and dots: at most one token each.
ANSWER_MARGIN_TOKENS = 16
MIN_NEW_TOKENS = 32

logger = logging.getLogger('swift_vora')
_answer_chars: Dict[str, int] = {'max': 0}  # the longest answer this process built rows for (dataset.py)


def note_answer(text: str) -> None:
    """The dataset builder reports every answer it writes (the default max_new_tokens comes from the longest)."""
    _answer_chars['max'] = max(_answer_chars['max'], len(text))


def max_new_tokens_for(max_chars: int) -> int:
    return max(MIN_NEW_TOKENS, 2 * int(max_chars) + ANSWER_MARGIN_TOKENS)


def _canonical(name: str, raw: Any) -> str:
    """One spelling per value ('2' and '2.0' for a number are the same budget)."""
    value = switches.parse(name, None if raw is None else str(raw))
    return 'none' if value is None else str(value)


def current(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The budget in effect: each switch's value as the template and the dataset read it."""
    environ = os.environ if environ is None else environ
    return {name: _canonical(name, environ.get(name) or None) for name in SWITCHES}


def record(directory: str, source: str, environ: Optional[Mapping[str, str]] = None,
           max_answer_chars: Optional[int] = None) -> str:
    """Write FILE into `directory` (a checkpoint): the budget in effect and the answer length. Returns its path."""
    from . import __version__
    from .outputs import write_text_atomic
    chars = _answer_chars['max'] if max_answer_chars is None else int(max_answer_chars)
    data = {'switches': current(environ),
            'answer': {'max_chars': chars, 'max_new_tokens': max_new_tokens_for(chars)} if chars else None,
            'recorded_by': f'swift-vora {__version__}', 'source': source}
    path = os.path.join(directory, FILE)
    write_text_atomic(path, json.dumps(data, indent=2) + '\n', what='trained video budget')
    return path


def find(*directories: Optional[str]) -> Optional[str]:
    """FILE in the first of `directories` (a checkpoint, a merged model) or its parent run folder that has it."""
    for directory in directories:
        if not directory:
            continue
        for candidate in (directory, os.path.dirname(os.path.abspath(directory))):
            path = os.path.join(candidate, FILE)
            if os.path.isfile(path):
                return path
    return None


def load(path: str) -> Dict[str, Any]:
    """The recorded budget; a file that is not one is an error naming the file and the key."""
    try:
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f'{path}: not a readable swift-vora budget file ({exc})') from None
    recorded = data.get('switches') if isinstance(data, dict) else None
    if not isinstance(recorded, dict):
        raise ValueError(f'{path}: key "switches" missing or not an object')
    for name, value in recorded.items():
        if name not in SWITCHES:
            raise ValueError(f'{path}: "switches" holds {name!r}, which is not a budget switch '
                             f'({", ".join(SWITCHES)})')
        try:
            switches.parse(name, str(value))
        except switches.SwitchError as exc:
            raise ValueError(f'{path}: "switches".{name}: {exc}') from None
    return data


def apply_to_environment(path: str, environ: Optional[MutableMapping[str, str]] = None,
                         warn=None) -> Dict[str, Any]:
    """Take the recorded budget into `environ` (default os.environ) where the caller did not set a switch; keep
    the caller's value where it differs, with a warning naming both. Returns what was done."""
    environ = os.environ if environ is None else environ
    warn = warn or logger.warning
    data = load(path)
    used, overridden = {}, {}
    for name, trained in data['switches'].items():
        trained = _canonical(name, trained)
        given = environ.get(name)
        if not given:
            environ[name] = trained  # 'none' too: unset would mean the default, not "no window" / "no cap"
            used[name] = trained
        elif _canonical(name, given) != trained:
            overridden[name] = {'given': _canonical(name, given), 'trained': trained}
    if overridden:
        warn(f'swift-vora: the checkpoint was trained with another video budget ({path}); using the values you set: '
             + ', '.join(f'{k}={v["given"]} (trained: {v["trained"]})' for k, v in overridden.items())
             + '. The model may answer worse on a budget it did not see.')
    logger.info(f'swift-vora: video budget from the checkpoint ({path}): '
                + ', '.join(f'{k}={v}' for k, v in data['switches'].items()))
    return {'file': path, 'used': used, 'overridden': overridden,
            'max_new_tokens': (data.get('answer') or {}).get('max_new_tokens')}


def describe(switch_values: Mapping[str, str]) -> str:
    return ', '.join(f'{k[len("SWIFT_VORA_"):].lower()}={v}' for k, v in switch_values.items())


def recorded_names() -> List[str]:
    return list(SWITCHES)
