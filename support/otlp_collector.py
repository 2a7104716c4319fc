"""A loopback OTLP/HTTP trace receiver for the tests: it takes what an OpenTelemetry
exporter POSTs to /v1/traces (protobuf ExportTraceServiceRequest, as Triton's exporter and
the Python SDK's OTLP/HTTP exporter send it) and keeps the spans, flattened."""

from __future__ import annotations

import base64
import gzip
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each linked span


class Collector:
    """Use as a context manager; `endpoint` is the traces URL, `spans` what came."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.errors: list[str] = []  # batches it could not read
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    if self.headers.get("Content-Type", "").startswith("application/json"):
                        # OTLP/JSON writes ids as hex, where protobuf's JSON has base64;
                        # a newer exporter's fields this proto lacks are skipped.
                        text = _HEX_ID.sub(_as_base64, body.decode())
                        request = json_format.Parse(
                            text, ExportTraceServiceRequest(), ignore_unknown_fields=True
                        )
                    else:
                        request = ExportTraceServiceRequest.FromString(body)
                except Exception as e:  # kept for the test's message: a batch it lost
                    collector.errors.append(f"{type(e).__name__}: {e}"[:500])
                    self.send_error(400)
                    return
                collector.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource in request.resource_spans:
            attributes = {a.key: _value(a.value) for a in resource.resource.attributes}
            service = str(attributes.get("service.name", ""))
            for scope in resource.scope_spans:
                for span in scope.spans:
                    with self.lock:
                        self.spans.append(
                            Span(
                                service,
                                span.name,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                                {a.key: _value(a.value) for a in span.attributes},
                                tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                            )
                        )

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


_HEX_ID = re.compile(r'"(traceId|spanId|parentSpanId)"\s*:\s*"([0-9a-fA-F]*)"')


def _as_base64(match: re.Match) -> str:
    return f'"{match.group(1)}": "{base64.b64encode(bytes.fromhex(match.group(2))).decode()}"'


def _value(value) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":  # a list attribute (the router's candidates, say)
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None
