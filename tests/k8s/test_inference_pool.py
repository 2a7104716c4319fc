"""trident k8s --inference-pool: per serving workload an InferencePool (Gateway API
Inference Extension v1, GA) valid against the upstream CRD kept in tests/k8s/crds/ (its
openAPIV3Schema with jsonschema, unknown fields refused as a strict apply would, and its
CEL rules), whose selector matches exactly the pods that serve and whose target port is
their OpenAI frontend's; the endpoint picker of GIE v1.5.0 with its Service, RBAC and a
configuration that reads trident's metric names off the pod's /metrics; every core
object strictly valid against Kubernetes 1.30; bad input refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from builder.k8s import names, pool
from builder.serve.openai import pod_metrics
from tests.helpers import hostile_specs as hs
from tests.k8s.test_access import refused, render, write_spec

ROOT = Path(__file__).resolve().parents[2]
H100X8 = ROOT / "deploy/examples/h100x8.yaml"
MULTINODE = ROOT / "deploy/examples/multinode.yaml"
CRD_FILE = Path(__file__).resolve().parent / "crds/inference.networking.k8s.io_inferencepools.yaml"
K8S_VERSION = "1.30.0"
OPENAI_PORT = 9000  # both examples' server.openai_port: the pool's target port
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
CUSTOM_KINDS = {"InferencePool", "LeaderWorkerSet", "PodMonitor", "PrometheusRule", "Kustomization"}

# What GIE v1.5.0 accepts, read in its source (commit df9f8909):
# apix/config/v1alpha1/endpointpickerconfig_types.go (decoded with EnableStrict):
CONFIG_FIELDS = {
    "apiVersion",
    "kind",
    "featureGates",
    "plugins",
    "schedulingProfiles",
    "saturationDetector",
    "dataLayer",
    "flowControl",
    "parser",
}
# cmd/epp/runner/runner.go's fwkplugin.Register calls (the ones a config may name here):
REGISTERED = {
    "prefix-cache-scorer",
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
    "single-profile-handler",
    "kv-cache-utilization-scorer",
    "queue-scorer",
    "running-requests-size-scorer",
    "lora-affinity-scorer",
    "token-load-scorer",
    "approx-prefix-cache-producer",
    "metrics-data-source",
    "core-metrics-extractor",
    "utilization-detector",
    "openai-parser",
}
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go:
EXTRACTOR_FIELDS = {"engineLabelKey", "defaultEngine", "engineConfigs"}
ENGINE_CONFIG_FIELDS = {
    "name",
    "queuedRequestsSpec",
    "runningRequestsSpec",
    "kvUsageSpec",
    "loraSpec",
    "cacheInfoSpec",
    "cacheBlockSizeLabelName",
    "cacheNumBlocksLabelName",
    "cacheBlockSizeSpec",
    "cacheNumBlocksSpec",
}
# .../requestcontrol/dataproducer/approximateprefix/types.go (the scorer's parameters
# go to this producer: pkg/epp/config/loader/configloader.go):
PREFIX_FIELDS = {
    "autoTune",
    "blockSizeTokens",
    "maxPrefixBlocksToMatch",
    "maxPrefixTokensToMatch",
    "lruCapacityPerServer",
}
# .../datalayer/source/metrics/datasource.go:
SOURCE_FIELDS = {"scheme", "path", "insecureSkipVerify"}


def objects(tmp_path: Path, source: Path, *extra: str, **changes) -> list[dict]:
    spec = write_spec(tmp_path, source, **changes)
    return render(spec, tmp_path / "out", "--inference-pool", *extra)


def kinds(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = kinds(docs, kind)
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> list[dict]:
    # The example file itself, as `trident k8s --spec deploy/examples/h100x8.yaml` reads it.
    out = tmp_path_factory.mktemp("pool") / "out"
    return render(H100X8, out, "--inference-pool", "--namespace", "llm")


@pytest.fixture(scope="module")
def multinode(tmp_path_factory) -> list[dict]:
    return render(MULTINODE, tmp_path_factory.mktemp("pool") / "out", "--inference-pool")


# ---------------------------------------------------------------------------------------
# The upstream CRD: schema, defaults, CEL


def _crd() -> dict:
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == (
        names.GIE_VERSION
    )
    return crd


def _version_schema(version: str = "v1") -> dict:
    crd = _crd()
    assert crd["spec"]["group"] + "/" + version == pool.POOL_API
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"][
        "openAPIV3Schema"
    ]


def _strict(schema: dict) -> dict:
    """Unknown fields refused (the API server prunes them silently; a strict server-side
    apply refuses them): every object schema with properties and no additionalProperties
    gets additionalProperties: false."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key in ("properties",):
            for child in node.get(key, {}).values():
                walk(child)
        walk(node.get("items"))
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])

    walk(schema)
    return schema


