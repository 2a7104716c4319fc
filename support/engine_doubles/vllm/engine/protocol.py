class EngineClient:
    """The engine client protocol (vllm.engine.protocol): AsyncLLM is one."""
