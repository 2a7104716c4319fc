"""The serving workloads: a StatefulSet for the models that fit one node (one
tritonserver, router included), a LeaderWorkerSet per model spanning nodes, and the
ConfigMap carrying the spec (their Services and disruption budgets: services.py).

Each pod renders its own repository: an init container runs `trident repo` on the spec
from the ConfigMap (fetching TensorRT-LLM engines from the S3 engine cache, with AWS
credentials only as a reference to a Secret), then the server container runs
`trident serve` on it. Pure: spec + plan + options → objects (plain dicts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from builder.errors import printable
from builder.k8s import access, names
from builder.k8s.names import K8sError
from builder.plan.model import ModelPlan, Plan
from builder.plan.replicas import routed_replicas
from builder.serve.drain import shutdown_budget_s
from builder.spec import DeploymentSpec

SPEC_DIR = "/etc/trident"
SPEC_KEY = "spec.yaml"
TOPOLOGY_KEY = "topology.txt"
WORK_DIR = "/var/lib/trident"  # HOME of both containers: repository + engine cache
REPO_DIR = f"{WORK_DIR}/model_repository"
RAY_PORT = 6379
# The serving container's preStop hook: it asks the local `trident serve` to drain and
# returns when the drain is over; the kubelet's SIGTERM after it then only stops
# tritonserver (builder/serve/drain.py).
DRAIN_COMMAND = ["trident", "drain"]
# Kubernetes counts the preStop hook's time against terminationGracePeriodSeconds, so a
# serving pod's grace period is the whole of `trident serve`'s shutdown from the drain's
# start (shutdown_budget_s) plus this margin: the hook's own start (an exec into the
# container, a Python interpreter, finding the server) before the drain begins, and the
# kubelet's SIGTERM after the hook returns.
PRESTOP_MARGIN_S = 5
# A Ray worker (`ray start --block`) serves nothing and has nothing to drain: it stops its
# processes on SIGTERM. Kubernetes' own default.
WORKER_GRACE_PERIOD_S = 30
# Engine loading (weights from disk, CUDA graphs, TRT-LLM engines) may take long.
STARTUP_BUDGET_S = 1800
STARTUP_PERIOD_S = 10


@dataclass(frozen=True)
class Options:
    namespace: str | None = None
    image: str = names.DEFAULT_IMAGE
    cache_secret: str | None = None  # --cache-secret, else engine_cache.credentials_secret
    api_keys_secret: str | None = None  # --api-keys-secret: the OpenAI frontend requires keys
    ttft_p99_s: float = 2.0  # the TTFT alert's threshold
    # --inference-pool: the serving pods as InferencePools behind GIE's endpoint picker
    # (builder/k8s/pool.py); the pool's name (else the app's), the picker's image and
    # what the gateway does when the picker does not answer.
    inference_pool: bool = False
    pool_name: str | None = None
    epp_image: str = names.DEFAULT_EPP_IMAGE
    epp_failure_mode: str = "FailOpen"
    gateway_class: str | None = None  # a Gateway of this class and an HTTPRoute to the pool
    # --otlp-traces-endpoint: where the serving pods send their traces (tracing_env)
    otlp_traces_endpoint: str | None = None


@dataclass(frozen=True)
class Layout:
    """Which models run where: the single-node server, and the models spanning nodes."""

    app: str
    single: tuple[str, ...]
    spanning: tuple[str, ...]
    component: dict  # model name (or "server") → object name suffix


def layout(spec: DeploymentSpec, plan: Plan) -> Layout:
    app = names.app_name(spec.name)
    single = tuple(m.name for m in spec.models if plan.model(m.name).nodes == 1)
    spanning = tuple(m.name for m in spec.models if plan.model(m.name).nodes > 1)
    component = {"server": "server"}
    for i, name in enumerate(spanning):
        label = names.dns_label(name, f"models[{i}].name", limit=20)
        if label in component.values():
            raise K8sError(
                f"{spec.file}: model {name!r}: its Kubernetes name {label!r} "
                "is already taken by another model"
            )
        component[name] = label
    _check_spanning(spec, plan, spanning)
    return Layout(app, single, spanning, component)


def _check_spanning(spec: DeploymentSpec, plan: Plan, spanning: tuple[str, ...]) -> None:
    for name in spanning:
        model = spec.model(name)
        if model.engine != "vllm" or model.engine_args.get("distributed_executor_backend") != "ray":
            raise K8sError(
                f"{spec.file}: model {name!r} spans {plan.model(name).nodes} "
                "nodes; trident renders multi-node workloads only for vllm "
                "with engine_args.distributed_executor_backend: ray"
            )
    router = spec.router
    if router is None:
        return
    used = set(router.default) | {b for r in router.rules for b in r.backends}
    used |= set(router.fallback) | {b for bs in router.fallback.values() for b in bs}
    for name in spanning:
        if name in used:
            raise K8sError(
                f"{spec.file}: router: backend {name!r} spans nodes and runs "
                "in its own LeaderWorkerSet, but the router reaches only the "
                "models of its own server (BLS); route to it from outside"
            )


def gpu_resources(plan: Plan, models: tuple[str, ...]) -> dict[str, int]:
    """Extended resources of one pod serving `models`: per-instance resources of the
    plan summed over their instances (nvidia.com/gpu, nvidia.com/mig-<profile>)."""
    total: dict[str, int] = {}
    for name in models:
        placed = plan.model(name)
        for resource, count in placed.kubernetes_resources.items():
            total[resource] = total.get(resource, 0) + count * len(placed.instances)
    return dict(sorted(total.items()))


def mig_config_name(spec: DeploymentSpec) -> str:
    """The layout's name in `trident mig plan`'s mig-parted file: the value the GPU
    Operator's MIG manager applies from the node label nvidia.com/mig.config."""
    value = f"trident-{spec.name}"
    if len(value) > 63 or not names._LABEL.fullmatch(value.lower()) or not value.isascii():
        raise K8sError(
            f"{spec.file}: name: {printable(spec.name)} cannot be a label value "
            "(nvidia.com/mig.config=trident-<name>)"
        )
    return value


