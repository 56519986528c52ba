"""The video budget a checkpoint was trained with travels with it, and inference uses it unless told otherwise.

What the model saw in training -- frames per second, the frame and token caps, the window it was cut into -- decides
what it can answer: a checkpoint trained on 8 frames of 4x6 patches and asked about 16 frames of 8x10 answers junk.
So every checkpoint a video_ora training writes carries `swift_vora_budget.json`:

    {"switches": {"SWIFT_VORA_FPS": "1.0", "SWIFT_VORA_MAX_FRAMES": "8", ...},   # the values in effect
     "answer": {"max_chars": 29, "max_new_tokens": 74},                           # for generation's default
     "prompt": {"query": "moments worth keeping", "distinct_queries": 1},         # the query the prompts held
     "recorded_by": "swift-vora 0.1.0", "source": "swift sft"}

and `apply_to_environment` puts it into the environment of `swift infer` / `swift deploy` / `swift export` /
`swift sft --adapters` (the plugin does it when ms-swift builds the template, see swift_registry.py) and of
`swift-vora eval`: a switch the caller did not set takes the trained value (logged); one the caller set to another
value is honoured, with a warning naming both. ms-swift copies the file into a merged model (`swift export
--merge_lora`: it is one of the model's `additional_saved_files`), `merge_for_vllm.sh` for every other source.
`prompt` is the query of the training prompts (the most common one, and how many distinct queries there were):
`swift-vora predict` asks unlabelled videos with it (`trained_query`).
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

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

logger = logging.getLogger('swift')  # ms-swift's logger: its handlers print INFO in swift's processes
_answer_chars: Dict[str, int] = {'max': 0}  # the longest answer this process built rows for (dataset.py)
_queries: Counter = Counter()  # the query text of every annotation this process built rows for (dataset.py)


def note_answer(text: str) -> None:
    """The dataset builder reports every answer it writes (the default max_new_tokens comes from the longest)."""
    _answer_chars['max'] = max(_answer_chars['max'], len(text))


def note_query(query: Optional[str]) -> None:
    """The dataset builder reports each annotation's query (the one predict asks with comes from them)."""
    from .prompt import effective_query
    _queries[effective_query(query)] += 1


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
           max_answer_chars: Optional[int] = None, queries: Optional[Mapping[str, int]] = None) -> str:
    """Write FILE into `directory` (a checkpoint): the budget in effect, the answer length and the prompts' query
    (`max_answer_chars` and `queries`, query text -> annotations, default: what this process's dataset builder
    saw). Returns its path."""
    from . import __version__
    from .outputs import write_text_atomic
    chars = _answer_chars['max'] if max_answer_chars is None else int(max_answer_chars)
    queries = Counter(_queries if queries is None else queries)
    data = {'switches': current(environ),
            'answer': {'max_chars': chars, 'max_new_tokens': max_new_tokens_for(chars)} if chars else None,
            'prompt': ({'query': queries.most_common(1)[0][0], 'distinct_queries': len(queries)} if queries
                       else None),
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


def trained_query(path: str) -> Tuple[Optional[str], int]:
    """(the query of the training prompts -- the most common one --, how many distinct queries there were), or
    (None, 0) for a budget file from before queries were recorded."""
    prompt = load(path).get('prompt')
    if not isinstance(prompt, dict) or not isinstance(prompt.get('query'), str):
        return None, 0
    distinct = prompt.get('distinct_queries')
    return prompt['query'], distinct if isinstance(distinct, int) and not isinstance(distinct, bool) else 1


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


# ---------------------------------------------------------------------------------------------------------------
# inside ms-swift: record with every checkpoint, apply when a checkpoint's template is built, copy into merged models
# ---------------------------------------------------------------------------------------------------------------
TEMPLATE = 'video_ora'


def _is_video_ora(template_type: Any) -> bool:
    return template_type == TEMPLATE


def apply_for_arguments(args: Any) -> Optional[Dict[str, Any]]:
    """ms-swift arguments about to build a video_ora template for a checkpoint (`--adapters`, a merged `--model`):
    take the checkpoint's budget into the environment (read by the template and the dataset, which are built
    next), and its answer length as `max_new_tokens` when the command line gives none."""
    if not _is_video_ora(getattr(args, 'template', None)):
        return None
    path = find(getattr(args, 'ckpt_dir', None), *(getattr(args, 'adapters', None) or []))
    if path is None:
        return None
    done = apply_to_environment(path)
    if done['max_new_tokens'] and hasattr(args, 'max_new_tokens') and args.max_new_tokens is None:
        args.max_new_tokens = done['max_new_tokens']
        logger.info(f'swift-vora: max_new_tokens={args.max_new_tokens} (twice the longest trained answer, {path})')
    return done


def install() -> None:
    """One narrow patch (swift_vora/patches.py: `trained_budget_template`) around ms-swift's
    `BaseArguments.get_template`, which every command that encodes or merges calls (sft, infer, deploy, export):
    a video_ora checkpoint's budget is applied there, and FILE joins the model's `additional_saved_files`, the list
    ms-swift's `save_checkpoint` copies from the adapter into a merged model (`swift export --merge_lora`)."""
    from swift.arguments.base_args.base_args import BaseArguments

    from . import patches

    original = BaseArguments.get_template
    if patches.patched_by(original) == 'trained_budget_template' or not patches.applicable('trained_budget_template'):
        return

    def get_template(self, processor=None, **kwargs):
        if _is_video_ora(kwargs.get('template_type', getattr(self, 'template', None))):
            apply_for_arguments(self)
            saved = getattr(getattr(self, 'model_meta', None), 'additional_saved_files', None)
            if isinstance(saved, list) and FILE not in saved:
                saved.append(FILE)
        return original(self, processor, **kwargs)

    BaseArguments.get_template = patches.mark(get_template, 'trained_budget_template', original)


def copy_into(source: Optional[str], directory: Optional[str]) -> Optional[str]:
    """FILE from `source` into `directory` (a merged model) unless it is there; the copy's path, or None."""
    if not source or not directory or not os.path.isdir(directory):
        return None
    target = os.path.join(directory, FILE)
    if not os.path.exists(target):
        import shutil
        shutil.copyfile(source, target)
        logger.info(f'swift-vora: the trained video budget goes with the merged model: {target}')
    return target


class RecordOnSave:
    """Trainer callback: FILE into every checkpoint a video_ora training saves (and its run folder at the start)."""

    def __init__(self, args, trainer):
        self.args, self.trainer = args, trainer

    def _video_ora(self) -> bool:
        meta = getattr(getattr(self.trainer, 'template', None), 'template_meta', None)
        return _is_video_ora(getattr(meta, 'template_type', None))

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self._video_ora():
            os.makedirs(args.output_dir, exist_ok=True)
            record(args.output_dir, 'swift sft')

    def on_save(self, args, state, control, **kwargs):
        ckpt = os.path.join(args.output_dir, f'checkpoint-{state.global_step}')
        if state.is_world_process_zero and self._video_ora() and os.path.isdir(ckpt):
            record(ckpt, 'swift sft')


def record_on_save_callback(args, trainer):
    """A `TrainerCallback` instance (built lazily: this module imports nothing of transformers at import)."""
    from transformers import TrainerCallback

    class RecordBudgetOnSave(RecordOnSave, TrainerCallback):
        pass

    return RecordBudgetOnSave(args, trainer)