def _defaulted(value, schema: dict):
    """The object as the API server stores it: the schema's defaults applied (before
    the CEL rules run, which see them: an endpointPickerRef without kind is a Service)."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for key, sub in schema["properties"].items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = _defaulted(out[key], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [_defaulted(v, schema["items"]) for v in value]
    return value


def _rules(schema: dict, path: tuple = ()) -> list[tuple[tuple, str]]:
    found = [(path, r["rule"]) for r in schema.get("x-kubernetes-validations", [])]
    for key, sub in schema.get("properties", {}).items():
        found += _rules(sub, (*path, key))
    if "items" in schema:
        found += _rules(schema["items"], (*path, "[]"))
    return found


def _endpoint_picker_port(ref: dict) -> bool:
    return ref["kind"] != "Service" or "port" in ref


def _unique_port_numbers(ports: list) -> bool:
    return all(sum(q["number"] == p["number"] for q in ports) == 1 for p in ports)


# The CEL rules of the CRD, each as Python. A CRD update with a rule not here fails
# test_every_cel_rule_of_the_crd_is_checked until it is added.
CEL = {
    (("spec", "endpointPickerRef"), "self.kind != 'Service' || has(self.port)"): (
        _endpoint_picker_port
    ),
    (
        ("spec", "targetPorts"),
        "self.all(p1, self.exists_one(p2, p1.number==p2.number))",
    ): _unique_port_numbers,
}


def _at(value, path: tuple):
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def validate_custom(doc: dict) -> None:
    """Raises when `doc` is not a valid InferencePool of the kept CRD."""
    assert doc["apiVersion"] == pool.POOL_API and doc["kind"] == "InferencePool"
    schema = _version_schema()
    stored = _defaulted(doc, schema)
    jsonschema.Draft7Validator(_strict(schema)).validate(stored)
    name = doc["metadata"]["name"]
    assert len(name) <= 253 and names._SUBDOMAIN.fullmatch(name), name
    for (path, _rule), check in CEL.items():
        value = _at(stored, path)
        if value is not None and not check(value):
            raise jsonschema.ValidationError(f"{'.'.join(path)}: CEL {_rule}")


def validate_core(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-epp"):
        validate_picker_config(yaml.safe_load(doc["data"][pool.CONFIG_KEY]))


def test_every_cel_rule_of_the_crd_is_checked():
    assert {(p, r) for p, r in _rules(_version_schema())} == set(CEL)


def test_the_crd_file_is_the_upstream_one_with_its_source():
    header = CRD_FILE.read_text().split("apiVersion:", 1)[0]
    assert "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849" in header
    assert "Apache License, Version 2.0" in header and "v1.5.0" in header


@pytest.mark.parametrize("example", ["h100", "multinode"])
def test_every_object_validates(example, request):
    docs = request.getfixturevalue(example)
    assert kinds(docs, "InferencePool")
    checked = 0
    for doc in docs:
        if doc["kind"] == "InferencePool":
            validate_custom(doc)
        elif doc["kind"] == "LeaderWorkerSet":
            for role in ("leaderTemplate", "workerTemplate"):
                template = doc["spec"]["leaderWorkerTemplate"][role]
                validate_core(
                    {"apiVersion": "v1", "kind": "Pod", **template, "metadata": {"name": "x"}}
                )
        elif doc["kind"] not in CUSTOM_KINDS:
            validate_core(doc)
            checked += 1
    # ServiceAccount, Role, RoleBinding, ConfigMap, Deployment, Service of the picker
    assert {d["kind"] for d in docs} >= {"ServiceAccount", "Role", "RoleBinding", "Deployment"}
    assert checked >= 10


def _pool(**spec_changes) -> dict:
    base = {
        "apiVersion": pool.POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "targetPorts": [{"number": 9000}],
            "endpointPickerRef": {"name": "p-epp", "port": {"number": 9002}},
        },
    }
    base["spec"].update(spec_changes)
    return base


@pytest.mark.parametrize(
    "bad",
    [
        {"endpointPickerRef": {"name": "p-epp"}},  # kind defaults to Service: port needed
        {"endpointPickerRef": {"kind": "Service", "name": "p-epp"}},
        {"targetPorts": [{"number": 9000}, {"number": 9000}]},
        {"targetPorts": []},
        {"endpointPickerRef": {"name": "p-epp", "port": {"number": 9002}, "failureMode": "x"}},
        {"selector": {"matchLabels": {}}},
        {"selector": {"matchLabels": {"a": "b"}, "matchExpressions": []}},  # unknown field
        {"extra": 1},
    ],
)
def test_the_validator_refuses_what_the_api_server_would(bad):
    validate_custom(_pool())
    validate_custom(_pool(endpointPickerRef={"kind": "Other", "name": "x", "group": "g.io"}))
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(_pool(**bad))


# ---------------------------------------------------------------------------------------
# The pool: its pods, its port, its picker


def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _serving_pods(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(labels as the pod gets them, pod spec) of every pod template, the LWS ones with
    the worker-index label its controller adds (0: the leader)."""
    pods = []
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "Deployment"):
            template = doc["spec"]["template"]
            pods.append((template["metadata"]["labels"], template["spec"]))
        elif doc["kind"] == "LeaderWorkerSet":
            lws = doc["spec"]["leaderWorkerTemplate"]
            for role, index in (("leaderTemplate", "0"), ("workerTemplate", "1")):
                labels = {**lws[role]["metadata"]["labels"], LWS_WORKER_INDEX: index}
                pods.append((labels, lws[role]["spec"]))
    return pods


