"""trident k8s: the OpenAI frontend as the pods' public face (with keys, Triton's ports
stay inside the pod), the Redis password as a Secret reference, and paths that cannot
exist in a pod refused. Every object validates against Kubernetes' own schemas, and
every rendered `trident serve` command parses with the real command line."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from builder.cli.serve import serve as serve_command
from tests.helpers import hostile_specs as hs

ROOT = Path(__file__).resolve().parents[2]
H100X8 = ROOT / "deploy/examples/h100x8.yaml"
MULTINODE = ROOT / "deploy/examples/multinode.yaml"
TOPOLOGY = ROOT / "tests/fixtures/topo/hgx-h100x8.txt"
K8S_VERSION = "1.30.0"
PASSWORD = "redis-Pa55word-never-rendered"


def write_spec(folder: Path, source: Path, **changes) -> Path:
    data = yaml.safe_load(source.read_text())
    if data["hardware"].get("topology"):
        shutil.copy(TOPOLOGY, folder / "topo.txt")
        data["hardware"]["topology"] = "topo.txt"
    for key, value in changes.items():
        if isinstance(value, dict):  # merged into the example's; None removes a key
            merged = {**data.get(key, {}), **value}
            data[key] = {k: v for k, v in merged.items() if v is not None}
        else:
            data[key] = value
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def render(spec: Path, out: Path, *extra: str) -> list[dict]:
    code, stderr = hs.call_cli(["k8s", "--spec", str(spec), "--out", str(out), *extra])
    assert code == 0, stderr
    return [
        d
        for p in sorted(out.glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d is not None
    ]


def refused(spec: Path, out: Path, *extra: str) -> str:
    code, stderr = hs.call_cli(["k8s", "--spec", str(spec), "--out", str(out), *extra])
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert not out.exists()
    return lines[0]


def kind(objects: list[dict], name: str) -> dict:
    return next(d for d in objects if d["kind"] == name)


def serve_args(command: list[str]) -> list[str]:
    """The arguments after `trident serve` (also inside the LWS leader's `sh -c`)."""
    if command[:2] == ["sh", "-c"]:
        command = shlex.split(command[2].split("exec ", 1)[1])
    assert command[:2] == ["trident", "serve"], command
    return command[2:]


def parses(args: list[str]) -> dict:
    """The real `trident serve` accepts every flag the manifest passes."""
    with serve_command.make_context("serve", list(args)) as ctx:
        return ctx.params


def validate(objects: list[dict]) -> None:
    for doc in objects:
        if doc["kind"] == "LeaderWorkerSet":
            for role in ("leaderTemplate", "workerTemplate"):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "x"},
                    "spec": doc["spec"]["leaderWorkerTemplate"][role]["spec"],
                }
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        elif doc["apiVersion"] in ("v1", "apps/v1", "policy/v1"):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_openai_frontend_is_deployed_when_the_spec_names_its_port(tmp_path):
    spec = write_spec(tmp_path, H100X8, server={"openai_port": 9000})
    objects = render(spec, tmp_path / "out")
    validate(objects)
    triton = kind(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    params = parses(serve_args(triton["command"]))
    assert params["openai_port"] == 9000 and params["openai_host"] == "0.0.0.0"
    assert params["expose"] == ("router",) and params["api_keys_file"] is None
    # No keys: Triton's own ports stay reachable, as without the frontend.
    assert params["triton_host"] == "0.0.0.0" and params["metrics_host"] == "0.0.0.0"
    service = kind(objects, "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "grpc", "metrics", "openai"]


def test_with_keys_only_the_frontend_and_metrics_leave_the_pod(tmp_path):
    spec = write_spec(tmp_path, H100X8, server={"openai_port": 9000})
    objects = render(spec, tmp_path / "out", "--api-keys-secret", "openai-keys")
    validate(objects)
    pod = kind(objects, "StatefulSet")["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    params = parses(serve_args(triton["command"]))
    assert params["triton_host"] == "127.0.0.1" and not params["allow_open_triton"]
    assert params["api_keys_file"] == "/etc/trident-keys/api-keys"
    for service in (d for d in objects if d["kind"] == "Service"):
        assert [p["name"] for p in service["spec"]["ports"]] == ["openai", "metrics"]
    assert [p["name"] for p in triton["ports"]] == ["openai", "metrics"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert triton[probe]["httpGet"]["port"] == "openai"  # Triton is on loopback
    keys = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert keys["secret"]["secretName"] == "openai-keys"
    assert {"name": "api-keys", "mountPath": "/etc/trident-keys", "readOnly": True} in triton[
        "volumeMounts"
    ]


def test_with_keys_a_multinode_leader_serves_its_model_through_its_own_frontend(tmp_path):
    spec = write_spec(tmp_path, MULTINODE, server={"openai_port": 9000})
    objects = render(spec, tmp_path / "out", "--api-keys-secret", "openai-keys")
    validate(objects)
    lws = kind(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    params = parses(serve_args(leader["command"]))
    assert params["expose"] == ("llama405b",) and params["triton_host"] == "127.0.0.1"
    assert params["api_keys_file"] == "/etc/trident-keys/api-keys"
    worker = lws["workerTemplate"]["spec"]
    assert "api-keys" not in {v["name"] for v in worker["volumes"]}
    for service in (d for d in objects if d["kind"] == "Service"):
        assert [p["name"] for p in service["spec"]["ports"]] == ["openai", "metrics"]


def test_every_rendered_serve_command_parses(tmp_path):
    for i, source in enumerate((H100X8, MULTINODE)):
        folder = tmp_path / str(i)
        folder.mkdir()
        objects = render(write_spec(folder, source), folder / "out")
        for doc in objects:
            template = doc.get("spec", {}).get("template") or doc.get("spec", {}).get(
                "leaderWorkerTemplate", {}
            ).get("leaderTemplate")
            if template:
                parses(serve_args(template["spec"]["containers"][0]["command"]))


def test_api_keys_need_the_frontend(tmp_path):
    spec = write_spec(tmp_path, H100X8, server={"openai_port": None})
    assert "server.openai_port" in refused(spec, tmp_path / "out", "--api-keys-secret", "k")


def tenants(**password) -> dict:
    return {"redis": "redis://redis.llm:6379/0", "default": {"requests_per_minute": 60}, **password}


def test_password_env_is_a_secret_key_ref_never_a_value(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_PASSWORD", PASSWORD)
    spec = write_spec(tmp_path, H100X8, tenants=tenants(password_env="REDIS_PASSWORD"))
    objects = render(spec, tmp_path / "out")
    validate(objects)
    triton = kind(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert {
        "name": "REDIS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "trident-h100x8-redis", "key": "password"}},
    } in triton["env"]
    for path in (tmp_path / "out").iterdir():
        assert PASSWORD not in path.read_text()


def test_password_file_is_the_secret_mounted_at_that_path(tmp_path):
    spec = write_spec(
        tmp_path, H100X8, tenants=tenants(password_file="/run/secrets/redis-password")
    )
    objects = render(spec, tmp_path / "out")
    validate(objects)
    pod = kind(objects, "StatefulSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "redis-password")
    assert volume["secret"] == {
        "secretName": "trident-h100x8-redis",
        "items": [{"key": "password", "path": "password"}],
    }
    assert {
        "name": "redis-password",
        "mountPath": "/run/secrets/redis-password",
        "subPath": "password",
        "readOnly": True,
    } in pod["containers"][0]["volumeMounts"]


def test_a_relative_password_file_is_refused(tmp_path):
    spec = write_spec(tmp_path, H100X8, tenants=tenants(password_file="secrets/redis"))
    assert "tenants.password_file" in refused(spec, tmp_path / "out")


@pytest.mark.parametrize(
    "model", ["./models/llama", "../llama", "~/llama", "models/meta/llama", "local-folder"]
)
def test_a_relative_model_path_is_refused(tmp_path, model):
    (tmp_path / "local-folder").mkdir()
    data = yaml.safe_load(MULTINODE.read_text())
    data["models"][0]["model"] = model
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    line = refused(spec, tmp_path / "out")
    assert "models[0].model" in line and "relative path" in line


def test_a_hugging_face_id_is_accepted(tmp_path):
    data = yaml.safe_load(MULTINODE.read_text())
    assert data["models"][0]["model"] == "meta-llama/Llama-3.1-405B-Instruct"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    render(spec, tmp_path / "out")


@pytest.mark.parametrize(
    "path, is_refused", [("./adapters/support", True), ("/srv/lora/support", False)]
)
def test_a_relative_adapter_path_is_refused(tmp_path, path, is_refused):
    data = yaml.safe_load(MULTINODE.read_text())
    data["models"][0]["adapters"] = {"support": path}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    if is_refused:
        assert "models[0].adapters.support" in refused(spec, tmp_path / "out")
    else:
        render(spec, tmp_path / "out")
