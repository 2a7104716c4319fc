"""How often tritonserver 2.51 loses a traced request's parent: each request carries a
valid W3C traceparent (OpenAI requests through the frontend, and Triton gRPC streams of
`router`), and Triton's spans of it should hang under that parent. Counted here: the
requests whose Triton `router` span is in their own trace, those whose is not, and
Triton's `InferRequest` spans with no parent at all (every request sent had one); and
the router's own spans (`route router`) in their caller's trace, those of them that
found Triton's parent lost (trident.triton_parent_lost: the caller's traceparent, sent
as a request parameter too, kept them in it), and any outside it.

Why they are lost (read in server r24.10, src/grpc/infer_handler.h): Triton's gRPC
carrier returns the metadata value as `string_ref::data()`, which is not NUL-terminated,
into a string_view made with strlen; when the byte after the value in Triton's memory is
not 0 the traceparent reads longer than 55 characters, opentelemetry-cpp's
HttpTraceContext rejects it, and (rate=1) Triton traces the request as a new root: the
symptom counted here. It depends on what Triton's memory held before: PAD short gRPC
calls with a non-NUL metadata value of about a traceparent's length before each traced
request make it likelier (none lost in 80 without them, in one fresh process).

Runs the server tests' `served` process (tests/server/served.py) with its loopback
collector: a diagnosis of that process's trace test, so it lives beside it (benchmarks
import nothing from tests/).
Usage: PAD=20 .venv/bin/python -m tests.server.trace_parent_loss 60
"""

from __future__ import annotations

import collections
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import openai
import tritonclient.grpc as grpcclient

from builder.serve.server import TritonServer
from tests.helpers.streams import Stream
from tests.server import served
from trident_common import interface as INTERFACE

EXPORT_WAIT_S = 12  # past Triton's batch span processor delay (5 s by default)


def main(pairs: int, pad: int) -> None:
    process = served.serve(Path(tempfile.mkdtemp(prefix="trace_parent_loss")))
    serve = next(process)
    try:
        server = TritonServer(serve.repo, serve.ports)
        padder = grpcclient.InferenceServerClient(server.grpc_url)

        def churn() -> None:
            for k in range(pad):
                padder.is_server_live(headers={"x-pad": "A" * (50 + k % 20)})

        sent: dict[str, str] = {}  # trace id -> face
        for _ in range(pairs):
            churn()
            trace = secrets.token_hex(16)
            client = openai.OpenAI(
                base_url=serve.openai_url + "/v1",
                api_key="none",
                max_retries=0,
                default_headers={"traceparent": f"00-{trace}-{secrets.token_hex(8)}-01"},
            )
            client.completions.create(model="router", prompt="Hi", max_tokens=2)
            sent[trace] = "openai"
            churn()
            trace = secrets.token_hex(16)
            traceparent = f"00-{trace}-{secrets.token_hex(8)}-01"
            stream = Stream(
                server,
                max_tokens=2,
                headers={"traceparent": traceparent},
                parameters={INTERFACE.TRACEPARENT: traceparent},  # as the frontend sends it
            )
            try:
                assert stream.pump(30) and not stream.errors, stream.errors
            finally:
                stream.close()
            sent[trace] = "grpc"
        time.sleep(EXPORT_WAIT_S)
        spans = list(serve.collector.spans)
        routed = {s.trace_id for s in spans if s.name == "router"}
        linked = collections.Counter(face for trace, face in sent.items() if trace in routed)
        lost = collections.Counter(face for trace, face in sent.items() if trace not in routed)
        roots = sum(1 for s in spans if s.name == "InferRequest" and not s.parent_id)
        routes = [s for s in spans if s.name == "route router"]
        kept = sum(1 for s in routes if s.trace_id in sent)
        recovered = sum(1 for s in routes if s.attributes.get("trident.triton_parent_lost"))
        print(
            f"traced requests {len(sent)} (pad {pad}): linked {dict(linked)}, "
            f"lost {dict(lost)}, Triton roots without a parent {roots}, "
            f"batches the collector could not read {len(serve.collector.errors)}; "
            f"router spans in their caller's trace {kept} of {len(routes)}, "
            f"of them kept there when Triton lost the parent {recovered}"
        )
    finally:
        process.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60, int(os.environ.get("PAD", "20")))