def _openai_port(pod: dict) -> int | None:
    for container in pod["containers"]:
        for port in container.get("ports", []):
            if port["name"] == "openai":
                return port["containerPort"]
    return None


@pytest.mark.parametrize("example", ["h100", "multinode"])
def test_the_selector_matches_exactly_the_serving_pods_on_their_openai_port(example, request):
    docs = request.getfixturevalue(example)
    infpool = one(docs, "InferencePool")
    selector = infpool["spec"]["selector"]["matchLabels"]
    pods = _serving_pods(docs)
    members = [(labels, pod) for labels, pod in pods if _labels_match(selector, labels)]
    assert len(members) == 1  # the server, or the leader: not a worker, not the picker
    labels, pod = members[0]
    assert _openai_port(pod) == OPENAI_PORT
    assert infpool["spec"]["targetPorts"] == [{"number": OPENAI_PORT}]
    assert labels[names.ENGINE_TYPE_LABEL] == names.ENGINE_TYPE
    others = [other for other, _ in pods if other is not labels]
    assert len(others) == len(pods) - 1 >= 1  # the picker; the LWS worker too
    assert all(names.ENGINE_TYPE_LABEL not in other for other in others)
    if example == "multinode":
        assert labels[LWS_WORKER_INDEX] == "0"


@pytest.mark.parametrize("source", [H100X8, MULTINODE])
def test_the_examples_as_shipped_set_the_frontends_port(source):
    """Both examples serve OpenAI clients: the pool's target port is in the file, so
    `trident k8s --inference-pool --spec deploy/examples/...` renders as it is (the
    fixtures above render the files themselves)."""
    assert yaml.safe_load(source.read_text())["server"]["openai_port"] == OPENAI_PORT


def test_without_the_flag_nothing_changes(tmp_path):
    spec = write_spec(tmp_path, H100X8)
    docs = render(spec, tmp_path / "out")
    assert not {"InferencePool", "Role", "Deployment"} & {d["kind"] for d in docs}
    for labels, _pod in _serving_pods(docs):
        assert names.ENGINE_TYPE_LABEL not in labels
    assert not (tmp_path / "out" / "inferencepool.yaml").exists()


