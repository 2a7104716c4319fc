"""`trident k8s --inference-pool`: the serving pods as InferencePools of the Gateway API
Inference Extension (GIE, inference.networking.k8s.io/v1), each behind its own endpoint
picker (EPP) of GIE's release names.GIE_VERSION.

A gateway that implements GIE (Envoy Gateway, kgateway, Istio, GKE's) asks the picker,
over Envoy's ext-proc, which pod of the pool takes each request. The picker scores the
pool's Ready pods by the prefixes it has sent them (its own approximate index), their
queue, their running requests and their KV-cache usage, which it reads every 50 ms from
`GET /metrics` on each pod's target port: trident's OpenAI frontend serves there the
pod-wide gauges of builder/serve/openai/pod_metrics.py, mapped by the picker's
`engineConfigs` entry `trident`, chosen by the pod label names.ENGINE_TYPE_LABEL. Inside
the pod, trident's router then places the request on a model and a replica.

One pool per serving workload: the StatefulSet's pods (the server with its router), and
each LeaderWorkerSet's leaders (a model spanning nodes; its workers serve nothing). Each
pool has its own picker (a picker serves exactly one pool: `--pool-name`) with its
ServiceAccount and Role, its configuration in a ConfigMap, its Deployment and Service.
With `tenants:` in the spec, an InferenceObjective per tenant tier and pool (the priority
a client asks for with the header OBJECTIVE_HEADER); with `--gateway-class`, a Gateway
(gateway.networking.k8s.io/v1) of that class and an HTTPRoute from it to the pool.

What was read in GIE's source at tag v1.5.0 (commit df9f8909) to write this:
- config/charts/inferencepool/values.yaml, templates/inferencepool.yaml, rbac.yaml and
  config/charts/epplib/templates/_deployment.yaml, _service.yaml, _rbac.yaml,
  _config.yaml: the image, arguments, ports (ext-proc 9002, gRPC health 9003, metrics
  9090), probes, resources, the Recreate strategy and the Role's rules;
- pkg/epp/server/options.go: the flags (the old metric-name flags are refused);
- apix/config/v1alpha1/endpointpickerconfig_types.go, pkg/epp/config/loader/: the
  EndpointPickerConfig (decoded strictly), its defaults, the dataLayer wiring;
- pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go: the
  `core-metrics-extractor`'s engineLabelKey/defaultEngine/engineConfigs;
- pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/: the
  prefix-cache scorer's parameters (given to its producer: blockSizeTokens, autoTune);
- pkg/epp/controller/inferenceobjective_reconciler.go, pkg/epp/handlers/request.go,
  pkg/epp/metadata/consts.go, pkg/epp/requestcontrol/director.go and admission.go,
  pkg/common/error/error.go: a picker keeps the InferenceObjectives whose poolRef (name
  and group) is its pool, by name; a request names one in the header
  `x-gateway-inference-objective` (none, or an unknown name: priority 0); without flow
  control (a feature gate, off) the priority matters only when negative: such a request
  is refused with 429 while the pool is saturated
  (pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/detector.go: the
  mean over the candidate pods of max(waiting / 5, KV usage / 0.8), a pod whose metrics
  are over 200 ms old counting 1, reaches 1);
- config/charts/inferencepool/templates/httproute.yaml, inferenceobjectives.yaml and
  config/manifests/gateway/*/gateway.yaml: the HTTPRoute (PathPrefix /, the pool as its
  backendRef, a 300 s request timeout except on GKE) and the Gateway (listener `http`, 80).
Pure: spec + layout + options -> objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from builder.k8s import names, services, workloads
from builder.k8s.names import K8sError
from builder.k8s.workloads import Layout, Options

# The gauges trident's frontend serves on the OpenAI port, by the names it serves them.
from builder.serve.openai.pod_metrics import KV_USAGE, LORA_INFO, RUNNING, WAITING
from builder.spec import DeploymentSpec
from builder.spec import trtllm as trtllm_spec
from builder.spec.adapters import adapters_of
from trident_common import engine_gauges

POOL_API = "inference.networking.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
GIE_ALPHA_GROUP = "inference.networking.x-k8s.io"  # InferenceObjective, InferenceModelRewrite
CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"
OBJECTIVE_API = "inference.networking.x-k8s.io/v1alpha2"
GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_API = f"{GATEWAY_GROUP}/v1"
# The header by which a request names its InferenceObjective (GIE v1.5.0's
# pkg/epp/metadata/consts.go).
OBJECTIVE_HEADER = "x-gateway-inference-objective"
# A tenant tier (builder/spec/tenants.py's TIERS) -> its InferenceObjective's priority:
# higher is more important; a request without an objective counts as 0, as standard
# does. Batch is negative, so sheddable: refused with 429 while the pool is saturated
# (its pods, on average, at 5 waiting requests or 0.8 KV usage: GIE's defaults) instead
# of queueing in the pods.
OBJECTIVE_PRIORITY = {"premium": 1, "standard": 0, "batch": -1}
# The Gateway's one listener, and the HTTPRoute's request timeout (GIE's chart: 300 s;
# left out for GKE's gateway classes, which do not support it, as the chart does).
GATEWAY_LISTENER = {"name": "http", "port": 80, "protocol": "HTTP"}
REQUEST_TIMEOUT = "300s"
GKE_CLASS_PREFIX = "gke-l7-"
FAILURE_MODES = ("FailOpen", "FailClose")
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
CONFIG_DIR = "/config"
CONFIG_KEY = "epp-config.yaml"
# The picker's default KV block size, and vLLM's (approximateprefix/types.go).
DEFAULT_BLOCK_TOKENS = 16
# Scorer weights: GIE's defaults (queue 2, KV 2, prefix 3; pkg/epp/config/loader/
# defaults.go) plus the running requests at 1 (trident's: below the queue, which waits
# longer than a request that runs), and, where the pods report their adapters, LoRA
# affinity at 1 (GIE sets no default; below the prefix: a pod that holds the
# conversation's prefix holds its adapter too).
WEIGHTS = {"queue": 2, "kv": 2, "running": 1, "prefix": 3, "lora": 1}
# Sized by GIE's chart for high QPS (p90 scheduling within 100 ms): no CPU limit.
EPP_RESOURCES = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
# Which of the pod's gauges carry an engine's load (pod_metrics.py): vLLM's own
# waiting/running/KV (and its adapters: `lora`, for a model with adapters); SGLang's own
# sglang:num_queue_reqs/num_running_reqs/token_usage, which its scheduler writes to files
# (trident_common/engine_gauges.py); TensorRT-LLM's from Triton's nv_trt_llm_* gauges
# (waiting, scheduled, KV block fraction). An SGLang model whose engine_args turn
# SGLang's metrics off reports only its requests in flight (UNMETERED), and a pool with
# it is refused (picker_config): the pod's KV gauge would leave that model out.
REPORTED = {
    "vllm": ("waiting", "running", "kv"),
    "sglang": ("waiting", "running", "kv"),
    "tensorrt_llm": ("waiting", "running", "kv"),
}
UNMETERED = ("running",)
# The engines whose adapters' requests the pod's LORA_INFO reports (the vLLM model's
# per-adapter counts; SGLang's and TensorRT-LLM's adapters are not in it).
LORA_REPORTED = ("vllm",)


@dataclass(frozen=True)
class Pool:
    name: str
    component: str  # the workload: "server", or a spanning model's component
    models: tuple[str, ...]  # the spec's models its pods serve
    selector: dict

    @property
    def picker(self) -> str:
        return f"{self.name}-epp"


def check(spec: DeploymentSpec, options: Options) -> None:
    """What --inference-pool needs from the spec alone, before planning (one line)."""
    if options.inference_pool and spec.server.openai_port is None:
        raise K8sError(
            f"{spec.file}: server.openai_port: --inference-pool needs the OpenAI "
            "frontend's port: it is the pool's target port, where the picker sends "
            "requests and reads the pod's load (GET /metrics)"
        )


def pools(spec: DeploymentSpec, lay: Layout, options: Options) -> list[Pool]:
    components = services.serving_components(lay)
    base = options.pool_name or lay.app
    out = []
    for component in components:
        models = lay.single if component == "server" else _spanning_model(lay, component)
        name = base if len(components) == 1 else f"{base}-{component}"
        out.append(Pool(name, component, models, services.serving_selector(lay, component)))
    return out


def _spanning_model(lay: Layout, component: str) -> tuple[str, ...]:
    return tuple(m for m in lay.spanning if lay.component[m] == component)


def reported(spec: DeploymentSpec, pool: Pool) -> set[str]:
    """The gauges that carry load for the pool's models (`lora`: the adapters in use)."""
    gauges = {g for m in pool.models for g in _engine_gauges(spec, m)}
    for name in pool.models:
        model = spec.model(name)
        if model.engine in LORA_REPORTED and adapters_of(model):
            gauges.add("lora")
    return gauges


