"""The instruction the model sees. Training and inference build it here so they encode identically."""
from typing import Optional

DEFAULT_QUERY = 'moments worth keeping'


def effective_query(query: Optional[str]) -> str:
    """The query text the prompt holds: the annotation's, else DEFAULT_QUERY."""
    return query.strip() if query and query.strip() else DEFAULT_QUERY


def build_prompt(query: Optional[str], clip_seconds: float) -> str:
    """User turn for one clip; `<video>` is ms-swift's placeholder for the clip's frames."""
    target = effective_query(query)
    return ('<video>\n'
            f'Clip length: {clip_seconds:.1f} seconds. Query: {target}\n'
            'Answer with a JSON list of [start, end] times in seconds from the start of the clip, '
            'one decimal, sorted; [] if nothing matches.')