@pytest.mark.parametrize("example", ["h100", "multinode"])
def test_the_picker_is_wired_to_its_pool(example, request):
    docs = request.getfixturevalue(example)
    infpool = one(docs, "InferencePool")
    ref = infpool["spec"]["endpointPickerRef"]
    assert ref["failureMode"] == "FailOpen" and ref["kind"] == "Service"
    service = next(d for d in kinds(docs, "Service") if d["metadata"]["name"] == ref["name"])
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"grpc-ext-proc": 9002, "grpc-health": 9003, "http-metrics": 9090}
    assert ref["port"]["number"] == ports["grpc-ext-proc"]
    deployment = next(d for d in kinds(docs, "Deployment") if d["metadata"]["name"] == ref["name"])
    template = deployment["spec"]["template"]
    assert _labels_match(service["spec"]["selector"], template["metadata"]["labels"])
    assert _labels_match(
        deployment["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]
    )
    epp = template["spec"]["containers"][0]
    assert epp["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    args = epp["args"]
    assert args[args.index("--pool-name") + 1] == infpool["metadata"]["name"]
    assert args[args.index("--pool-group") + 1] == "inference.networking.k8s.io"
    assert not [a for a in args if a.endswith("-metric") or "-metric=" in a]  # refused by v1.5.0
    container_ports = {p["name"]: p["containerPort"] for p in epp["ports"]}
    assert set(container_ports.values()) == set(ports.values())
    assert "metrics" not in container_ports  # trident's PodMonitor scrapes that name
    assert epp["readinessProbe"]["grpc"]["port"] == 9003
    # The config file is the ConfigMap's key, mounted where --config-file says.
    config_file = Path(args[args.index("--config-file") + 1])
    mount = next(m for m in epp["volumeMounts"] if m["mountPath"] == str(config_file.parent))
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = next(
        d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"] == volume["configMap"]["name"]
    )
    assert config_file.name in configmap["data"]
    # RBAC: its ServiceAccount, bound to a Role with what v1.5.0 watches.
    account = template["spec"]["serviceAccountName"]
    assert account in [d["metadata"]["name"] for d in kinds(docs, "ServiceAccount")]
    binding = one(docs, "RoleBinding")
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account,
            **({"namespace": "llm"} if example == "h100" else {}),
        }
    ]
    role = next(
        d for d in kinds(docs, "Role") if d["metadata"]["name"] == binding["roleRef"]["name"]
    )
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == {
        ("", "pods"): {"get", "list", "watch"},
        ("inference.networking.k8s.io", "inferencepools"): {"get", "list", "watch"},
        ("inference.networking.x-k8s.io", "inferenceobjectives"): {"get", "list", "watch"},
        ("inference.networking.x-k8s.io", "inferencemodelrewrites"): {"get", "list", "watch"},
    }


# ---------------------------------------------------------------------------------------
# The picker's configuration