def shm_size(plan: Plan, models: tuple[str, ...], gpus: int) -> str:
    """/dev/shm: 1 GiB, + 1 GiB per model instance (the Python backend's stub regions),
    + 1 GiB per GPU (NCCL's buffers between tensor/pipeline ranks), + 1 for the router."""
    instances = sum(max(1, len(plan.model(name).instances)) for name in models)
    return f"{2 + instances + gpus}Gi"


# ---------------------------------------------------------------------------------------
# Spec ConfigMap


def topology_item(spec: DeploymentSpec) -> tuple[str, Path] | None:
    """(path below SPEC_DIR, file here) of the spec's topology file, which goes into the
    ConfigMap at the same relative place, so the pod plans on the same matrix."""
    if not spec.hardware.topology:
        return None
    relative = PurePosixPath(spec.hardware.topology)
    if relative.is_absolute() or ".." in relative.parts:
        raise K8sError(
            f"{spec.file}: hardware.topology: {printable(spec.hardware.topology)} "
            "must be a relative path without '..' to travel in the ConfigMap"
        )
    here = Path(spec.hardware.topology)
    if not here.is_file():
        here = Path(spec.file).parent / relative
    return str(relative), here


def spec_configmap(spec: DeploymentSpec, app: str, options: Options) -> dict:
    data = {SPEC_KEY: Path(spec.file).read_text()}
    item = topology_item(spec)
    if item is not None:
        data[TOPOLOGY_KEY] = item[1].read_text()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.metadata(f"{app}-spec", options.namespace, names.labels(app, "spec")),
        "data": data,
    }


# ---------------------------------------------------------------------------------------
# Pods


def container_ports(spec: DeploymentSpec, options: Options) -> list[dict]:
    """The ports reachable from outside the pod (access.public_ports)."""
    numbers = {
        "http": spec.server.http_port,
        "grpc": spec.server.grpc_port,
        "metrics": spec.server.metrics_port,
        "openai": spec.server.openai_port,
    }
    return [
        {"name": name, "containerPort": numbers[name], "protocol": "TCP"}
        for name in access.public_ports(spec, options)
    ]


def _probe(path: str, port: str, period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _init_container(spec: DeploymentSpec, options: Options) -> dict:
    container = {
        "name": "render-repository",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["trident", "repo", "--spec", f"{SPEC_DIR}/{SPEC_KEY}", "--out", REPO_DIR],
        "workingDir": SPEC_DIR,
        "env": [{"name": "HOME", "value": WORK_DIR}],
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "work", "mountPath": WORK_DIR},
        ],
    }
    secret = options.cache_secret or spec.engine_cache.credentials_secret
    if secret:  # a reference only: the values stay in the Secret
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    return container


def _serve_command(
    spec: DeploymentSpec, options: Options, load: tuple[str, ...] | None, expose: tuple[str, ...]
) -> list[str]:
    command = [
        "trident",
        "serve",
        "--repo",
        REPO_DIR,
        "--http-port",
        str(spec.server.http_port),
        "--grpc-port",
        str(spec.server.grpc_port),
        "--metrics-port",
        str(spec.server.metrics_port),
        *access.serve_args(spec, options, expose),
        "--timeout",
        str(STARTUP_BUDGET_S),
        "--drain-timeout",
        seconds(spec.server.drain_timeout_s),
    ]
    for model in load or ():
        command += ["--load-model", model]
    return command


