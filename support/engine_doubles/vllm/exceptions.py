class VLLMClientError(ValueError):
    """A request the engine refuses (vllm.exceptions)."""
