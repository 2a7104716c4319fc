"""A route hint that names a backend pins it, in a real tritonserver: `route: primary`
under more streams than primary takes is answered by primary or refused (overloaded),
never by `backup`, primary's fallback and another model. Requests without the hint still
fall back. Two SGLang engine doubles (support/sglang_double.py), so it costs seconds."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from builder.serve import client as infer
from support.sglang_double import SHIM
from tests.helpers.servers import render

pytestmark = [pytest.mark.server]

SPEC = {
    "name": "pinned",
    "hardware": {"gpu": "cpu"},
    "models": [
        {
            "name": name,
            "engine": "sglang",
            "model": "/models/test-double",
            "engine_args": {"context_length": 4096},
        }
        for name in ("primary", "backup")
    ],
    "router": {
        "default": ["primary"],
        "fallback": {"primary": ["backup"]},
        "max_inflight_per_backend": 2,
    },
}
STREAMS = 12


def _outcome(server, hints) -> str:
    """Who answered, or the first word of the router's refusal."""
    try:
        return infer.stream_generate(
            server.grpc_url, "router", "Hello", max_tokens=40, hints=hints, timeout_s=120
        ).served_by
    except infer.InferError as e:
        return str(e).removeprefix("router: ").split(":")[0]


def test_a_pinned_backend_answers_or_refuses_never_its_fallback(tmp_path, pool):
    repo = render(SPEC, tmp_path / "repo")
    for name in ("primary", "backup"):
        (repo / name / "1" / "sglang.py").write_text(SHIM)
    with (
        pool.serving("pinned", repo) as server,
        ThreadPoolExecutor(STREAMS) as streams,
    ):
        pinned = Counter(
            streams.map(lambda _: _outcome(server, {"route": "primary"}), range(STREAMS))
        )
        unpinned = Counter(streams.map(lambda _: _outcome(server, None), range(STREAMS)))
    assert set(pinned) <= {"primary", "overloaded"}, pinned
    assert pinned["primary"] >= 1 and pinned["overloaded"] >= 1, pinned
    assert unpinned["backup"] >= 1, unpinned  # the default route still falls back
