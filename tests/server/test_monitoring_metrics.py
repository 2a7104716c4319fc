"""Every metric a rendered alert or dashboard panel queries exists on a real server.

tests/k8s checks the names against the names written in trident's code; this checks them
against what a real tritonserver exports. A small repository (two SGLang models with the
engine double, `qwen` and `spare`, behind the router, tenants on a real Redis) serves a
streamed request, a client cancel, a bad request and a request that `qwen` fails before
its first token (so the router falls back to `spare`): the router's lazily created series
(requests, errors, fallbacks, aborts, breaker states) then exist. /metrics is scraped, and
every metric name in the PrometheusRule and the Grafana dashboard that builder.k8s renders
(for this spec and for deploy/examples/h100x8.yaml) must be a sample name there, as
Prometheus would look it up (a histogram's samples are its _bucket, _sum and _count).
"""

from __future__ import annotations

import copy
import json
import re
import urllib.request

import pytest
import yaml

from builder.k8s import monitoring
from builder.k8s import render as k8s_render
from builder.plan.planner import plan_for_spec
from builder.spec import load_spec, parse_spec
from support.sglang_double import SHIM
from tests.gpu import check_sglang
from tests.helpers import metric_value, wait_for
from tests.helpers.servers import ROOT, render
from tests.helpers.streams import ENDLESS, Stream

pytestmark = pytest.mark.server

FAIL = "FAIL-BEFORE-FIRST-TOKEN"
# `qwen` fails any prompt carrying FAIL before its first token; `spare` answers it.
FAILING_SHIM = (
    SHIM
    + f"""

_Base = Engine


class Engine(_Base):
    async def _generate(self, prompt, *args):
        if {FAIL!r} in prompt:
            raise RuntimeError("scripted failure before the first token")
        async for chunk in super()._generate(prompt, *args):
            yield chunk
"""
)

# PromQL words that are not metric names (functions are recognised by their '(').
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}


def spec_data(redis_url: str = "redis://127.0.0.1:6379/0") -> dict:
    data = check_sglang.deployment("/models/test-double", "cpu")
    spare = copy.deepcopy(data["models"][0])
    spare["name"] = "spare"
    data["models"].append(spare)
    # Two replicas (pair__r0, pair__r1) behind the router: the replica panels' series.
    pair = copy.deepcopy(data["models"][0])
    pair.update(name="pair", instances=2, placement={})
    data["models"].append(pair)
    data["router"] = {"default": [check_sglang.MODEL, "spare"]}
    # Replicas with tenants need shared counters (the spec refuses them without Redis).
    data["tenants"] = {
        "default": {"requests_per_minute": 1000},
        "limits": {"a": {}},
        "redis": redis_url,
    }
    return data


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr
    )  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", expr):
        if m.group(2) is None and m.group(1) not in _KEYWORDS:
            names.add(m.group(1))
    return names


def rendered_expressions() -> dict[str, str]:
    """{where: expr} of every alert and panel query builder.k8s renders, both as the
    Kubernetes objects of `trident k8s` (h100x8) and as `trident monitoring`'s files."""
    exprs = {}
    h100 = load_spec(ROOT / "deploy" / "examples" / "h100x8.yaml")
    files = k8s_render.render_files(
        h100, plan_for_spec(h100), k8s_render.options("llm", None, None, 2.0)
    )
    docs = [d for text in files.values() for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if doc["kind"] == "PrometheusRule":
            for group in doc["spec"]["groups"]:
                for rule in group["rules"]:
                    exprs[f"k8s alert {rule['alert']}"] = rule["expr"]
        if doc["kind"] == "ConfigMap" and monitoring.DASHBOARD_FILE in doc.get("data", {}):
            for panel in json.loads(doc["data"][monitoring.DASHBOARD_FILE])["panels"]:
                for target in panel["targets"]:
                    exprs[f"k8s panel {panel['title']!r} {target['refId']}"] = target["expr"]
    ours = monitoring.monitoring_files(parse_spec(spec_data(), "<test>"), 2.0)
    for group in yaml.safe_load(ours["trident-alerts.yaml"])["groups"]:
        for rule in group["rules"]:
            exprs[f"alert {rule['alert']}"] = rule["expr"]
    for panel in json.loads(ours[monitoring.DASHBOARD_FILE])["panels"]:
        for target in panel["targets"]:
            exprs[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    assert any(k.startswith("k8s alert") for k in exprs)
    assert any(k.startswith("k8s panel") for k in exprs)
    return exprs


def scraped_samples(metrics_url: str) -> set[str]:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    return {
        re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis, pool):
    tmp = tmp_path_factory.mktemp("monitoring-metrics")
    repo = render(spec_data(redis.url), tmp / "repo")
    (repo / check_sglang.MODEL / "1" / "sglang.py").write_text(FAILING_SHIM)
    for model in ("spare", "pair__r0", "pair__r1"):
        (repo / model / "1" / "sglang.py").write_text(SHIM)
    with pool.serving("monitoring-metrics", repo, timeout_s=90) as server:
        yield server


def traffic(server) -> None:
    """Requests that make every kind of series appear, each checked for its effect."""
    ok = Stream(server, hints={"tenant": "a"}, max_tokens=8)
    assert ok.pump(30) and not ok.errors and ok.text, ok.errors
    ok.close()

    cancelled = Stream(server, hints={"tenant": "a"}, max_tokens=3000, sampling=ENDLESS)
    cancelled.wait_first_text(30)
    cancelled.close(cancel=True)
    wait_for(
        lambda: (
            metric_value(server.metrics_url, "trident_router_aborts_total", router="router") >= 1
        ),
        timeout_s=20,
    )

    bad = Stream(server, hints={"tenant": "a"}, sampling={"temperature": -1.0})
    assert bad.pump(30) and bad.errors, "a negative temperature was accepted"
    bad.close()

    fell_back = Stream(server, prompt=FAIL, hints={"tenant": "a"}, max_tokens=4)
    assert fell_back.pump(30) and not fell_back.errors, fell_back.errors
    assert fell_back.served_by == {"spare"}, fell_back.served_by
    fell_back.close()
    wait_for(
        lambda: (
            metric_value(
                server.metrics_url, "trident_router_fallbacks_total", backend=check_sglang.MODEL
            )
            >= 1
        ),
        timeout_s=10,
    )

    replicated = Stream(server, hints={"tenant": "a", "route": "pair"}, max_tokens=4)
    assert replicated.pump(30) and not replicated.errors, replicated.errors
    replicated.close()
    wait_for(
        lambda: (
            "trident_router_replica_index_updated_timestamp_seconds"
            in scraped_samples(server.metrics_url)
        ),
        timeout_s=10,
    )


def test_every_alert_and_panel_metric_is_exported(server):
    traffic(server)
    exprs = rendered_expressions()
    scraped = wait_for(lambda: scraped_samples(server.metrics_url), timeout_s=10)
    missing = {
        where: sorted(metric_names(expr) - scraped)
        for where, expr in exprs.items()
        if metric_names(expr) - scraped
    }
    assert not missing, f"queried but not exported: {missing}"
    used = set().union(*(metric_names(e) for e in exprs.values()))
    assert {
        "trident_router_breaker_state",
        "trident_router_fallbacks_total",
        "trident_router_errors_total",
        "trident_engine_healthy",
    } <= used


def test_a_wrong_name_is_caught():
    assert metric_names(
        'sum by (model, le) (rate(trident_ttft_bucket{model="x"}[5m])) / on (pod) up'
    ) == {"trident_ttft_bucket", "up"}
    assert metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(a_bucket[$__rate_interval])))"
    ) == {"a_bucket"}
