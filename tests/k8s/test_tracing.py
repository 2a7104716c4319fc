"""trident k8s --otlp-traces-endpoint: every serving container (the StatefulSet's and a
LeaderWorkerSet's leader) gets the standard OpenTelemetry environment that `trident serve`
reads, with resource attributes naming its pod, workload, deployment and spec; Ray
workers get none; the objects still validate strictly; a bad endpoint is refused in one
line with nothing written."""

from __future__ import annotations

import hashlib
import re

import pytest

from builder.serve.tracing import Tracing
from tests.k8s.test_access import H100X8, MULTINODE, refused, render, validate, write_spec

ENDPOINT = "http://otel-collector.observability:4318/v1/traces"


def containers(objects: list[dict]) -> dict[str, dict]:
    """The containers by role: server (StatefulSet), leader, worker (LeaderWorkerSet)."""
    out = {}
    for doc in objects:
        if doc["kind"] == "StatefulSet":
            out["server"] = doc["spec"]["template"]["spec"]["containers"][0]
        elif doc["kind"] == "LeaderWorkerSet":
            template = doc["spec"]["leaderWorkerTemplate"]
            out["leader"] = template["leaderTemplate"]["spec"]["containers"][0]
            out["worker"] = template["workerTemplate"]["spec"]["containers"][0]
    return out


def as_the_kubelet_sets_it(container: dict, pod: str, namespace: str) -> dict[str, str]:
    """The container's environment as the process sees it: fieldRefs filled in, $(VAR)
    of a variable defined earlier expanded (Kubernetes' dependent environment variables)."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), item["value"])
    return env


@pytest.mark.parametrize("example", [H100X8, MULTINODE], ids=["h100x8", "multinode"])
def test_serving_pods_send_traces_saying_which_pod_and_spec_served(tmp_path, example):
    spec = write_spec(tmp_path, example)
    objects = render(spec, tmp_path / "out", "--otlp-traces-endpoint", ENDPOINT)
    validate(objects)
    by_role = containers(objects)
    serving = [role for role in ("server", "leader") if role in by_role]
    assert serving, by_role.keys()
    digest = hashlib.sha256(spec.read_bytes()).hexdigest()[:16]
    for role in serving:
        env = as_the_kubelet_sets_it(by_role[role], f"{role}-0", "llm")
        tracing = Tracing.from_env(env)  # what `trident serve` in the pod makes of it
        assert tracing is not None and tracing.endpoint == ENDPOINT
        assert tracing.resource["k8s.pod.name"] == f"{role}-0"
        assert tracing.resource["k8s.namespace.name"] == "llm"
        assert tracing.resource["trident.spec.sha256"] == digest
        assert tracing.resource["trident.workload"].startswith("trident-")
        assert tracing.resource["trident.deployment"]
    if "worker" in by_role:  # a Ray worker serves nothing
        assert not any(e["name"].startswith("OTEL_") for e in by_role["worker"]["env"])


def test_without_the_flag_no_pod_traces(tmp_path):
    objects = render(write_spec(tmp_path, MULTINODE), tmp_path / "out")
    for container in containers(objects).values():
        assert not any(e["name"].startswith(("OTEL_", "TRIDENT_POD")) for e in container["env"])


@pytest.mark.parametrize("url", ["otel-collector:4318", "grpc://collector:4317", ""])
def test_a_bad_endpoint_is_refused_in_one_line(tmp_path, url):
    line = refused(write_spec(tmp_path, H100X8), tmp_path / "out", "--otlp-traces-endpoint", url)
    assert line.startswith("error: --otlp-traces-endpoint: ")
