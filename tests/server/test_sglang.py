"""The SGLang model inside a real tritonserver on the CPU, with the engine double.

SGLang cannot start here, so the rendered model gets support/fake_sglang.py as its
`sglang` module (a shim written into the temporary repository only; the stub puts the
model directory on sys.path). Everything else is real: Triton's Python stub and
pb_utils, decoupled streaming over gRPC, cancellation, the router with its abort by
request id and conversation hints, Prometheus metrics. The checks are the GPU check's
own (tests/gpu/check_sglang.py), so the GPU run exercises the same assertions.
"""

from __future__ import annotations

import pytest

from tests.gpu import check_sglang

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(sglang_check_server):
    return sglang_check_server


def test_streaming(server):
    check_sglang.check_streaming(server)


def test_client_abort(server):
    check_sglang.check_abort(server, check_sglang.MODEL)


def test_router_abort(server):
    check_sglang.check_abort(server, "router")


def test_prefix_cache_over_two_turns(server):
    check_sglang.check_prefix_cache(server)


def test_sglangs_own_load_gauges_rise_under_a_stream_and_fall_back(server):
    check_sglang.check_load(server)
