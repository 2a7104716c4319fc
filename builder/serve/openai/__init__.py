"""An OpenAI-compatible HTTP frontend in front of trident's tritonserver.

It holds no model and runs no engine: every request becomes one gRPC stream to a Triton
model (`router` or an engine model) in trident's tensor interface (README, "The tensor
interface"), and every answer is the engine's own text, finish reason and token counts.

    protocol.py   pure: OpenAI request JSON -> a Generation; answers, chunks, errors
    triton.py     the gRPC side (tritonclient.grpc.aio): models, configs, one stream
    app.py        the FastAPI application: /v1/models, /v1/chat/completions, /v1/completions
    runner.py     run it standalone (`trident openai`) or beside `trident serve`
"""
