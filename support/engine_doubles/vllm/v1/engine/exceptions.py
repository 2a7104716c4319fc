class EngineGenerateError(Exception):
    """vLLM wraps what failed while processing a request's input in this."""


class EngineDeadError(Exception):
    """The engine core died."""
