"""What a client without keys can do to `trident serve` on a real tritonserver: the
shared `served` process (tests/server/served.py: SGLang-double models behind the
router, the OpenAI frontend on):

- Triton's model control answers trident only. A client that reaches Triton's ports
  without the admin key cannot load, unload or list models, nor change the log
  settings, over HTTP or gRPC, and the model stays loaded; inference, health and the
  frontend are not affected. The key is on tritonserver's command line, the router
  secret is not.
- A flood of half-sent requests and huge headers on the OpenAI port is refused in
  words (503, 408, 431: builder/serve/openai/guard.py) and costs nothing else: the
  process stays within its descriptors and memory, tritonserver is untouched, and the
  keeper still reloads a killed model afterwards (the last test)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from builder.serve import admin, client
from builder.serve.openai.guard import RESERVED_FDS
from builder.serve.watch import stub_processes
from tests.helpers import wait_for
from tests.helpers.servers import accepted_connections, served_pid
from tests.server.served import FD_LIMIT
from trident_common import interface as INTERFACE

pytestmark = pytest.mark.server


def http(url: str, path: str, headers=None, data: bytes | None = b"{}") -> tuple[int, str]:
    call = urllib.request.Request(
        url + path, data=data, headers=headers or {}, method="GET" if data is None else "POST"
    )
    try:
        with urllib.request.urlopen(call, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def ready(url: str, model: str) -> bool:
    return http(url, f"/v2/models/{model}/ready", data=None)[0] == 200  # health: open


def refused_over_grpc(call) -> str:
    with pytest.raises(InferenceServerException) as refusal:
        call()
    return str(refusal.value)


def test_model_control_without_the_key_is_refused_over_http(served):
    url = f"http://127.0.0.1:{served.ports.http}"
    for headers in (None, {admin.HEADER: "not-the-key-" * 4}):
        for path in (
            "/v2/repository/models/qa/unload",
            "/v2/repository/models/qa/load",
            "/v2/repository/index",
        ):
            code, said = http(url, path, headers)
            assert code == 403 and "restricted" in said, (path, code, said)
        code, _ = http(url, "/v2/logging", headers, json.dumps({"log_verbose_level": 1}).encode())
        assert code == 403
        code, _ = http(
            url,
            "/v2/systemsharedmemory/region/x/register",
            headers,
            json.dumps({"key": "/x", "offset": 0, "byte_size": 8}).encode(),
        )
        assert code == 403
    assert ready(url, "qa") and ready(url, "router")


def test_model_control_without_the_key_is_refused_over_grpc(served):
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports.grpc}")
    try:
        for call in (
            lambda: grpc.unload_model("qa"),
            lambda: grpc.load_model("qa"),
            grpc.get_model_repository_index,
            grpc.get_log_settings,
            lambda: grpc.unload_model("qa", headers={admin.GRPC_HEADER: "x" * 40}),
        ):
            assert "restricted" in refused_over_grpc(call)
        assert grpc.is_model_ready("qa")
    finally:
        grpc.close()
    assert ready(f"http://127.0.0.1:{served.ports.http}", "qa")


def test_each_model_instance_has_a_pool_sized_for_the_routers_bls_calls(served):
    # python_backend makes one pool of thread-pool-size threads per model instance (one
    # stub each) in tritonserver, at the instance's load: 32 each by Triton's default.
    stubs = stub_processes(served.pid)
    threads = len(os.listdir(f"/proc/{served.pid}/task"))
    assert len(stubs) >= 2
    assert threads >= len(stubs) * INTERFACE.PYTHON_THREAD_POOL_SIZE


def test_inference_and_the_frontend_need_no_key(served):
    answer = client.stream_generate(
        f"127.0.0.1:{served.ports.grpc}", "router", "hi", max_tokens=4, timeout_s=60
    )
    assert answer.text and answer.served_by == "qwen"
    # The frontend lists models through the (restricted) index: it carries the key.
    code, said = http(served.openai_url, "/v1/models", data=None)
    assert code == 200 and [m["id"] for m in json.loads(said)["data"]] == ["router"]


def test_the_key_is_on_the_command_line_the_router_secret_is_not(served):
    argv = Path(f"/proc/{served.pid}/cmdline").read_bytes().decode().split("\0")
    key = [a for a in argv if a.startswith("--http-restricted-api=")][0].rsplit("=", 1)[1]
    environ = dict(
        line.split("=", 1)
        for line in Path(f"/proc/{served.pid}/environ")
        .read_bytes()
        .decode(errors="replace")
        .split("\0")
        if "=" in line
    )
    secret = environ[INTERFACE.ROUTER_SECRET_ENV]
    assert len(key) >= 32 and key != secret and secret not in "\0".join(argv)
    assert admin.KEY_ENV not in environ
    # The key is what opens model control: an operator on the host may use it.
    url = f"http://127.0.0.1:{served.ports.http}"
    code, said = http(url, "/v2/repository/index", admin.http_headers(key))
    assert code == 200 and {m["name"] for m in json.loads(said)} == {"qa", "qwen", "idle", "router"}


def _half_sent(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and no more, no key
    return sock


def _status(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the one answer a refused connection gets."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def _settled_connections(pid: int, port: int, within_s: float = 15.0) -> int:
    """The connections the frontend holds once those that earlier tests left (kept alive,
    or read and dropped after a refusal for LINGER_S) have had `within_s` to close."""
    deadline = time.monotonic() + within_s
    while (held := accepted_connections(pid, port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return held


def test_a_keyless_flood_is_refused_in_words_and_costs_nothing_else(served):
    ports, openai, pid, output, proc = (
        served.ports,
        served.openai_port,
        served.pid,
        served.output,
        served.proc,
    )
    # The frontend's connection cap under this limit, less what it holds already.
    room = FD_LIMIT - RESERVED_FDS - _settled_connections(proc.pid, openai)
    with ExitStack() as held:
        flood = [held.enter_context(_half_sent(openai)) for _ in range(room + 100)]
        # Over the cap: refused at once, in words; a new health check too.
        refused = [_status(sock) for sock in flood[room:]]
        assert {status for status, _ in refused} == {503}
        assert refused[0][1]["error"]["code"] == "server_overloaded"
        code, said = http(f"http://127.0.0.1:{openai}", "/health", data=None)
        assert code == 503 and "open connections" in said
        # The slow ones: each a 408 at its deadline; trident serve and Triton untouched.
        assert {_status(sock)[0] for sock in flood[:room]} == {408}
        assert proc.poll() is None and served_pid(ports) == pid
    wait_for(lambda: http(f"http://127.0.0.1:{openai}", "/health", data=None)[0] == 200, 30)
    # Huge headers are refused at the limit, not held: the process stays its size.
    before = _rss_kib(proc.pid)
    for _ in range(4):
        with socket.create_connection(("127.0.0.1", openai), timeout=30) as sock:
            try:
                sock.sendall(b"GET /health HTTP/1.1\r\nx-big: " + b"y" * 16 * 2**20)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused part way
            assert _status(sock)[0] == 431
    assert _rss_kib(proc.pid) - before < 32 * 1024
    answer = client.stream_generate(f"127.0.0.1:{ports.grpc}", "router", "hi", max_tokens=4)
    assert answer.text
    assert "keeper cannot watch" not in output.read_text()


@pytest.mark.destructive  # a stub killed: after the other tests of `served`, before its drain
def test_the_keeper_still_reloads_a_killed_model(served):
    pid, output = served.pid, served.output
    url = f"127.0.0.1:{served.ports.grpc}"
    victim = [s for s in stub_processes(pid).values() if s.model == "qa"][0]
    os.kill(victim.pid, signal.SIGKILL)
    wait_for(lambda: "model 'qa' is back" in output.read_text(), 90, interval_s=0.5)
    assert [s.pid for s in stub_processes(pid).values() if s.model == "qa"] != [victim.pid]
    assert client.stream_generate(url, "qa", "hi", max_tokens=4, timeout_s=60).text
    keeper_lines = [
        line for line in output.read_text().splitlines() if line.startswith("trident serve:")
    ]
    assert not [line for line in keeper_lines if "failed" in line], keeper_lines
