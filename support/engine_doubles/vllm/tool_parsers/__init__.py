"""The double's vllm.tool_parsers: the model looks its spec's parser up by name when it
loads (deploy/default.yaml names hermes). The double's answers are filler text, never a
call, so its parser reads none; an unknown name fails the load, as vLLM's manager does."""

from __future__ import annotations

KNOWN = frozenset({"hermes", "llama3_json", "mistral", "pythonic", "granite", "qwen3_xml"})


class _Found:
    def __init__(self, content: str):
        self.tools_called = False
        self.tool_calls: list = []
        self.content = content


class NoCallsParser:
    def __init__(self, tokenizer, tools=None):
        self.tokenizer = tokenizer

    def extract_tool_calls(self, model_output: str, request) -> _Found:
        return _Found(model_output)


class ToolParserManager:
    @staticmethod
    def get_tool_parser(name: str) -> type[NoCallsParser]:
        if name not in KNOWN:
            raise KeyError(f"tool parser '{name}' not found in tool_parsers")
        return NoCallsParser
