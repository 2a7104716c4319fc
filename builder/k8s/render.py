"""`trident k8s` and `trident monitoring`: objects → YAML files → a directory, written
like `trident repo` writes a repository (temp dir, checked, atomic swap, and only over a
directory trident wrote: builder.render.write and builder.render.output_dir).

Deterministic: objects are built in a fixed order and dumped without sorting or
timestamps, so rendering the same spec twice gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from builder.k8s import access, monitoring, names, pool, services, workloads
from builder.k8s.workloads import Options
from builder.plan.model import Plan
from builder.render.write import write_repository
from builder.serve.tracing import Tracing
from builder.spec import DeploymentSpec

KUSTOMIZATION = "kustomization.yaml"


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the spec, the dashboard, PromQL)."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[dict]) -> bytes:
    return yaml.dump_all(
        objects,
        Dumper=_Dumper,
        sort_keys=False,
        width=100,
        allow_unicode=False,
        explicit_start=True,
    ).encode()


def manifests(spec: DeploymentSpec, plan: Plan, options: Options) -> dict[str, list[dict]]:
    """File name → the objects in it, in apply order (config, workloads, monitoring)."""
    access.check(spec, options)
    pool.check(spec, options)
    lay = workloads.layout(spec, plan)
    ns = options.namespace
    files: dict[str, list[dict]] = {
        "configmap-spec.yaml": [workloads.spec_configmap(spec, lay.app, options)]
    }
    if lay.single:
        files["statefulset-server.yaml"] = [workloads.server_statefulset(spec, plan, lay, options)]
    for model in lay.spanning:
        files[f"leaderworkerset-{lay.component[model]}.yaml"] = [
            workloads.model_leaderworkerset(spec, plan, lay, model, options)
        ]
    files["services.yaml"] = services.cluster_services(spec, lay, options)
    files["poddisruptionbudgets.yaml"] = services.disruption_budgets(lay, options)
    if options.inference_pool:
        files.update(pool.manifests(spec, lay, options))
    files["podmonitor.yaml"] = [monitoring.pod_monitor(lay.app, ns)]
    files["prometheusrule.yaml"] = [
        monitoring.prometheus_rule(spec, lay.app, ns, options.ttft_p99_s)
    ]
    files["configmap-dashboard.yaml"] = [monitoring.dashboard_configmap(spec, lay.app, ns)]
    return files


def kustomization(resources: list[str], namespace: str | None) -> dict:
    data: dict = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace:
        data["namespace"] = namespace
    data["resources"] = resources
    return data


def render_files(spec: DeploymentSpec, plan: Plan, options: Options) -> dict[str, bytes]:
    files = {name: dump(objects) for name, objects in manifests(spec, plan, options).items()}
    files[KUSTOMIZATION] = yaml.dump(
        kustomization(list(files), options.namespace), Dumper=_Dumper, sort_keys=False
    ).encode()
    return files


def check_directory(root: Path) -> list[str]:
    """What the write step checks before the swap: every file parses as YAML (or JSON),
    every object has apiVersion, kind and a name, no name twice per kind."""
    problems, seen = [], set()
    for path in sorted(root.glob("*.yaml")) + sorted(root.glob("*.json")):
        try:
            documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{path.name}: not YAML: {e}")
            continue
        for doc in documents:
            if path.name == KUSTOMIZATION or path.suffix == ".json" or "groups" in doc:
                continue
            meta = doc.get("metadata") or {}
            if not (doc.get("apiVersion") and doc.get("kind") and meta.get("name")):
                problems.append(f"{path.name}: an object without apiVersion, kind or name")
                continue
            key = (doc["kind"], meta["name"])
            if key in seen:
                problems.append(f"{path.name}: {doc['kind']} {meta['name']} twice")
            seen.add(key)
    return problems


def write_manifests(spec: DeploymentSpec, plan: Plan, options: Options, out: Path) -> int:
    files = render_files(spec, plan, options)
    write_repository(files, out, check_directory, spec_file=spec.file)
    return len(files)


def write_monitoring(spec: DeploymentSpec, ttft_p99_s: float, out: Path) -> int:
    files = {
        name: text.encode() for name, text in monitoring.monitoring_files(spec, ttft_p99_s).items()
    }
    write_repository(files, out, check_directory, spec_file=spec.file)
    return len(files)


def options(
    namespace: str | None,
    image: str | None,
    cache_secret: str | None,
    ttft_p99_s: float,
    api_keys_secret: str | None = None,
    inference_pool: bool = False,
    pool_name: str | None = None,
    epp_image: str | None = None,
    epp_failure_mode: str | None = None,
    gateway_class: str | None = None,
    otlp_traces_endpoint: str | None = None,
) -> Options:
    """Options from the command line, each checked (one-line errors, exit 2)."""
    for flag, value in (
        ("--pool-name", pool_name),
        ("--epp-image", epp_image),
        ("--epp-failure-mode", epp_failure_mode),
        ("--gateway-class", gateway_class),
    ):
        if value is not None and not inference_pool:
            raise names.K8sError(f"{flag}: only with --inference-pool")
    if epp_failure_mode is not None and epp_failure_mode not in pool.FAILURE_MODES:
        raise names.K8sError(
            f"--epp-failure-mode: {epp_failure_mode!r} is not one of "
            f"{', '.join(pool.FAILURE_MODES)}"
        )
    return Options(
        namespace=names.check_namespace(namespace) if namespace else None,
        image=names.check_image(image) if image else names.DEFAULT_IMAGE,
        cache_secret=names.check_secret(cache_secret, "--cache-secret") if cache_secret else None,
        api_keys_secret=names.check_secret(api_keys_secret, "--api-keys-secret")
        if api_keys_secret
        else None,
        ttft_p99_s=ttft_p99_s,
        inference_pool=inference_pool,
        pool_name=names.check_pool_name(pool_name) if pool_name is not None else None,
        epp_image=names.check_pinned_image(epp_image, "--epp-image")
        if epp_image is not None
        else names.DEFAULT_EPP_IMAGE,
        epp_failure_mode=epp_failure_mode or pool.FAILURE_MODES[0],
        gateway_class=names.check_gateway_class(gateway_class)
        if gateway_class is not None
        else None,
        otlp_traces_endpoint=_traces_endpoint(otlp_traces_endpoint),
    )


def _traces_endpoint(url: str | None) -> str | None:
    """--otlp-traces-endpoint checked as `trident serve` in the pod will check it
    (builder/serve/tracing.py): refused here, in one line, rather than by a pod that then
    never starts."""
    if url is None:
        return None
    if not url or not url.isprintable():
        raise names.K8sError("--otlp-traces-endpoint: empty or not one printable line")
    Tracing.from_env({}, url)  # raises the serve command's own one-line error
    return url