def _engine_gauges(spec: DeploymentSpec, name: str) -> tuple[str, ...]:
    model = spec.model(name)
    if model.engine == "sglang" and not engine_gauges.sglang_reports_load(model.engine_args):
        return UNMETERED
    return REPORTED[model.engine]


def block_tokens(spec: DeploymentSpec, models: tuple[str, ...]) -> int:
    """The prefix-cache scorer's block size: the smallest KV block of the pool's engines
    (the finest granularity at which any of them reuses a prefix). vLLM:
    engine_args.block_size, else its default 16; TensorRT-LLM: the served profile's
    plugins.tokens_per_block (default 64); SGLang pages its radix cache by 1 token by
    default (page_size, not an argument trident passes): the picker's default 16, as a
    per-token block would cut its index to the first 256 tokens of a prompt."""
    sizes = []
    for name in models:
        model = spec.model(name)
        if model.engine == "vllm":
            sizes.append(int(model.engine_args.get("block_size", DEFAULT_BLOCK_TOKENS)))
        elif model.engine == "tensorrt_llm":
            sizes.append(trtllm_spec.serving_profile(model.extra).plugins.tokens_per_block)
        else:
            sizes.append(DEFAULT_BLOCK_TOKENS)
    return min(sizes, default=DEFAULT_BLOCK_TOKENS)


