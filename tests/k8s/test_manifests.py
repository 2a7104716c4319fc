"""trident k8s / trident monitoring: schema-valid objects, resources equal to the plan,
no secret values, determinism, multi-node LeaderWorkerSet, known metric names only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from builder.cli.main import main
from builder.k8s import render
from builder.plan.planner import plan_for_spec
from builder.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
H100X8 = ROOT / "deploy/examples/h100x8.yaml"
MULTINODE = ROOT / "deploy/examples/multinode.yaml"
K8S_VERSION = "1.30.0"
CRDS = {
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}


def _render(spec_file: Path, tmp_path: Path, *extra: str, name: str = "out") -> Path:
    out = tmp_path / name
    code = main(["k8s", "--spec", str(spec_file), "--out", str(out), *extra])
    assert code == 0
    return out


def _objects(out: Path) -> list[dict]:
    docs = []
    for path in sorted(out.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> Path:
    return _render(
        H100X8, tmp_path_factory.mktemp("k8s"), "--namespace", "llm", "--cache-secret", "s3-creds"
    )


def test_builtin_objects_validate_strictly_against_kubernetes_1_30(h100, tmp_path):
    multi = _render(MULTINODE, tmp_path)
    checked = 0
    for doc in _objects(h100) + _objects(multi):
        if doc["kind"] in CRDS:
            assert doc["apiVersion"] == CRDS[doc["kind"]]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 8


def test_leaderworkerset_pod_templates_validate(tmp_path):
    lws = next(d for d in _objects(_render(MULTINODE, tmp_path)) if d["kind"] == "LeaderWorkerSet")
    for role in ("leaderTemplate", "workerTemplate"):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x"},
            "spec": lws["spec"]["leaderWorkerTemplate"][role]["spec"],
        }
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_gpu_and_mig_requests_equal_the_plan(h100):
    plan = plan_for_spec(load_spec(H100X8))
    expected: dict[str, int] = {}
    for model in plan.models.values():
        for resource, count in model.kubernetes_resources.items():
            expected[resource] = expected.get(resource, 0) + count * len(model.instances)
    assert expected == {"nvidia.com/gpu": 6, "nvidia.com/mig-3g.40gb": 2}
    server = next(d for d in _objects(h100) if d["kind"] == "StatefulSet")
    pod = server["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"] == {k: str(v) for k, v in expected.items()}
    assert resources["requests"] == resources["limits"]
    assert pod["nodeSelector"] == {"nvidia.com/mig.config": "trident-h100x8"}


def test_mig_selector_names_the_layout_of_trident_mig_plan(h100, tmp_path):
    assert main(["mig", "plan", "--spec", str(H100X8), "--out", str(tmp_path / "m.yaml")]) == 0
    configs = yaml.safe_load((tmp_path / "m.yaml").read_text())["mig-configs"]
    server = next(d for d in _objects(h100) if d["kind"] == "StatefulSet")
    assert server["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/mig.config"] in configs


def test_pod_shape(h100):
    objects = _objects(h100)
    pod = next(d for d in objects if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    assert triton["command"][:2] == ["trident", "serve"]
    assert pod["initContainers"][0]["command"][:2] == ["trident", "repo"]
    assert pod["initContainers"][0]["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert "envFrom" not in triton  # only the init container talks to S3
    # The example serves OpenAI clients (server.openai_port): the frontend in the pod,
    # on every address, and its drain-aware endpoints as the probes.
    assert load_spec(H100X8).server.openai_port == 9000
    argv = triton["command"]
    assert argv[argv.index("--openai-port") + 1] == "9000"
    assert argv[argv.index("--openai-host") + 1] == "0.0.0.0"
    assert {"name": "openai", "containerPort": 9000, "protocol": "TCP"} in triton["ports"]
    assert triton["readinessProbe"]["httpGet"] == {"path": "/health", "port": "openai"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "openai"}
    startup = triton["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert pod["terminationGracePeriodSeconds"] > 5  # Triton's --exit-timeout-secs
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory"
    service = next(d for d in objects if d["kind"] == "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "grpc", "metrics", "openai"]
    assert {d["kind"] for d in objects} >= {
        "PodDisruptionBudget",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
    }
    assert all(
        d["metadata"].get("namespace") == "llm" for d in objects if d["kind"] != "Kustomization"
    )
    dashboard = next(d for d in objects if d["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    kustomization = yaml.safe_load((h100 / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in h100.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_no_secret_value_in_any_file(tmp_path, monkeypatch):
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIAK8STESTKEY0000001",
        "AWS_SECRET_ACCESS_KEY": "k8s-test-secret/value+0123456789abcdef",
        "AWS_SESSION_TOKEN": "k8s-test-session-token-0123456789",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    for spec in (H100X8, MULTINODE):
        out = _render(spec, tmp_path, "--cache-secret", "s3-creds", name=spec.stem)
        for path in out.rglob("*"):
            if path.is_file():
                text = path.read_text()
                for value in secrets.values():
                    assert value not in text, path


def test_rerender_is_byte_identical(tmp_path):
    first = _render(H100X8, tmp_path, name="a")
    second = _render(H100X8, tmp_path, name="b")
    again = _render(H100X8, tmp_path, name="a")

    def files(d):
        return {p.name: p.read_bytes() for p in sorted(d.iterdir())}

    assert files(first) == files(second) == files(again)


def test_multinode_is_a_leaderworkerset_of_size_2(tmp_path):
    objects = _objects(_render(MULTINODE, tmp_path))
    lws = [d for d in objects if d["kind"] == "LeaderWorkerSet"]
    assert len(lws) == 1 and not [d for d in objects if d["kind"] == "StatefulSet"]
    template = lws[0]["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    for role in ("leaderTemplate", "workerTemplate"):
        limits = template[role]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "8"}


def test_multinode_plan(capsys):
    plan = plan_for_spec(load_spec(MULTINODE))
    model = plan.model("llama405b")
    assert (model.tp, model.pp, model.nodes) == (8, 2, 2)
    assert main(["plan", "--spec", str(MULTINODE)]) == 0
    assert "8×2" in capsys.readouterr().out


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "keep.txt").write_text("x")
    cases = [
        ["--namespace", "Bad_NS"],
        ["--image", "a b"],
        ["--image", "img:"],  # issue 34: both were accepted (a tag is not empty,
        ["--image", "img@@x"],  # a digest is algorithm:hex)
        ["--cache-secret", "No!"],
    ]
    for extra in cases:
        assert main(["k8s", "--spec", str(H100X8), "--out", str(tmp_path / "o"), *extra]) == 2
    assert main(["k8s", "--spec", str(H100X8), "--out", str(tmp_path / "theirs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(cases) + 1 and all(line.startswith("error: ") for line in err)
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------
# Metric names: every name a panel or an alert uses is one trident exports.


def _exported_metrics() -> set[str]:
    names = set()
    for source in ("trident_common/triton_io.py", "bls/router_metrics.py"):
        names |= set(re.findall(r'"(trident_[a-z_]+)"', (ROOT / source).read_text()))
    assert {"trident_router_breaker_state", "trident_time_to_first_token_seconds"} <= names
    return names


def _used_metrics(expressions: list[str]) -> set[str]:
    used = set()
    for expr in expressions:
        for name in re.findall(r"\btrident_[a-z_]+", expr):
            used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return used


def test_panels_and_alerts_use_only_exported_metrics(tmp_path):
    assert main(["monitoring", "--spec", str(H100X8), "--out", str(tmp_path / "m")]) == 0
    dashboard = json.loads((tmp_path / "m" / "trident-dashboard.json").read_text())
    rules = yaml.safe_load((tmp_path / "m" / "trident-alerts.yaml").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    used = _used_metrics(exprs + [r["expr"] for r in alerts])
    assert used and used <= _exported_metrics(), used - _exported_metrics()
    for needed in (
        "trident_router_breaker_state",
        "trident_router_errors_total",
        "trident_time_to_first_token_seconds",
        "trident_generation_tokens_total",
        "trident_router_requests_total",
        "trident_router_fallbacks_total",
        "trident_requests_in_flight",
        "trident_inter_token_latency_seconds",
    ):
        assert needed in used
    assert any("== 2" in r["expr"] for r in alerts)


def test_unknown_metric_name_is_caught():
    assert _used_metrics(["rate(trident_made_up_total[5m])"]) - _exported_metrics()


def test_render_files_in_memory_match_the_directory(h100):
    spec = load_spec(H100X8)
    files = render.render_files(
        spec, plan_for_spec(spec), render.options("llm", None, "s3-creds", 2.0)
    )
    assert files == {name: (h100 / name).read_bytes() for name in files}
