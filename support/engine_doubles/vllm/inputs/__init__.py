from vllm.inputs.data import TokensPrompt  # noqa: F401
