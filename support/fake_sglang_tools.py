"""A test double of SGLang's tool-call parsing (sglang 0.5.23's
`sglang.srt.function_call.function_call_parser.FunctionCallParser` and the `Tool` of
`sglang.srt.entrypoints.openai.protocol`), for the SGLang double.

Same surface as trident's SGLang model uses: `FunctionCallParser(tools, name)`,
`has_tool_call(text)`, `parse_non_stream(text) -> (normal_text, [ToolCallItem])` with
`name` and `parameters` (JSON text). Only the "qwen25" format (Qwen 2.5's, the Hermes
one: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`) is known; another
name is a ValueError, as SGLang raises for a parser it does not have.
"""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass

FORMATS = {"qwen25": re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)}


@dataclass
class Function:
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool = False


class Tool:
    def __init__(self, type: str = "function", function: dict | None = None):
        self.type = type
        self.function = Function(**(function or {}))


@dataclass
class ToolCallItem:
    tool_index: int
    name: str | None
    parameters: str


class FunctionCallParser:
    def __init__(self, tools: list, tool_call_parser: str):
        if tool_call_parser not in FORMATS:
            raise ValueError(f"Unsupported tool_call_parser: {tool_call_parser}")
        self.tools = tools
        self._pattern = FORMATS[tool_call_parser]

    def has_tool_call(self, text: str) -> bool:
        return "<tool_call>" in text

    def parse_non_stream(self, full_text: str) -> tuple[str, list]:
        names = [tool.function.name for tool in self.tools]
        calls = []
        for match in self._pattern.finditer(full_text):
            try:
                found = json.loads(match.group(1))
            except json.JSONDecodeError:
                continue
            if found.get("name") in names:
                calls.append(
                    ToolCallItem(
                        names.index(found["name"]),
                        found["name"],
                        json.dumps(found.get("arguments", {})),
                    )
                )
        normal = full_text[: full_text.find("<tool_call>")].strip()
        return normal, calls


def install(modules: dict | None = None) -> None:
    """Make `from sglang.srt.function_call.function_call_parser import ...` and
    `from sglang.srt.entrypoints.openai.protocol import Tool` find these (in `modules`,
    sys.modules by default)."""
    modules = sys.modules if modules is None else modules
    parser = types.ModuleType("sglang.srt.function_call.function_call_parser")
    parser.FunctionCallParser = FunctionCallParser
    protocol = types.ModuleType("sglang.srt.entrypoints.openai.protocol")
    protocol.Tool = Tool
    for name in (
        "sglang.srt",
        "sglang.srt.function_call",
        "sglang.srt.entrypoints",
        "sglang.srt.entrypoints.openai",
    ):
        modules.setdefault(name, types.ModuleType(name))
    modules[parser.__name__] = parser
    modules[protocol.__name__] = protocol
