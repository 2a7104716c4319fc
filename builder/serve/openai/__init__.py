"""An OpenAI-compatible HTTP frontend in front of trident's tritonserver.

It holds no model and runs no engine: every request becomes one gRPC stream to an
exposed Triton model (`router` unless the operator exposes others) in trident's tensor
interface (docs/clients.md, "The tensor interface"), and every answer is the engine's own text,
finish reason and token counts.

    schema.py     pure: OpenAI's request bodies as pydantic models, and their rules' words
    protocol.py   pure: OpenAI request JSON -> a Generation (validated by schema.py)
    answers.py    pure: answers, chunks, usage as OpenAI's JSON
    choices.py    every answer: its choices' calls read into JSON or SSE chunks
    errors.py     pure: OpenAI's error shape; Triton's errors mapped onto it
    limits.py     pure: body size, depth, messages, max_tokens bounds
    policy.py     pure: which models a client reaches, which hints a keyed client keeps
    keys.py       API keys: the keys file, the bearer check
    triton.py     the gRPC side (tritonclient.grpc.aio): models, configs, one stream
    draining.py   the drain: new work refused, answers in flight finished or cut off
    pod_metrics.py  GET /metrics: the pod's load for an endpoint picker
    traces.py     a request's OpenTelemetry span, when traces are on
    app.py        the FastAPI application: /v1/models, /v1/chat/completions, /v1/completions
    runner.py     run it standalone (`trident openai`) or beside `trident serve`
"""