def picker_config(docs: list[dict], pool_name: str | None = None) -> dict:
    maps = [d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"].endswith("-epp")]
    if pool_name:
        maps = [d for d in maps if d["metadata"]["name"] == f"{pool_name}-epp"]
    assert len(maps) == 1
    return yaml.safe_load(maps[0]["data"][pool.CONFIG_KEY])


def validate_picker_config(config: dict) -> None:
    """What GIE v1.5.0's loader checks, and the fields its plugins read."""
    assert set(config) <= CONFIG_FIELDS
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name") or p["type"]: p for p in config["plugins"]}
    assert len(plugins) == len(config["plugins"])
    assert {p["type"] for p in plugins.values()} <= REGISTERED
    for profile in config["schedulingProfiles"]:
        assert {ref["pluginRef"] for ref in profile["plugins"]} <= set(plugins)
    for source in config["dataLayer"]["sources"]:
        assert plugins[source["pluginRef"]]["type"] == "metrics-data-source"
        for extractor in source["extractors"]:
            assert plugins[extractor["pluginRef"]]["type"] == "core-metrics-extractor"
    for plugin in plugins.values():
        params = plugin.get("parameters", {})
        if plugin["type"] == "core-metrics-extractor":
            assert set(params) <= EXTRACTOR_FIELDS
            for engine in params["engineConfigs"]:
                assert set(engine) <= ENGINE_CONFIG_FIELDS
            assert params["defaultEngine"] in [e["name"] for e in params["engineConfigs"]]
        elif plugin["type"] == "prefix-cache-scorer":
            assert set(params) <= PREFIX_FIELDS
            assert params.get("autoTune", True) or params["blockSizeTokens"] > 0
        elif plugin["type"] == "metrics-data-source":
            assert set(params) <= SOURCE_FIELDS


def _weights(config: dict) -> dict[str, float]:
    return {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}


def _trident_engine(config: dict) -> dict:
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    params = extractor["parameters"]
    assert params["engineLabelKey"] == names.ENGINE_TYPE_LABEL
    return next(e for e in params["engineConfigs"] if e["name"] == names.ENGINE_TYPE)


@pytest.mark.parametrize("example", ["h100", "multinode"])
def test_the_config_scores_by_prefix_queue_and_kv_with_tridents_metric_names(example, request):
    config = picker_config(request.getfixturevalue(example))
    validate_picker_config(config)
    weights = _weights(config)
    assert weights["prefix-cache-scorer"] > 0 and weights["queue-scorer"] > 0
    assert weights["kv-cache-utilization-scorer"] > 0  # both pools have vLLM: a KV gauge
    assert "max-score-picker" in weights
    engine = _trident_engine(config)
    assert engine["queuedRequestsSpec"] == pod_metrics.WAITING == pool.WAITING
    assert engine["runningRequestsSpec"] == pod_metrics.RUNNING == pool.RUNNING
    assert engine["kvUsageSpec"] == pod_metrics.KV_USAGE == pool.KV_USAGE
    # No adapters in either example: no LoRA gauge is read, no affinity scored.
    assert engine["loraSpec"] == "" and engine["cacheInfoSpec"] == ""
    assert "lora-affinity-scorer" not in weights
    prefix = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")
    # vLLM's default block (h100x8: min of TRT-LLM's 64, vLLM's 16, SGLang's 16)
    assert prefix["parameters"] == {"autoTune": False, "blockSizeTokens": 16}
    source = next(p for p in config["plugins"] if p["type"] == "metrics-data-source")
    assert source["parameters"]["path"] == "/metrics"


def test_the_extractor_finds_every_gauge_it_reads_on_the_pods_metrics(h100):
    """The way GIE's core-metrics-extractor reads a scrape (extractor.go: the family by
    name, the latest sample whose labels match the spec's): every name the rendered
    config reads is in what the frontend serves, with its value."""
    engine = _trident_engine(picker_config(h100))
    load = pod_metrics.PodLoad(waiting=3, running=5, kv_usage=0.25)
    families = {f.name: f for f in text_string_to_metric_families(load.exposition().decode())}
    expected = {"queuedRequestsSpec": 3, "runningRequestsSpec": 5, "kvUsageSpec": 0.25}
    for field, value in expected.items():
        family = families[engine[field]]
        assert family.type == "gauge"
        (sample,) = [s for s in family.samples if s.name == engine[field]]
        assert sample.labels == {} and sample.value == value


def test_block_size_follows_the_engines(tmp_path):
    data = yaml.safe_load(MULTINODE.read_text())
    data["models"][0]["engine_args"]["block_size"] = 32
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    config = picker_config(render(spec, tmp_path / "out", "--inference-pool"))
    prefix = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")
    assert prefix["parameters"]["blockSizeTokens"] == 32


def _server_and_spanning(tmp_path: Path) -> Path:
    """multinode.yaml on 3 nodes with an SGLang model on the third: a server pool of
    SGLang only, and the LeaderWorkerSet's pool."""
    data = yaml.safe_load(MULTINODE.read_text())
    data["hardware"]["nodes"] = 3
    data["models"].append(
        {
            "name": "small",
            "engine": "sglang",
            "model": "meta-llama/Meta-Llama-3-8B-Instruct",
            "family": "llama",
            "tasks": ["chat"],
        }
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def test_one_pool_and_picker_per_serving_workload(tmp_path):
    docs = render(
        _server_and_spanning(tmp_path), tmp_path / "out", "--inference-pool", "--pool-name", "fleet"
    )
    pools = {d["metadata"]["name"]: d for d in kinds(docs, "InferencePool")}
    assert set(pools) == {"fleet-server", "fleet-llama405b"}
    for name, infpool in pools.items():
        validate_custom(infpool)
        assert infpool["spec"]["endpointPickerRef"]["name"] == f"{name}-epp"
        selector = infpool["spec"]["selector"]["matchLabels"]
        assert len([1 for labels, _ in _serving_pods(docs) if _labels_match(selector, labels)]) == 1
    assert len(kinds(docs, "Deployment")) == 2
    # The server pod runs SGLang only, which reports its queue, running requests and KV
    # usage (SGLang's own gauges): scored on all three, as the vLLM pool is.
    for name in ("fleet-server", "fleet-llama405b"):
        weights = _weights(picker_config(docs, name))
        assert weights["kv-cache-utilization-scorer"] == pool.WEIGHTS["kv"] > 0
        assert weights["queue-scorer"] > 0 and weights["running-requests-size-scorer"] > 0
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            validate_core(doc)


def test_options_reach_the_objects(tmp_path):
    docs = objects(
        tmp_path,
        MULTINODE,
        "--pool-name",
        "llama",
        "--epp-image",
        "registry.example/epp@sha256:" + "a" * 64,
        "--epp-failure-mode",
        "FailClose",
    )
    infpool = one(docs, "InferencePool")
    assert infpool["metadata"]["name"] == "llama"
    assert infpool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    epp = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert epp["image"].startswith("registry.example/epp@sha256:")


def test_rerender_is_byte_identical(tmp_path):
    spec = write_spec(tmp_path, H100X8)
    render(spec, tmp_path / "a", "--inference-pool")
    render(spec, tmp_path / "b", "--inference-pool")

    def files(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    assert files(tmp_path / "a") == files(tmp_path / "b")
    kustomization = yaml.safe_load((tmp_path / "a" / "kustomization.yaml").read_text())
    assert {"inferencepool.yaml", "endpointpicker.yaml"} <= set(kustomization["resources"])


# ---------------------------------------------------------------------------------------
# Bad input


def _trtllm_only(tmp_path: Path) -> Path:
    data = yaml.safe_load(H100X8.read_text())
    data["models"] = [m for m in data["models"] if m["engine"] == "tensorrt_llm"]
    del data["router"]
    data["hardware"].pop("topology")
    spec = tmp_path / "trt.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--pool-name", "Bad_Name"], "--pool-name"),
        (["--pool-name", "9lives"], "--pool-name"),
        (["--pool-name", "a" * 39], "--pool-name"),
        (["--epp-image", "registry.k8s.io/gateway-api-inference-extension/epp"], "--epp-image"),
        (["--epp-image", "localhost:5000/epp"], "--epp-image"),  # a port is not a tag
        (["--epp-image", "epp:"], "--epp-image"),  # an empty tag
        (["--epp-image", "img@@x"], "--epp-image"),
        (["--epp-image", "epp:v1@"], "--epp-image"),  # an empty digest
        (["--epp-image", "epp@sha256:abc"], "--epp-image"),  # not a digest
        (["--epp-image", "epp:v1\n--v=9"], "--epp-image"),  # a second line
        (["--epp-image", ""], "--epp-image"),
        (["--pool-name", ""], "--pool-name"),
        (["--pool-name", "pool-"], "--pool-name"),
        (["--pool-name", "a.b"], "--pool-name"),  # a subdomain, not a label
        (["--pool-name", "a\nb"], "--pool-name"),
        (["--epp-failure-mode", "FailSometimes"], "--epp-failure-mode"),
    ],
)
def test_bad_options_are_one_line_exit_2(tmp_path, extra, field):
    spec = write_spec(tmp_path, H100X8)
    line = refused(spec, tmp_path / "out", "--inference-pool", *extra)
    assert line.startswith(f"error: {field}:"), line
    if extra[1] == "":
        assert "empty" in line, line  # not `--pool-name:  is not ...`


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "extra",
    [
        ["--inference-pool", "--pool-name", "Bad_Name"],  # refused before planning
        ["--inference-pool", "--epp-image", "img@@x"],
        # refused while rendering: a Gateway for the spec's two pools
        ["--inference-pool", "--gateway-class", "eg"],
    ],
)
def test_a_refusal_leaves_an_earlier_render_as_it_was(tmp_path, extra):
    """Nothing written: the output directory of an earlier `trident k8s` keeps every
    byte, and no temporary sibling is left beside it."""
    spec = _server_and_spanning(tmp_path)
    out = tmp_path / "out"
    render(spec, out)
    before, siblings = _tree(out), sorted(p.name for p in tmp_path.iterdir())
    code, stderr = hs.call_cli(["k8s", "--spec", str(spec), "--out", str(out), *extra])
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == siblings


