"""vLLM's own spans join the request's trace (trident_common/tracing.py): the vLLM model
turns on vLLM's exporter towards trident's endpoint, and hands each request's engine
span to vLLM's generate as the parent of vLLM's `llm_request` span. That a real vLLM
exports it so is checked in tests/python_backends/test_vllm_kv_events.py's engine."""

from __future__ import annotations

import contextvars

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.python_backends.test_compile_bound import LateEngine, call, collect, vllm_model
from tests.python_backends.test_vllm_health import module as vllm_module  # noqa: F401
from trident_common import tracing
from trident_common.spans import Spans

ENDPOINT = "http://127.0.0.1:4318/v1/traces"


def test_traces_on_turn_on_vllms_exporter_over_otlp_http():
    config, environ = {}, {tracing.ENDPOINT_ENV: ENDPOINT}
    tracing.vllm_tracing_defaults(config, environ)
    assert config == {"otlp_traces_endpoint": ENDPOINT}
    assert environ[tracing.VLLM_PROTOCOL_ENV] == "http/protobuf"


def test_traces_off_or_the_specs_own_endpoint_are_left_alone():
    config, environ = {}, {}
    tracing.vllm_tracing_defaults(config, environ)
    assert (config, environ) == ({}, {})
    own = {"otlp_traces_endpoint": "collector:4317"}
    environ = {tracing.ENDPOINT_ENV: ENDPOINT, tracing.VLLM_PROTOCOL_ENV: "grpc"}
    tracing.vllm_tracing_defaults(own, environ)
    assert own == {"otlp_traces_endpoint": "collector:4317"}
    assert environ[tracing.VLLM_PROTOCOL_ENV] == "grpc"  # the operator's, for their endpoint
    quiet = {"disable_log_stats": True}  # vLLM's span needs its stats: no span, no crash
    tracing.vllm_tracing_defaults(quiet, {tracing.ENDPOINT_ENV: ENDPOINT})
    assert quiet == {"disable_log_stats": True}


def test_the_engine_span_is_vllms_parent_in_its_task_only(vllm_module):  # noqa: F811
    spans = Spans(SimpleSpanProcessor(InMemorySpanExporter()), Resource.create({}), "test")
    span = spans.start("generate smollm2")
    engine = LateEngine()
    model = vllm_model(vllm_module, engine)

    def traced():
        tracing.ENGINE_SPAN.set(span)  # as engine_model._generate sets it in its task
        return collect(model, call(vllm_module, "", bounded=False))

    contextvars.copy_context().run(traced)
    context = span.get_span_context()
    flags = int(context.trace_flags)
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    assert engine.trace_headers == {"traceparent": parent}
    collect(model, call(vllm_module, "", bounded=False))  # untraced: no headers at all
    assert engine.trace_headers is None
    assert tracing.engine_trace_headers() is None
    span.end()
