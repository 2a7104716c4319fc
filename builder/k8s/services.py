"""How the serving workloads (workloads.py) are reached and kept available: a ClusterIP
Service per workload (the StatefulSet's headless governing Service too), which of their
pods serve (the selector an InferencePool and a Service use), and a PodDisruptionBudget
each. Pure: layout + options → objects (plain dicts)."""

from __future__ import annotations

from builder.k8s import names
from builder.k8s.workloads import Layout, Options, container_ports
from builder.spec import DeploymentSpec


def cluster_services(spec: DeploymentSpec, lay: Layout, options: Options) -> list[dict]:
    """Per workload a ClusterIP Service (http, grpc, metrics, openai if configured); the
    StatefulSet also gets its headless governing Service."""
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        for p in container_ports(spec, options)
    ]
    out = []
    if lay.single:
        labels = names.labels(lay.app, "server")
        select = names.selector(lay.app, "server")
        out.append(_service(f"{lay.app}-server", labels, select, ports, options))
        out.append(
            _service(f"{lay.app}-server-headless", labels, select, ports, options, headless=True)
        )
    for model in lay.spanning:
        component = lay.component[model]
        select = serving_selector(lay, component)
        out.append(
            _service(
                f"{lay.app}-{component}", names.labels(lay.app, component), select, ports, options
            )
        )
    return out


def serving_components(lay: Layout) -> list[str]:
    """The workloads whose pods serve requests: the server, then each spanning model."""
    return (["server"] if lay.single else []) + [lay.component[m] for m in lay.spanning]


def serving_selector(lay: Layout, component: str) -> dict[str, str]:
    """The labels of the pods of `component` that serve: all of the StatefulSet's, only
    the leaders of a LeaderWorkerSet (the LWS controller labels them worker-index 0)."""
    select = names.selector(lay.app, component)
    if component != "server":
        select["leaderworkerset.sigs.k8s.io/worker-index"] = "0"
    return select


def _service(name, labels, select, ports, options, headless=False) -> dict:
    spec: dict = {"type": "ClusterIP", "selector": select, "ports": ports}
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(name, options.namespace, labels),
        "spec": spec,
    }


def disruption_budgets(lay: Layout, options: Options) -> list[dict]:
    """At most one pod of a workload down for voluntary disruptions (drains); pods still
    starting (not ready) may always be evicted."""
    components = serving_components(lay)
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": names.metadata(
                f"{lay.app}-{c}", options.namespace, names.labels(lay.app, c)
            ),
            "spec": {
                "maxUnavailable": 1,
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
                "selector": {"matchLabels": names.selector(lay.app, c)},
            },
        }
        for c in components
    ]