def picker_config(spec: DeploymentSpec, pool: Pool) -> dict:
    """The EndpointPickerConfig: trident's metric names, the scorers and a picker."""
    _check_kv(spec, pool)
    gauges = reported(spec, pool)
    weights = dict(WEIGHTS)
    scorers = [
        ("queue-scorer", weights["queue"]),
        ("kv-cache-utilization-scorer", weights["kv"]),
        ("running-requests-size-scorer", weights["running"]),
        ("prefix-cache-scorer", weights["prefix"]),
    ]
    lora = "lora" in gauges
    if lora:  # without the gauge every pod would score 0 (no room for an adapter)
        scorers.append(("lora-affinity-scorer", weights["lora"]))
    return {
        "apiVersion": CONFIG_API,
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics"}},
            _metrics_extractor(lora),
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "running-requests-size-scorer"},
            *([{"type": "lora-affinity-scorer"}] if lora else []),
            {
                "type": "prefix-cache-scorer",
                # autoTune reads the block size from a cache-config gauge trident does
                # not serve: fixed instead.
                "parameters": {
                    "autoTune": False,
                    "blockSizeTokens": block_tokens(spec, pool.models),
                },
            },
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    *({"pluginRef": ref, "weight": weight} for ref, weight in scorers),
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
        "dataLayer": {
            "sources": [
                {
                    "pluginRef": "metrics-data-source",
                    "extractors": [{"pluginRef": "core-metrics-extractor"}],
                }
            ]
        },
    }


def _check_kv(spec: DeploymentSpec, pool: Pool) -> None:
    """Every model of the pool reports its KV usage, else one line: the pod's KV gauge
    would leave it out and the picker would score its pods by a part of their load."""
    for name in pool.models:
        if "kv" not in _engine_gauges(spec, name):
            raise K8sError(
                f"{spec.file}: model {name!r}: engine_args.{engine_gauges.SGLANG_METRICS_ARG}: "
                "false leaves its engine without load gauges, so with --inference-pool the "
                "picker's KV scorer would count its pods as empty; remove it, or render "
                "without --inference-pool"
            )