def test_pool_options_need_the_flag(tmp_path):
    spec = write_spec(tmp_path, H100X8)
    for extra in (["--pool-name", "p"], ["--epp-image", "x:1"], ["--epp-failure-mode", "FailOpen"]):
        line = refused(spec, tmp_path / "out", *extra)
        assert line.startswith(f"error: {extra[0]}: only with --inference-pool"), line


@pytest.mark.parametrize("source", [H100X8, MULTINODE])
def test_no_openai_port_is_refused_naming_the_field(tmp_path, source):
    spec = write_spec(tmp_path, source, server={"openai_port": None})
    line = refused(spec, tmp_path / "out", "--inference-pool")
    assert "server.openai_port" in line and "--inference-pool" in line


def test_a_pool_of_tensorrt_llm_models_only_scores_their_load_and_kv(tmp_path):
    """Trident's /metrics carries a TensorRT-LLM model's waiting, scheduled and KV usage
    from Triton's nv_trt_llm_* gauges (pod_metrics.py): such a pool is scored on all
    three, at the engine's KV block (the profile's tokens_per_block, 64)."""
    docs = render(_trtllm_only(tmp_path), tmp_path / "out", "--inference-pool")
    config = picker_config(docs)
    validate_picker_config(config)
    weights = _weights(config)
    assert weights["kv-cache-utilization-scorer"] > 0 and weights["queue-scorer"] > 0
    prefix = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")
    assert prefix["parameters"]["blockSizeTokens"] == 64
    assert _trident_engine(config)["loraSpec"] == ""  # TensorRT-LLM's adapters: not reported


