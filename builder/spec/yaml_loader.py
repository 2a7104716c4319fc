"""The one YAML reader for specs: plain data only, with limits.

A spec is small, hand-written data, so anything else is refused with a one-line reason
instead of being expanded, overwritten or recursed into:
- the file is read with a size cap (`--spec /dev/zero` ends, not eats memory), and must
  be UTF-8;
- aliases (`*name`) are refused: a billion-laughs bomb expands to nothing;
- duplicate keys are refused (YAML's "last one wins" silently drops a setting);
- mapping keys must be strings; nesting is capped (deep flow lists would otherwise end
  in a RecursionError inside the composer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from builder import textfile

MAX_BYTES = 1 << 20  # a spec is a few KiB; 1 MiB leaves generous room
MAX_DEPTH = 64  # real specs nest about 6 deep


class YamlLimitError(ValueError):
    """The text is not a spec-shaped YAML document: `line N: reason` (or just a reason)."""


def read_text(path: str | Path) -> str:
    """The file's text, at most MAX_BYTES, strictly UTF-8 (OSError passes through)."""
    try:
        data = textfile.read_regular(path, MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise YamlLimitError(f"larger than {MAX_BYTES // 1024} KiB; a spec is a small file")
        return textfile.utf8(data)
    except textfile.NotText as e:  # a pipe or device, or not UTF-8
        raise YamlLimitError(str(e)) from None


def _where(node: yaml.Node | yaml.Event) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


class _Loader(yaml.SafeLoader):
    """SafeLoader with the limits above (pure Python: the composer is the one to guard)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise YamlLimitError(
                f"{_where(self.peek_event())}: aliases (*name) are not "
                "allowed in a spec; write the value out"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(
                    f"{_where(self.peek_event())}: nested more than {MAX_DEPTH} levels deep"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # merge keys (<<) need aliases, refused above
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                shown = (
                    repr(key_node.value)[:40]
                    if isinstance(key_node, yaml.ScalarNode)
                    else "that is a list or mapping"
                )
                raise YamlLimitError(
                    f"{_where(key_node)}: mapping key {shown} must be a string (quote it)"
                )
            if key in seen:
                raise YamlLimitError(
                    f"{_where(key_node)}: duplicate key {key!r} (first at {_where(seen[key])})"
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep)


def load(text: str) -> Any:
    """Parse one YAML document; YamlLimitError or yaml.YAMLError on defects."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except (ValueError, OverflowError) as e:
        if isinstance(e, YamlLimitError):
            raise
        # e.g. an integer literal past Python's 4300-digit conversion limit
        raise YamlLimitError(
            f"a value YAML cannot convert ({type(e).__name__}); numbers in a spec are small"
        ) from None
    finally:
        loader.dispose()