def _metrics_extractor(lora: bool) -> dict:
    """The picker's reader of trident's metric names on each pod's /metrics."""
    return {
        "type": "core-metrics-extractor",
        "parameters": {
            "engineLabelKey": names.ENGINE_TYPE_LABEL,
            # Every pod of the pool is trident's, labelled or not.
            "defaultEngine": names.ENGINE_TYPE,
            "engineConfigs": [
                {
                    "name": names.ENGINE_TYPE,
                    "queuedRequestsSpec": WAITING,
                    "runningRequestsSpec": RUNNING,
                    "kvUsageSpec": KV_USAGE,
                    # Off ("") where no model of the pool reports adapters:
                    # pod_metrics.py serves no LORA_INFO then.
                    "loraSpec": LORA_INFO if lora else "",
                    "cacheInfoSpec": "",  # no cache-config gauge: off
                }
            ],
        },
    }


def inference_pool(spec: DeploymentSpec, lay: Layout, pool: Pool, options: Options) -> dict:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": names.metadata(
            pool.name, options.namespace, names.labels(lay.app, pool.component)
        ),
        "spec": {
            "selector": {"matchLabels": dict(pool.selector)},
            "targetPorts": [{"number": spec.server.openai_port}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "kind": "Service",
                "name": pool.picker,
                "port": {"number": EXT_PROC_PORT},
                "failureMode": options.epp_failure_mode,
            },
        },
    }


def picker_objects(spec: DeploymentSpec, lay: Layout, pool: Pool, options: Options) -> list[dict]:
    """ServiceAccount, Role, RoleBinding, ConfigMap, Deployment and Service of the pool's
    picker, in apply order."""
    component = f"{pool.component}-epp"
    labels = names.labels(lay.app, component)
    select = names.selector(lay.app, component)
    meta = names.metadata(pool.picker, options.namespace, labels)
    config = yaml.safe_dump(picker_config(spec, pool), sort_keys=False)
    return [
        *_picker_access(meta, pool.picker, options.namespace),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": dict(meta),
            "data": {CONFIG_KEY: config},
        },
        _picker_deployment(spec, meta, labels, select, pool, _picker_container(pool, options)),
        _picker_service(meta, select),
    ]


def _picker_access(meta: dict, picker: str, ns: str | None) -> list[dict]:
    """The picker's ServiceAccount, and the Role (GIE v1.5.0's chart: rbac.yaml and
    epplib's _rbac.yaml, one Role) bound to it."""
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
        {
            "apiGroups": [POOL_GROUP],
            "resources": ["inferencepools"],
            "verbs": ["get", "watch", "list"],
        },
        {
            "apiGroups": [GIE_ALPHA_GROUP],
            "resources": ["inferenceobjectives", "inferencemodelrewrites"],
            "verbs": ["get", "watch", "list"],
        },
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "subjects": [{"kind": "ServiceAccount", "name": picker, **_namespace(ns)}],
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": picker,
            },
        },
    ]


def _picker_container(pool: Pool, options: Options) -> dict:
    """The endpoint picker's container: GIE's image and flags, its ports and probes."""
    return {
        "name": "epp",
        "image": options.epp_image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "--pool-name",
            pool.name,
            "--pool-group",
            POOL_GROUP,
            # --pool-namespace: left to the NAMESPACE variable, the picker's own
            # namespace, so a kustomization's namespace holds.
            "--config-file",
            f"{CONFIG_DIR}/{CONFIG_KEY}",
            "--grpc-port",
            str(EXT_PROC_PORT),
            "--grpc-health-port",
            str(HEALTH_PORT),
            "--metrics-port",
            str(EPP_METRICS_PORT),
            "--zap-encoder",
            "json",
            "--v",
            "1",
            "--tracing=false",
            # Its metrics as trident's own: readable without a token in the cluster
            # (a token review would need a ClusterRole; trident renders none).
            "--metrics-endpoint-auth=false",
        ],
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            # Not `metrics`: trident's PodMonitor scrapes that port name on every pod of
            # the deployment.
            {"name": "http-metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {
            "grpc": {"port": HEALTH_PORT, "service": "inference-extension"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
        },
        "readinessProbe": {
            "grpc": {"port": HEALTH_PORT, "service": "inference-extension"},
            "periodSeconds": 2,
        },
        "resources": {k: dict(v) for k, v in EPP_RESOURCES.items()},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }


def _picker_deployment(
    spec: DeploymentSpec, meta: dict, labels: dict, select: dict, pool: Pool, container: dict
) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": dict(meta),
        "spec": {
            # One picker: its prefix index lives in its memory. Recreate, as GIE's
            # chart: the old one goes at once (the gateway's failure mode meanwhile).
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": select},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": pool.picker,
                    # GIE: as long as the pool's pods' (streams pass through it).
                    "terminationGracePeriodSeconds": workloads.grace_period_s(spec),
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": pool.picker}}],
                },
            },
        },
    }


def _picker_service(meta: dict, select: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": dict(meta),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(select),
            "ports": [
                _service_port("grpc-ext-proc", EXT_PROC_PORT),
                _service_port("grpc-health", HEALTH_PORT),
                _service_port("http-metrics", EPP_METRICS_PORT),
            ],
        },
    }


def _namespace(ns: str | None) -> dict:
    return {"namespace": ns} if ns else {}


def _service_port(name: str, port: int) -> dict:
    return {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}


def objectives(spec: DeploymentSpec, lay: Layout, pool: Pool, options: Options) -> list[dict]:
    """An InferenceObjective `<pool>-<tier>` per tenant tier of the spec, most important
    first; none without `tenants:`. A client asks for one with the header
    OBJECTIVE_HEADER: the gateway cannot tell a tenant from its key (trident's frontend,
    inside the pod, does), and the router still applies the tenant's own tier there."""
    if spec.tenants is None:
        return []
    tiers = sorted(spec.tenants.tiers(), key=lambda tier: -OBJECTIVE_PRIORITY[tier])
    return [
        {
            "apiVersion": OBJECTIVE_API,
            "kind": "InferenceObjective",
            "metadata": names.metadata(
                f"{pool.name}-{tier}", options.namespace, names.labels(lay.app, pool.component)
            ),
            "spec": {
                "priority": OBJECTIVE_PRIORITY[tier],
                # The picker compares the group too: stated, not left to the default.
                "poolRef": {"group": POOL_GROUP, "kind": "InferencePool", "name": pool.name},
            },
        }
        for tier in tiers
    ]


def gateway_objects(lay: Layout, pool: Pool, options: Options) -> list[dict]:
    """A Gateway of --gateway-class with one HTTP listener, and an HTTPRoute from it to
    the pool (every path: the OpenAI API), both named after the pool."""
    gateway_class = options.gateway_class
    assert gateway_class is not None
    labels = names.labels(lay.app, f"{pool.component}-gateway")
    rule: dict = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": pool.name}],
    }
    if not gateway_class.startswith(GKE_CLASS_PREFIX):
        rule["timeouts"] = {"request": REQUEST_TIMEOUT}
    return [
        {
            "apiVersion": GATEWAY_API,
            "kind": "Gateway",
            "metadata": names.metadata(pool.name, options.namespace, labels),
            "spec": {"gatewayClassName": gateway_class, "listeners": [dict(GATEWAY_LISTENER)]},
        },
        {
            "apiVersion": GATEWAY_API,
            "kind": "HTTPRoute",
            "metadata": names.metadata(pool.name, options.namespace, labels),
            "spec": {
                "parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": pool.name}],
                "rules": [rule],
            },
        },
    ]


def manifests(spec: DeploymentSpec, lay: Layout, options: Options) -> dict[str, list[dict]]:
    """File name -> objects: the pools, their objectives, their pickers, the gateway."""
    check(spec, options)
    found = pools(spec, lay, options)
    if options.gateway_class is not None and len(found) > 1:
        raise K8sError(
            f"--gateway-class: the spec has {len(found)} serving workloads "
            f"(pools {', '.join(p.name for p in found)}), which serve different models: a "
            "Gateway cannot tell them apart by path (the model is in the request body); "
            "render without --gateway-class and route to each pool yourself"
        )
    pickers = [o for pool in found for o in picker_objects(spec, lay, pool, options)]
    files = {"inferencepool.yaml": [inference_pool(spec, lay, p, options) for p in found]}
    wanted = [o for pool in found for o in objectives(spec, lay, pool, options)]
    if wanted:
        files["inferenceobjectives.yaml"] = wanted
    files["endpointpicker.yaml"] = pickers
    if options.gateway_class is not None:
        files["gateway.yaml"] = gateway_objects(lay, found[0], options)
    return files