def seconds(value: float) -> str:
    """A number of seconds on a command line: `30` for 30.0, else the float as written."""
    return str(int(value)) if value == int(value) else repr(value)


def grace_period_s(spec: DeploymentSpec) -> int:
    """terminationGracePeriodSeconds of a pod running `trident serve`: its drain, the
    cutoff, tritonserver's exit and the kill after it (shutdown_budget_s), plus the
    preStop hook's margin; the kubelet SIGKILLs nothing that is still draining."""
    return shutdown_budget_s(spec.server.drain_timeout_s) + PRESTOP_MARGIN_S


# The pod's own name and namespace in the serving container's environment (the downward
# API), which OTEL_RESOURCE_ATTRIBUTES then names as $(VAR): Kubernetes expands a variable
# defined earlier in the same list.
POD_NAME_ENV, POD_NAMESPACE_ENV = "TRIDENT_POD_NAME", "TRIDENT_POD_NAMESPACE"


def tracing_env(spec: DeploymentSpec, options: Options, workload: str) -> list[dict]:
    """The serving container's OpenTelemetry settings when --otlp-traces-endpoint is given
    (`trident serve` reads the standard environment, builder/serve/tracing.py): the
    endpoint, and resource attributes saying which pod of which workload, deployment and
    spec served a request, so a slow trace leads to its pod and its rollout. Ray workers
    serve nothing and get none."""
    if options.otlp_traces_endpoint is None:
        return []
    attributes = {
        "k8s.pod.name": f"$({POD_NAME_ENV})",
        "k8s.namespace.name": f"$({POD_NAMESPACE_ENV})",
        "trident.workload": workload,
        "trident.deployment": spec.name,
        "trident.spec.sha256": spec_digest(spec),
    }
    return [
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": POD_NAMESPACE_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "value": options.otlp_traces_endpoint},
        {
            "name": "OTEL_RESOURCE_ATTRIBUTES",
            "value": ",".join(f"{key}={value}" for key, value in attributes.items()),
        },
    ]


def spec_digest(spec: DeploymentSpec) -> str:
    """The first 16 hex digits of the SHA-256 of the spec as its ConfigMap carries it: two
    pods with the same digest render the same repository."""
    return hashlib.sha256(Path(spec.file).read_bytes()).hexdigest()[:16]


