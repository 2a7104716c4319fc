"""trident k8s and the drain of `trident serve`: the serve command carries the spec's
drain timeout, the serving container (and only it) drains in its preStop hook, the grace
period covers the whole shutdown from the drain's start, the frontend's drain-aware
endpoints are the probes whenever the frontend is in the pod, and every object with these
fields still validates strictly against Kubernetes 1.30."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from builder.k8s import render, workloads
from builder.plan.planner import plan_for_spec
from builder.serve import drain
from builder.spec import DeploymentSpec, load_spec
from tests.k8s.test_access import render as render_cli
from tests.k8s.test_access import write_spec

ROOT = Path(__file__).resolve().parents[2]
H100X8 = ROOT / "deploy/examples/h100x8.yaml"
MULTINODE = ROOT / "deploy/examples/multinode.yaml"
K8S_VERSION = "1.30.0"
HOOK = {"preStop": {"exec": {"command": ["trident", "drain"]}}}


def with_server(spec: DeploymentSpec, **changes) -> DeploymentSpec:
    return dataclasses.replace(spec, server=dataclasses.replace(spec.server, **changes))


def objects(spec: DeploymentSpec, api_keys_secret: str | None = None) -> list[dict]:
    options = render.options(None, None, None, 2.0, api_keys_secret)
    files = render.manifests(spec, plan_for_spec(spec), options)
    return [doc for docs in files.values() for doc in docs]


def pods(docs: list[dict]) -> dict[str, dict]:
    """Pod spec by role: server (StatefulSet), leader and worker (LeaderWorkerSet)."""
    out = {}
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            out["server"] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "LeaderWorkerSet":
            template = doc["spec"]["leaderWorkerTemplate"]
            out["leader"] = template["leaderTemplate"]["spec"]
            out["worker"] = template["workerTemplate"]["spec"]
    return out


def serve_argv(container: dict) -> list[str]:
    command = container["command"]
    if command[:2] == ["sh", "-c"]:  # the LWS leader: `ray start ... && exec trident serve`
        command = shlex.split(command[2].split("exec ", 1)[1])
    assert command[:2] == ["trident", "serve"], command
    return command


def validate_strictly(docs: list[dict]) -> int:
    """Every built-in object, and each LeaderWorkerSet's pod templates as Pods (the CRD
    itself has no schema here); how many were checked."""
    checked = 0
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            for role in ("leaderTemplate", "workerTemplate"):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "x"},
                    "spec": doc["spec"]["leaderWorkerTemplate"][role]["spec"],
                }
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
                checked += 1
        elif doc["apiVersion"] in ("v1", "apps/v1", "policy/v1"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            checked += 1
    return checked


@pytest.fixture(scope="module")
def h100() -> DeploymentSpec:
    return load_spec(H100X8)


@pytest.fixture(scope="module")
def multinode() -> DeploymentSpec:
    return load_spec(MULTINODE)


# ---------------------------------------------------------------------------------------
# The serve command and the hook


@pytest.mark.parametrize("timeout, flag", [(30.0, "30"), (120.0, "120"), (0.0, "0"), (2.5, "2.5")])
def test_the_serve_command_passes_the_drain_timeout(h100, multinode, timeout, flag):
    for spec in (h100, multinode):
        for role, pod in pods(objects(with_server(spec, drain_timeout_s=timeout))).items():
            if role == "worker":
                continue
            argv = serve_argv(pod["containers"][0])
            assert argv[argv.index("--drain-timeout") + 1] == flag
            assert argv.count("--drain-timeout") == 1


def test_the_default_drain_timeout_is_the_spec_default(h100):
    assert h100.server.drain_timeout_s == 30.0
    argv = serve_argv(pods(objects(h100))["server"]["containers"][0])
    assert argv[argv.index("--drain-timeout") + 1] == "30"


def test_only_the_serving_container_drains_in_its_prestop_hook(h100, multinode):
    roles = pods(objects(h100)) | pods(objects(multinode))
    assert set(roles) == {"server", "leader", "worker"}
    for role, pod in roles.items():
        container = pod["containers"][0]
        if role == "worker":  # a Ray worker serves nothing: no hook
            assert container["name"] == "ray-worker" and "lifecycle" not in container
        else:
            assert container["name"] == "triton" and container["lifecycle"] == HOOK
        for init in pod.get("initContainers", ()):
            assert "lifecycle" not in init


# ---------------------------------------------------------------------------------------
# The grace period


@pytest.mark.parametrize(
    "timeout, grace",
    [
        (30.0, 30 + 3 + 5 + 10 + 5),
        (120.0, 120 + 3 + 5 + 10 + 5),
        (0.0, 0 + 3 + 5 + 10 + 5),
        (0.5, 1 + 3 + 5 + 10 + 5),  # a part of a second counts as a whole one
        (600.0, 600 + 3 + 5 + 10 + 5),
    ],
)
def test_the_grace_period_is_the_shutdown_budget_plus_the_margin(h100, multinode, timeout, grace):
    assert (drain.CUTOFF_GRACE_S, drain.TRITON_EXIT_TIMEOUT_S, drain.STOP_GRACE_S) == (3, 5, 10)
    assert workloads.PRESTOP_MARGIN_S == 5
    assert drain.shutdown_budget_s(timeout) + workloads.PRESTOP_MARGIN_S == grace
    for spec in (h100, multinode):
        roles = pods(objects(with_server(spec, drain_timeout_s=timeout)))
        for role, pod in roles.items():
            expected = workloads.WORKER_GRACE_PERIOD_S if role == "worker" else grace
            assert pod["terminationGracePeriodSeconds"] == expected, role


def test_the_grace_period_outlasts_every_step_of_the_shutdown(h100):
    """The budget is the drain, the cutoff, tritonserver's exit and the kill after it,
    each from builder/serve/drain.py; the margin comes on top."""
    pod = pods(objects(h100))["server"]
    steps = 30 + drain.CUTOFF_GRACE_S + drain.TRITON_EXIT_TIMEOUT_S + drain.STOP_GRACE_S
    assert pod["terminationGracePeriodSeconds"] > steps


def test_the_drain_timeout_in_a_spec_file_reaches_the_manifest(tmp_path):
    """End to end: `server.drain_timeout_s` in the YAML, through `trident k8s`."""
    spec = write_spec(tmp_path, MULTINODE, server={"drain_timeout_s": 120})
    docs = render_cli(spec, tmp_path / "out")
    roles = pods(docs)
    leader = roles["leader"]
    argv = serve_argv(leader["containers"][0])
    assert argv[argv.index("--drain-timeout") + 1] == "120"
    assert leader["terminationGracePeriodSeconds"] == 120 + 3 + 5 + 10 + 5
    assert roles["worker"]["terminationGracePeriodSeconds"] == workloads.WORKER_GRACE_PERIOD_S
    assert validate_strictly(docs) >= 5


# ---------------------------------------------------------------------------------------
# Probes


def probes(container: dict) -> dict[str, tuple[str, str]]:
    return {
        kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
    }


@pytest.mark.parametrize("keys", [None, "openai-keys"])
def test_with_the_frontend_the_probes_are_its_drain_aware_endpoints(h100, multinode, keys):
    for spec in (h100, multinode):
        docs = objects(with_server(spec, openai_port=9000), api_keys_secret=keys)
        for role, pod in pods(docs).items():
            if role == "worker":
                assert "readinessProbe" not in pod["containers"][0]
                continue
            assert probes(pod["containers"][0]) == {
                "startupProbe": ("/health", "openai"),
                "readinessProbe": ("/health", "openai"),
                "livenessProbe": ("/health/live", "openai"),
            }
        assert validate_strictly(docs) >= 5


def test_without_the_frontend_the_probes_are_tritons(h100, multinode):
    for spec in (h100, multinode):
        for role, pod in pods(objects(with_server(spec, openai_port=None))).items():
            if role == "worker":
                continue
            assert probes(pod["containers"][0]) == {
                "startupProbe": ("/v2/health/ready", "http"),
                "readinessProbe": ("/v2/health/ready", "http"),
                "livenessProbe": ("/v2/health/live", "http"),
            }


# ---------------------------------------------------------------------------------------
# Validation covers the new fields


@pytest.mark.parametrize("timeout", [0.0, 30.0, 120.0, 600.0])
def test_the_manifests_validate_strictly_with_any_drain_timeout(h100, multinode, timeout):
    for spec in (h100, multinode):
        docs = objects(with_server(spec, drain_timeout_s=timeout, openai_port=9000))
        assert validate_strictly(docs) >= 5


def test_strict_validation_sees_the_hook_and_the_grace_period(h100):
    """The schema checks the new fields themselves: a misspelt hook or a grace period
    that is not an integer is refused, so the validation above covers them."""
    statefulset = next(d for d in objects(h100) if d["kind"] == "StatefulSet")
    validate_strictly([statefulset])
    grace = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    bad_hook = yaml.safe_load(yaml.safe_dump(statefulset))
    container = bad_hook["spec"]["template"]["spec"]["containers"][0]
    container["lifecycle"] = {"preStopp": HOOK["preStop"]}
    bad_grace = yaml.safe_load(yaml.safe_dump(statefulset))
    bad_grace["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = str(grace)
    for bad in (bad_hook, bad_grace):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate_strictly([bad])


# ---------------------------------------------------------------------------------------
# Rollout


def test_at_most_one_pod_of_a_workload_is_disrupted_at_a_time(h100, multinode):
    for spec in (h100, multinode):
        docs = objects(spec)
        budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
        workloads_ = [d for d in docs if d["kind"] in ("StatefulSet", "LeaderWorkerSet")]
        assert len(budgets) == len(workloads_) >= 1
        for budget in budgets:
            assert budget["spec"]["maxUnavailable"] == 1
