"""Each rule of a spec field, written once: on the field of the typed spec, as dataclass
field metadata (`rule`), read by the parser (`_Node.field` in node.py, or `rule_of` where
a section checks a value itself) and by `trident schema` (schema.py) alike.

A Rule holds what a JSON Schema can state about one value: a numeric range, a set of
choices, a regular expression, a least number of items, and the rule of each item (of a
list) or value (of a mapping). Rules across fields stay with the parser of their section.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from dataclasses import dataclass
from typing import Any

RULE = "trident.rule"  # the key of a Rule in a dataclass field's metadata


@dataclass(frozen=True)
class Rule:
    minimum: float | None = None
    maximum: float | None = None
    # The minimum itself is refused: (minimum, maximum], as rates and durations are.
    above: bool = False
    choices: tuple[str, ...] | None = None
    ignore_case: bool = False  # choices compared in lower case (dtype names)
    pattern: str | None = None  # a regex the whole value must match
    excludes: str | None = None  # a regex the whole value must not match
    min_items: int | None = None
    unique: bool = False  # a list holds no value twice
    keys: str | None = None  # a regex every key of a mapping must match
    item: Rule | None = None  # the rule of each item of a list or value of a mapping

    def range_problem(self, value: float) -> str | None:
        """Why a number is out of range, or None: the parser's words for it."""
        if self.above and self.minimum is not None:
            if self.minimum < value <= _top(self.maximum):
                return None
            if self.maximum is None:
                return f"must be > {_num(self.minimum)}, got {value}"
            return f"must be in ({_num(self.minimum)}, {_num(self.maximum)}], got {value}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {_num(self.minimum)}, got {value}"
        if self.maximum is not None and value > self.maximum:
            return f"must be <= {_num(self.maximum)}, got {value}"
        return None

    def choice_problem(self, value: str) -> str | None:
        """Why a string is not one of the choices, or None."""
        if self.choices is None:
            return None
        seen = value.lower() if self.ignore_case else value
        if seen in self.choices:
            return None
        return f"{value!r} is not one of {', '.join(self.choices)}"

    def matches(self, value: str) -> bool:
        """Whether a string passes pattern and excludes (fullmatch: `$` lets "x\\n" by)."""
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return False
        return self.excludes is None or not re.fullmatch(self.excludes, value)


NO_RULE = Rule()


def rule(**keywords: Any) -> dict[str, Rule]:
    """A field's metadata holding its Rule: `field(default=1, metadata=rule(minimum=1))`
    (dataclasses.field itself, so type checkers still see the default and the type)."""
    return {RULE: Rule(**keywords)}


def rule_of(cls: type, name: str) -> Rule:
    """The Rule of one field of a spec dataclass (NO_RULE when it has none)."""
    return _fields(cls)[name].metadata.get(RULE, NO_RULE)


def default_of(cls: type, name: str) -> Any:
    """A field's default value, or dataclasses.MISSING when the field is required."""
    return _fields(cls)[name].default


@functools.cache
def kind_of(cls: type, name: str) -> tuple[type, bool]:
    """(the field's scalar type, whether it may be None): `int | None` is (int, True)."""
    hint = typing.get_type_hints(cls)[name]
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else object), True
    return hint, False


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _top(maximum: float | None) -> float:
    return float("inf") if maximum is None else maximum


def _num(value: float | None) -> str:
    """A bound as messages show it: 86400.0 as 86400."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
