"""The drain of `trident serve` on a real tritonserver (builder/serve/drain.py, the
models' side in trident_common/drain.py, the frontend's in builder/serve/openai/
draining.py): the scenario of the drain's issue, with trident's SGLang model on the
SGLang double paced at 20 tokens/s behind the router, and the OpenAI frontend on.

Eight OpenAI SSE streams and eight gRPC streams through `router` (160 tokens: 8 s) and
one long stream of each kind (1,000 tokens: 50 s) are running when SIGTERM comes one
second in. Then: /health answers 503 at once; a new OpenAI request gets 503 with
Retry-After, a new gRPC request to the router or to the engine model a refusal in words;
the sixteen streams finish whole; at the drain timeout (12 s) the two long ones get an
explicit end (an SSE `server_shutdown` error event, a gRPC error with the final flag);
serve exits 0 soon after, leaving no process, shared memory or drain folder behind.

The shared `served` process (tests/server/served.py), whose end is this module's last
test (after test_restricted_api's). Here too are the `--load-model` subset, the loopback
binds and the per-start router secret of a served repository, and its traces
(builder/serve/tracing.py): the process exports OpenTelemetry spans to a loopback OTLP
collector (support/otlp_collector.py), and one request's spans, from the client's
traceparent through the frontend to the router's request in Triton and the engine
model's own span under it, are one trace."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from builder.cli.serve import ENGINE_GAUGES_FOLDER
from builder.serve.drain import run_dir
from builder.serve.openai.pod_metrics import (
    RUNNING,
    SGLANG_RUNNING,
    SGLANG_WAITING,
    sglang_gauges,
)
from builder.serve.server import SHM_DIR, TritonServer, shm_regions_of_group
from tests.helpers import wait_for
from tests.helpers.servers import listening_addresses
from tests.helpers.streams import Stream
from tests.server.served import DRAIN_TIMEOUT_S, LONG_TOKENS, SERVICE, SPEC
from trident_common import interface as INTERFACE

pytestmark = pytest.mark.server

TOKENS, STREAMS = 160, 8
CLIENT_TRACE, CLIENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


class Sse(threading.Thread):
    """One OpenAI chat stream through the frontend, in a thread: its words, its finish
    reason, or the error that ended it, and when it ended."""

    def __init__(self, base_url: str, max_tokens: int):
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        self.max_tokens = max_tokens
        self.words: list[str] = []
        self.finish_reason: str | None = None
        self.error: openai.APIError | None = None
        self.ended_at: float | None = None
        self.first = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model="router",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=self.max_tokens,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                choice = chunk.choices[0]
                self.words += (choice.delta.content or "").split()
                self.first.set()
                self.finish_reason = choice.finish_reason or self.finish_reason
        except openai.APIError as e:
            self.error = e
        finally:
            self.ended_at = time.monotonic()
            self.first.set()


def get(url: str) -> tuple[int, dict, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_the_served_repository_is_private_and_only_what_was_asked_is_loaded(served):
    ports, pid = served.ports, served.pid
    server = TritonServer(served.repo, ports)
    models = [model["name"] for model in SPEC["models"]] + ["router"]
    ready = {model: server.http_get(f"/v2/models/{model}/ready") for model in models}
    # What serve was told to load; `idle` is present, not loaded.
    assert ready == {"router": 200, "qwen": 200, "qa": 200, "idle": 400}
    # Triton's ports are private: bound to loopback, not to every interface.
    assert {
        (address, port)
        for address, port in listening_addresses(pid)
        if port in (ports.http, ports.grpc, ports.metrics)
    } == {("127.0.0.1", ports.http), ("127.0.0.1", ports.grpc), ("127.0.0.1", ports.metrics)}
    # The router secret is in the server's environment, made for this start.
    assert len(router_secret(pid)) >= 32


def router_secret(pid: int) -> bytes:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (secret,) = [
        v.split(b"=", 1)[1]
        for v in environ
        if v.startswith(INTERFACE.ROUTER_SECRET_ENV.encode() + b"=")
    ]
    return secret


def test_one_request_is_one_trace_from_the_client_through_the_router(served):
    server, collector = TritonServer(served.repo, served.ports), served.collector
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    client = openai.OpenAI(
        base_url=served.openai_url + "/v1",
        api_key="none",
        max_retries=0,
        default_headers={"traceparent": traceparent},
    )
    assert client.completions.create(model="router", prompt="Hi", max_tokens=4).choices[0].text

    def trace() -> dict:
        spans = [s for s in collector.spans if s.trace_id == CLIENT_TRACE]
        return {(s.service, s.name): s for s in spans}

    def ancestors(span) -> list[str]:
        by_id = {s.span_id: s for s in collector.spans if s.trace_id == CLIENT_TRACE}
        chain = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            chain.append(span.name)
        return chain

    # Triton's spans (its own service name) hang under the frontend's: the router
    # model's, under the request's. Each is exported as it ends, in its own time.
    def seen() -> str:  # what came, for a failure's message
        chains = {key: ancestors(span) for key, span in trace().items()}
        # Triton's request traced as a new root (its parent lost) shows as one of these.
        roots = [
            s.trace_id for s in collector.spans if s.name == "InferRequest" and not s.parent_id
        ]
        return (
            f"spans of the trace: {chains}; Triton's roots without a parent: {roots}; "
            f"batches the collector lost: {collector.errors}"
        )

    # The router's own span with its decision, and the engine model's span under it
    # (trident_common/tracing.py), both under Triton's span of the router.
    route = (f"{SERVICE}-triton", "route router")
    engine = (f"{SERVICE}-triton", "generate qwen")
    try:
        wait_for(lambda: route in trace() and engine in trace(), timeout_s=30)
        if trace()[route].attributes.pop("trident.triton_parent_lost", False):
            # tritonserver 2.51 lost the frontend's traceparent at times and traced the
            # request as a new root (tests/server/trace_parent_loss.py): the router's span is
            # the frontend's child then, linked to Triton's span of the router's request.
            (linked,) = trace()[route].links
            wait_for(lambda: any((s.trace_id, s.span_id) == linked for s in collector.spans))
            # The frontend's span leaves in its own batch, maybe after the router's.
            wait_for(lambda: ancestors(trace()[route]) == ["POST /v1/completions"], timeout_s=30)
        else:
            # Triton's spans (its own service name) hang under the frontend's.
            wait_for(
                lambda: (
                    ancestors(trace()[route]) == ["router", "InferRequest", "POST /v1/completions"]
                ),
                timeout_s=30,
            )
    except AssertionError as e:
        raise AssertionError(f"{e}: {seen()}") from None
    assert ancestors(trace()[engine])[0] == "route router"
    assert trace()[route].attributes == {
        "trident.route.outcome": "answered",
        "trident.route": "default",
        "trident.route.candidates": ["qwen"],
        "trident.route.backend": "qwen",
        "trident.route.breaker_state": "closed",
    }
    assert trace()[engine].attributes["gen_ai.usage.output_tokens"] == 4
    frontend = trace()[(SERVICE, "POST /v1/completions")]
    assert frontend.parent_id == CLIENT_SPAN  # the client's span is its parent
    assert frontend.attributes["http.response.status_code"] == 200

    # A Triton gRPC client's traceparent starts the trace just as well; sent as the
    # request parameter too (as the frontend does), the router's span stays in it when
    # Triton loses the metadata's.
    other = "4bf92f3577b34da6a3ce929d0e0e4736"
    sent = f"00-{other}-00f067aa0ba902b7-01"
    stream = Stream(
        server,
        max_tokens=4,
        headers={"traceparent": sent},
        parameters={INTERFACE.TRACEPARENT: sent},
    )
    try:
        assert stream.pump(30) and not stream.errors
        # Open until its spans came: Triton ends a request's trace when it releases the
        # request, which may be after the client had its final response.
        try:
            wait_for(
                lambda: (
                    {"route router", "generate qwen"}
                    <= {s.name for s in collector.spans if s.trace_id == other}
                ),
                timeout_s=30,
            )
        except AssertionError as e:
            spans = [(s.name, s.trace_id, s.parent_id) for s in collector.spans]
            raise AssertionError(f"{e}: the collector's spans {spans}") from None
    finally:
        stream.close()


@pytest.mark.destructive(stops=True)  # it ends `served`: after every other test of it
def test_sigterm_drains_every_stream_refuses_new_work_in_words_and_exits_0(served):
    ports, proc, output, pid = served.ports, served.proc, served.output, served.pid
    server, base = TritonServer(served.repo, ports), served.openai_url
    drain_folder = run_dir(proc.pid)
    secret, regions = router_secret(pid), shm_regions_of_group(pid)
    assert drain_folder.is_dir() and regions
    grpc = [Stream(server, max_tokens=TOKENS) for _ in range(STREAMS)]
    sse = [Sse(base + "/v1", TOKENS) for _ in range(STREAMS)]
    long_grpc, long_sse = Stream(server, max_tokens=LONG_TOKENS), Sse(base + "/v1", LONG_TOKENS)
    for stream in (*grpc, long_grpc):
        stream.wait_first_text(30)
    for thread in (*sse, long_sse):
        assert thread.first.wait(30) and thread.error is None, thread.error
    # The streams in SGLang's own load gauges, which the double's scheduler writes in
    # serve's run folder (trident_common/engine_gauges.py), and so in the pod's load on
    # the OpenAI port (pod_metrics.py).
    own = {s.name: s.value for s in sglang_gauges(drain_folder / ENGINE_GAUGES_FOLDER, ["qwen"])}
    assert own[SGLANG_RUNNING] == 2 * STREAMS + 2 and own[SGLANG_WAITING] == 0, own
    pod = {
        s.name: s.value
        for f in text_string_to_metric_families(get(base + "/metrics")[2])
        for s in f.samples
    }
    assert pod[RUNNING] == 2 * STREAMS + 2, pod

    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: get(base + "/health")[0] == 503, timeout_s=5, interval_s=0.02)
    health_503_s = time.monotonic() - signalled
    assert get(base + "/health/live")[0] == 200  # a drain never fails liveness
    refused = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as new_request:
        refused.completions.create(model="router", prompt="Hi", max_tokens=4)
    assert new_request.value.status_code == 503
    assert int(new_request.value.response.headers["Retry-After"]) > 0
    assert new_request.value.code == "server_draining"
    time.sleep(0.5)  # the models see the drain within their poll (0.1 s)
    for model in ("router", "qwen"):
        late = Stream(server, model=model, max_tokens=4)
        assert late.pump(10), model
        assert [e for e in late.errors if e.startswith("draining: ")], (model, late.errors)
        assert not late.texts, model

    for stream in grpc:
        assert stream.pump(30), "a gRPC stream never got its final flag"
        assert not stream.errors and len("".join(stream.texts).split()) == TOKENS
    for thread in sse:
        thread.join(30)
        assert thread.error is None, thread.error
        assert (thread.finish_reason, len(thread.words)) == ("length", TOKENS)

    # The long ones: an explicit end at the drain timeout, never a silent cut.
    assert long_grpc.pump(DRAIN_TIMEOUT_S + 10) and long_grpc.finals == 1
    assert [e for e in long_grpc.errors if e.startswith("server shutdown: ")], long_grpc.errors
    long_sse.join(DRAIN_TIMEOUT_S + 10)
    assert long_sse.error is not None and long_sse.error.code == "server_shutdown"
    assert len(long_sse.words) < LONG_TOKENS

    for stream in (*grpc, long_grpc):
        stream.close()
    assert proc.wait(timeout=30) == 0
    exited = time.monotonic()
    last_end = max(long_sse.ended_at or 0, max(t.ended_at or 0 for t in sse))
    said = output.read_text()
    print(
        f"drain: /health 503 after {health_503_s:.2f} s; serve exited "
        f"{exited - last_end:.1f} s after the last stream ended"
    )
    assert "drained in" in said and "drain timeout: ending the answers" in said
    assert secret.decode() not in said  # never printed
    assert (
        subprocess.run(
            ["pgrep", "-f", "--", f"--http-port={ports.http}"], capture_output=True
        ).stdout.split()
        == []
    )
    assert not any((SHM_DIR / name).exists() for name in regions)
    assert not drain_folder.exists()
