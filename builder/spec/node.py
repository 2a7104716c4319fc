"""The generic layer of spec parsing: SpecError and `_Node`, a YAML mapping that knows
its path, checks types and finite numbers, and rejects keys nobody asked for.

Split from builder.spec so modules that parse sections of a spec (engine arguments,
TRT-LLM sections) use it without importing builder.spec (no import cycle).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from builder.errors import EXIT_USAGE, TridentError, printable
from builder.spec.rules import default_of, kind_of, rule_of

_REQUIRED = object()
_FIELD = object()  # field(): the default the dataclass declares
MAX_INT = 2**31 - 1  # every count, port and token limit in a spec fits Triton's INT32


def anchored(pattern: str) -> str:
    r"""A regex the parser fullmatches, as a JSON Schema `pattern` for the whole string.
    `(?![\s\S])` ends the text in Python and ECMA-262 alike (`$` lets "x\n" through)."""
    return f"^(?:{pattern})(?![\\s\\S])"


class SpecError(TridentError):
    """A defect in a spec file: `file: field.path: reason`."""

    exit_code = EXIT_USAGE

    def __init__(self, file: str, path: str, reason: str):
        self.file, self.path, self.reason = file, path, reason
        shown = [printable(part) for part in (file, path, reason) if part]
        super().__init__(": ".join(shown))


def frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """Deep read-only view of plain YAML data (dicts become mappingproxies, lists tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen_mapping(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen_mapping(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of frozen_mapping: plain dicts and lists (for JSON output)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


class _Node:
    """A mapping from the YAML tree plus the path that led to it."""

    def __init__(self, data: Any, path: str, file: str):
        self.file, self.path = file, path
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise self.error(f"expected a mapping, got {_type_name(data)}")
        self.data, self._seen = data, set[str]()

    def error(self, reason: str, key: str | None = None) -> SpecError:
        return SpecError(self.file, self.child_path(key) if key else self.path, reason)

    def child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple, default: Any = _REQUIRED) -> Any:
        self._seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _REQUIRED:
                raise self.error("is required", key)
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # YAML booleans are ints in Python; never accept one for the other.
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(f"expected {_kind_names(kinds)}, got a boolean", key)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise self.error(f"is too large, got {_short(value)}", key) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(f"must be a finite number, got {value}", key)
        if not isinstance(value, kinds):
            raise self.error(f"expected {_kind_names(kinds)}, got {_type_name(value)}", key)
        return value

    def int(
        self,
        key: str,
        default: Any = _REQUIRED,
        minimum: int | None = None,
        maximum: int | None = MAX_INT,
    ) -> int:
        value = self.get(key, int, default)
        if value is not None and minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum}, got {_short(value)}", key)
        if value is not None and maximum is not None and value > maximum:
            raise self.error(f"must be <= {maximum}, got {_short(value)}", key)
        return value

    def field(self, cls: type, key: str, default: Any = _FIELD) -> Any:
        """The value of `key`, read as the spec dataclass `cls` declares its field: its
        type, its default (unless `default` is given) and its Rule (builder/spec/rules.py),
        the one the schema states too. Patterns are the caller's to check, with words
        that say what the value is (or that do not echo a secret)."""
        if default is _FIELD:
            default = default_of(cls, key)
            default = _REQUIRED if default is dataclasses.MISSING else default
        rule = rule_of(cls, key)
        kind, nullable = kind_of(cls, key)
        if not nullable and key in self.data and self.data[key] is None:
            # As the schema says: null is not "the default" (leave the key out for that).
            raise self.error("must not be null (leave it out for the default)", key)
        if kind is int:
            maximum = MAX_INT if rule.maximum is None else int(rule.maximum)
            minimum = None if rule.minimum is None else int(rule.minimum)
            return self.int(key, default, minimum=minimum, maximum=maximum)
        value = self.get(key, kind, default)
        if value is None:
            return value
        problem = rule.range_problem(value) if kind is float else rule.choice_problem(value)
        if problem:
            raise self.error(problem, key)
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = _REQUIRED) -> str:
        value = self.get(key, str, default)
        if value is not None and value not in options:
            raise self.error(f"{value!r} is not one of {', '.join(options)}", key)
        return value

    def child(self, key: str) -> _Node:
        self._seen.add(key)
        return _Node(self.data.get(key), self.child_path(key), self.file)

    def list(self, key: str, default: Any = ()) -> list[tuple[str, Any]]:
        """(path, item) pairs of a list field."""
        value = self.get(key, list, None)
        if value is None:
            return list(default)
        return [(f"{self.child_path(key)}[{i}]", item) for i, item in enumerate(value)]

    def str_list(self, key: str, default: Any = ()) -> tuple[str, ...]:
        items = []
        for path, item in self.list(key, default=[(None, d) for d in default]):
            if not isinstance(item, str):
                raise SpecError(self.file, path, f"expected a string, got {_type_name(item)}")
            items.append(item)
        return tuple(items)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            raise self.error(
                f"unknown key (allowed: {', '.join(sorted(self._seen))})", str(unknown[0])
            )


def _short(value: Any) -> str:
    """A number as the message shows it: a 10**5000 literal is not worth 5000 digits."""
    text = str(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
    return text


# A YAML value's type as a message names it.
_KIND_NAMES: dict[type, str] = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
}


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    return _KIND_NAMES.get(type(value), type(value).__name__)


def _kind_names(kinds: tuple) -> str:
    return " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