def _server_container(
    spec: DeploymentSpec,
    options: Options,
    command: list[str],
    resources: dict[str, int],
    serving: bool = True,
    env: Sequence[dict] = (),
    mounts: Sequence[dict] = (),
) -> dict:
    container: dict = {
        "name": "triton" if serving else "ray-worker",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": [{"name": "HOME", "value": WORK_DIR}, *env],
    }
    if serving:
        container["ports"] = container_ports(spec, options)
    quantities = {k: str(v) for k, v in resources.items()}
    if quantities:
        container["resources"] = {"requests": dict(quantities), "limits": dict(quantities)}
    if serving:
        ready, port, live = access.health_check(spec)
        container["startupProbe"] = _probe(
            ready, port, STARTUP_PERIOD_S, STARTUP_BUDGET_S // STARTUP_PERIOD_S
        )
        container["readinessProbe"] = _probe(ready, port, 5, 3)
        container["livenessProbe"] = _probe(live, port, 10, 3)
        container["lifecycle"] = {"preStop": {"exec": {"command": list(DRAIN_COMMAND)}}}
    container["volumeMounts"] = [
        {"name": "work", "mountPath": WORK_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *mounts,
    ]
    return container


def _pod_spec(
    spec: DeploymentSpec,
    app: str,
    containers: list[dict],
    init: bool,
    shm: str,
    mig: bool,
    grace_s: int,
    secrets: Sequence[dict] = (),
) -> dict:
    pod: dict = {"terminationGracePeriodSeconds": grace_s}
    if mig:
        pod["nodeSelector"] = {"nvidia.com/mig.config": mig_config_name(spec)}
    if spec.hardware.gpu != "cpu":
        pod["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if init:
        pod["initContainers"] = [containers.pop(0)]
    pod["containers"] = containers
    volumes = [
        {"name": "work", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
    ]
    if init:
        volumes.append({"name": "spec", "configMap": _spec_volume(spec, app)})
    pod["volumes"] = [*volumes, *secrets]
    return pod


def _spec_volume(spec: DeploymentSpec, app: str) -> dict:
    items = [{"key": SPEC_KEY, "path": SPEC_KEY}]
    item = topology_item(spec)
    if item is not None:
        items.append({"key": TOPOLOGY_KEY, "path": item[0]})
    return {"name": f"{app}-spec", "items": items}


def _uses_mig(plan: Plan, models: tuple[str, ...]) -> bool:
    return any(plan.model(name).mig_profile is not None for name in models)


# ---------------------------------------------------------------------------------------
# Workloads


def server_statefulset(spec: DeploymentSpec, plan: Plan, lay: Layout, options: Options) -> dict:
    """The tritonserver of every single-node model (and the router)."""
    resources = gpu_resources(plan, lay.single)
    gpus = sum(resources.values())
    load = (
        _with_replicas(spec, plan, lay.single) + ((spec.router.name,) if spec.router else ())
        if lay.spanning
        else None
    )
    # The frontend serves the router, or every model of this server when there is none.
    expose = (spec.router.name,) if spec.router else lay.single
    volumes, mounts = access.secret_volumes(spec, lay.app, options)
    containers = [
        _init_container(spec, options),
        _server_container(
            spec,
            options,
            _serve_command(spec, options, load, expose),
            resources,
            env=[
                *access.server_env(spec, lay.app),
                *tracing_env(spec, options, f"{lay.app}-server"),
            ],
            mounts=mounts,
        ),
    ]
    labels = names.labels(lay.app, "server")
    pod_labels = {**labels, **pool_member_labels(options)}
    pod = _pod_spec(
        spec,
        lay.app,
        containers,
        True,
        shm_size(plan, lay.single, gpus),
        _uses_mig(plan, lay.single),
        grace_period_s(spec),
        volumes,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": names.metadata(f"{lay.app}-server", options.namespace, labels),
        "spec": {
            "serviceName": f"{lay.app}-server-headless",
            "replicas": 1,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": names.selector(lay.app, "server")},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }


def pool_member_labels(options: Options) -> dict[str, str]:
    """The labels only a serving pod of an InferencePool carries: the engine type by which
    the endpoint picker reads trident's metric names on it (builder/k8s/pool.py). Added to
    the pod template only, never to a selector (a StatefulSet's is immutable)."""
    return {names.ENGINE_TYPE_LABEL: names.ENGINE_TYPE} if options.inference_pool else {}


def _with_replicas(spec: DeploymentSpec, plan: Plan, models: tuple[str, ...]) -> tuple[str, ...]:
    """The Triton models serving `models`: a model with replicas is its replicas and
    its forwarder (builder/plan/replicas.py), all in this pod beside the router, the
    only server whose models its BLS calls reach. GPUs are summed over the model's
    instances, one per replica, as before."""
    routed = routed_replicas(spec, plan)
    return tuple(name for model in models for name in (*routed.get(model, ()), model))


def model_leaderworkerset(
    spec: DeploymentSpec, plan: Plan, lay: Layout, model: str, options: Options
) -> dict:
    """One model over several nodes: the leader renders the repository, starts the Ray
    head and serves the model; each worker joins the leader's Ray cluster with its GPUs."""
    placed: ModelPlan = plan.model(model)
    component = lay.component[model]
    resources = placed.kubernetes_resources
    gpus = sum(resources.values())
    shm = shm_size(plan, (model,), gpus)
    labels = names.labels(lay.app, component)
    leader = _lws_leader(spec, lay, model, component, options, resources, shm)
    worker_command = [
        "sh",
        "-c",
        f'exec ray start --address="$LWS_LEADER_ADDRESS:{RAY_PORT}" --block',
    ]
    worker = _pod_spec(
        spec,
        lay.app,
        [_server_container(spec, options, worker_command, resources, serving=False)],
        False,
        shm,
        False,
        WORKER_GRACE_PERIOD_S,
    )
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": names.metadata(f"{lay.app}-{component}", options.namespace, labels),
        "spec": {
            "replicas": len(placed.instances),
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": placed.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**labels, **pool_member_labels(options)}},
                    "spec": leader,
                },
                "workerTemplate": {"metadata": {"labels": labels}, "spec": worker},
            },
        },
    }


def _lws_leader(
    spec: DeploymentSpec,
    lay: Layout,
    model: str,
    component: str,
    options: Options,
    resources: dict,
    shm: str,
) -> dict:
    """The leader's pod: it renders the repository, starts the Ray head and serves the
    model through its own frontend (with the keys, when given): the router cannot reach
    a model of another pod."""
    serve = " ".join(_serve_command(spec, options, (model,), (model,)))
    leader_command = ["sh", "-c", f"ray start --head --port={RAY_PORT} && exec {serve}"]
    volumes, mounts = access.secret_volumes(spec, lay.app, options)
    keys = [m for m in mounts if m["name"] == "api-keys"]
    return _pod_spec(
        spec,
        lay.app,
        [
            _init_container(spec, options),
            _server_container(
                spec,
                options,
                leader_command,
                resources,
                env=tracing_env(spec, options, f"{lay.app}-{component}"),
                mounts=keys,
            ),
        ],
        True,
        shm,
        False,
        grace_period_s(spec),
        [v for v in volumes if v["name"] == "api-keys"],
    )
