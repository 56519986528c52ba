"""Reading YAML a user wrote: the one YAML reader of swift-vora (recipes and `key=value` overrides).

PyYAML's `safe_load`, with two differences, both in `SafeLoader` subclass `StrictSafeLoader`:

- A key written twice in one mapping is an error naming the line and the dotted key (`DuplicateKey`). YAML 1.1
  and PyYAML keep the last value without a word, so a second `hardware:` silently replaced the first, and a second
  `video:` section dropped the first one's `max_frames`. Keys merged in with `<<: *anchor` may be overridden by a
  key of the mapping itself: that is what a merge is for.
- A number too large for a float (`1e400`, an integer of thousands of digits, which made PyYAML's int() raise) is
  read as an infinite number that remembers its text (swift_vora.jsonl.Oversized), for the range checks to refuse
  by its key.

A leaf apart from swift_vora.jsonl; PyYAML is imported on first use.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

_LOADER = None


def duplicate_keys_error():
    """The exception class of a key written twice (built on first use: a subclass of PyYAML's MarkedYAMLError)."""
    return loader().DuplicateKey


def load(text: str) -> Any:
    """`yaml.safe_load(text)`, with duplicate keys refused and oversized numbers kept (see the module docstring).
    Raises yaml.YAMLError (with `problem_mark`, its line) for text that is not YAML or repeats a key."""
    import yaml
    return yaml.load(text, Loader=loader())  # noqa: S506 - a SafeLoader subclass


def key_lines(text: str) -> Dict[str, int]:
    """The 1-based line of every mapping key of the YAML document `text`, by its dotted path (`train.lr`; a key
    written dotted keeps its dots). {} for text that is not one YAML document."""
    import yaml
    from yaml.nodes import MappingNode, ScalarNode
    try:
        root = yaml.compose(text, Loader=loader())  # noqa: S506 - a SafeLoader subclass; nodes only, nothing built
    except yaml.YAMLError:
        return {}
    lines: Dict[str, int] = {}
    seen = set()  # an alias makes the node graph a DAG, a self-referencing one a cycle: each mapping walked once

    def walk(node, prefix: str) -> None:
        if not isinstance(node, MappingNode) or id(node) in seen:
            return
        seen.add(id(node))
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                dotted = f'{prefix}.{key_node.value}' if prefix else str(key_node.value)
                lines.setdefault(dotted, key_node.start_mark.line + 1)
                walk(value_node, dotted)

    walk(root, '')
    return lines


def loader():
    global _LOADER
    if _LOADER is None:
        _LOADER = _build()
    return _LOADER


def _build():
    import yaml
    from yaml.constructor import ConstructorError
    from yaml.nodes import MappingNode, ScalarNode

    from .jsonl import MAX_INT_DIGITS, Oversized

    class DuplicateKey(ConstructorError):
        """A key written twice in one mapping; `key` is its dotted path, `line` and `first_line` 1-based."""

        def __init__(self, key: str, line: int, first_line: int, mark):
            self.key, self.line, self.first_line = key, line, first_line
            super().__init__(None, None, f'key {key!r} written twice (first on line {first_line}); YAML would keep '
                                         'only the second: keep one', mark)

    class StrictSafeLoader(yaml.SafeLoader):
        pass

    StrictSafeLoader.DuplicateKey = DuplicateKey

    def construct_document(self, node):
        _check_duplicates(node)
        return yaml.SafeLoader.construct_document(self, node)

    def _check_duplicates(root) -> None:
        """Walk the composed node graph once (a node shared by aliases is visited once, so an alias bomb costs its
        nodes, not their expansion) and raise DuplicateKey on the first key written twice."""
        seen = set()
        stack: List[tuple] = [(root, '')]
        while stack:
            node, path = stack.pop()
            if id(node) in seen or isinstance(node, ScalarNode):
                continue
            seen.add(id(node))
            if isinstance(node, MappingNode):
                first: dict = {}
                for key_node, value_node in node.value:
                    if key_node.tag == 'tag:yaml.org,2002:merge':
                        continue  # `<<: *base`: its keys are defaults the mapping's own keys override
                    key = _key_identity(key_node)
                    dotted = f'{path}.{key_node.value}' if path else str(key_node.value)
                    if key is not None:
                        if key in first:
                            raise DuplicateKey(dotted, key_node.start_mark.line + 1, first[key],
                                               key_node.start_mark)
                        first[key] = key_node.start_mark.line + 1
                    stack.append((value_node, dotted if key is not None else path))
            else:  # a sequence
                for i, item in enumerate(node.value):
                    stack.append((item, f'{path}[{i}]'))
        _probe.constructed_objects.clear()

    _probe = StrictSafeLoader('')

    def _key_identity(key_node):
        """A scalar key as the mapping will hold it (`1` and `0x1` are one integer key, `yes` and `true` one boolean
        key), else None (a complex key, never written twice by hand)."""
        if not isinstance(key_node, ScalarNode):
            return None
        try:
            value = _probe.construct_object(key_node)
        except yaml.YAMLError:
            return ('text', key_node.value)
        if isinstance(value, Oversized):  # every one is infinite: compare what was written
            return ('number', value.text)
        return value if isinstance(value, str) else (type(value).__name__, value)

    def construct_int(self, node):
        text = self.construct_scalar(node)
        digits = text.replace('_', '').lstrip('+-')
        if len(digits) > MAX_INT_DIGITS:
            return Oversized(text)
        return yaml.SafeLoader.construct_yaml_int(self, node)

    def construct_float(self, node):
        value = yaml.SafeLoader.construct_yaml_float(self, node)
        text = self.construct_scalar(node)
        if math.isinf(value) and not text.lower().lstrip('+-').startswith('.inf'):
            return Oversized(text)
        return value

    StrictSafeLoader.construct_document = construct_document
    StrictSafeLoader.add_constructor('tag:yaml.org,2002:int', construct_int)
    StrictSafeLoader.add_constructor('tag:yaml.org,2002:float', construct_float)
    return StrictSafeLoader