def test_a_pool_with_vllm_adapters_reads_the_lora_gauge_and_scores_affinity(tmp_path):
    """multinode.yaml's vLLM model with adapters: the engine config reads the pod's
    LORA_INFO and the lora-affinity-scorer weighs it; the gauge the frontend serves has
    the labels GIE's extractor reads (populateLoRAMetrics), one series, a Unix time."""
    data = yaml.safe_load(MULTINODE.read_text())
    data["models"][0]["adapters"] = {"paris": "/srv/lora/paris", "france": "/srv/lora/france"}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    config = picker_config(render(spec, tmp_path / "out", "--inference-pool"))
    validate_picker_config(config)
    engine = _trident_engine(config)
    assert engine["loraSpec"] == pod_metrics.LORA_INFO == pool.LORA_INFO
    assert _weights(config)["lora-affinity-scorer"] == pool.WEIGHTS["lora"]
    load = pod_metrics.PodLoad(running_adapters=("router:paris",), max_lora=4)
    families = {f.name: f for f in text_string_to_metric_families(load.exposition().decode())}
    (sample,) = families[engine["loraSpec"]].samples
    assert sample.labels == {
        "running_lora_adapters": "router:paris",
        "waiting_lora_adapters": "",
        "max_lora": "4",
    }


def test_an_sglang_model_with_its_metrics_off_is_refused_in_one_line(tmp_path):
    """engine_args.enable_metrics: false leaves an SGLang model without its load gauges
    (trident_common/engine_gauges.py): the pod's KV gauge would leave it out and the
    picker would score its pods as empty. Refused naming the model and the field, exit
    2, an earlier render left as it was; without the flag it renders."""
    spec = _server_and_spanning(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["models"][-1]["engine_args"] = {"enable_metrics": False}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    line = refused(spec, out, "--inference-pool")
    assert "model 'small'" in line and "engine_args.enable_metrics" in line, line
    render(spec, out)  # without the flag: served as before
    before = _tree(out)
    code, stderr = hs.call_cli(["k8s", "--spec", str(spec), "--out", str(out), "--inference-pool"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert _tree(out) == before
