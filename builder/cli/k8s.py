"""`trident k8s` (Kubernetes manifests + kustomization.yaml from a spec and its plan) and
`trident monitoring` (Prometheus alert rules + Grafana dashboard as plain files).

Exit codes: 0 written; 1 the models do not fit the hardware; 2 bad input (spec defect,
bad option, an output directory trident did not write)."""

from __future__ import annotations

from pathlib import Path

import click

from builder.cli.common import otlp_traces_option, sigterm_as_interrupt, spec_option

_ttft_option = click.option(
    "--ttft-p99-seconds",
    "ttft_p99",
    type=float,
    default=2.0,
    show_default=True,
    help="TTFT p99 above which the TridentTimeToFirstTokenHigh alert fires",
)


@click.command("k8s")
@spec_option()
@click.option("--out", required=True, metavar="DIR", help="manifest directory to (re)place")
@click.option(
    "--namespace", metavar="NS", help="namespace of every object (and of the kustomization)"
)
@click.option(
    "--image",
    metavar="IMAGE",
    help="image with trident, tritonserver and the engines (default trident:0.1.0)",
)
@click.option(
    "--cache-secret",
    metavar="NAME",
    help="Secret with AWS_* for the S3 engine "
    "cache (default: engine_cache.credentials_secret); referenced, never read",
)
@click.option(
    "--api-keys-secret",
    metavar="NAME",
    help="Secret whose key `api-keys` holds "
    "the OpenAI frontend's keys (`KEY TENANT` lines); needs server.openai_port. "
    "Triton's HTTP/gRPC ports then stay inside the pod; referenced, never read",
)
@click.option(
    "--inference-pool",
    is_flag=True,
    help="also render an InferencePool (Gateway API Inference Extension) per serving "
    "workload and its endpoint picker (Deployment, Service, RBAC, config); needs "
    "server.openai_port (docs/kubernetes.md)",
)
@click.option(
    "--pool-name",
    metavar="NAME",
    help="the InferencePool's name (default trident-<name>; NAME-<workload> when the "
    "spec has several serving workloads)",
)
@click.option(
    "--epp-image",
    metavar="IMAGE",
    help="the endpoint picker's image, with a tag "
    "(default registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0)",
)
@click.option(
    "--epp-failure-mode",
    metavar="MODE",
    help="what the gateway does while the picker does not answer: FailOpen (its own "
    "choice among the pool's pods; default) or FailClose (refuse)",
)
@click.option(
    "--gateway-class",
    metavar="NAME",
    help="with --inference-pool: also a Gateway of this GatewayClass (one HTTP listener, "
    "port 80) and an HTTPRoute from it to the pool (gateway.networking.k8s.io/v1)",
)
@otlp_traces_option(
    "the serving pods send OpenTelemetry traces here (OTLP over HTTP), with resource "
    "attributes naming the pod, its workload, the deployment and the spec's digest "
    "(docs/kubernetes.md)"
)
@_ttft_option
def k8s(
    spec: str,
    out: str,
    namespace: str | None,
    image: str | None,
    cache_secret: str | None,
    api_keys_secret: str | None,
    inference_pool: bool,
    pool_name: str | None,
    epp_image: str | None,
    epp_failure_mode: str | None,
    gateway_class: str | None,
    otlp_traces_endpoint: str | None,
    ttft_p99: float,
) -> int:
    """Render Kubernetes manifests for a spec: `kubectl apply -k DIR`."""
    from builder.k8s import access, pool, render
    from builder.plan.planner import plan_for_spec
    from builder.render import output_dir
    from builder.spec import load_spec

    loaded = load_spec(spec)
    options = render.options(
        namespace,
        image,
        cache_secret,
        ttft_p99,
        api_keys_secret,
        inference_pool=inference_pool,
        pool_name=pool_name,
        epp_image=epp_image,
        epp_failure_mode=epp_failure_mode,
        gateway_class=gateway_class,
        otlp_traces_endpoint=otlp_traces_endpoint,
    )
    access.check(loaded, options)  # before planning: cheap to refuse
    pool.check(loaded, options)
    output_dir.check_target(Path(out), [loaded.file])
    with sigterm_as_interrupt():
        written = render.write_manifests(loaded, plan_for_spec(loaded), options, Path(out))
    click.echo(f"wrote {written} manifest file(s) into {out} (kubectl apply -k {out})")
    return 0


@click.command("monitoring")
@spec_option(
    required=False,
    help="deployment spec (YAML): the router's breaker error "
    "rate sets the error-rate alert (default deploy/default.yaml)",
)
@click.option("--out", required=True, metavar="DIR", help="directory to (re)place")
@_ttft_option
def monitoring(spec: str | None, out: str, ttft_p99: float) -> int:
    """Write Prometheus alert rules and a Grafana dashboard for trident's metrics."""
    from builder.k8s import render
    from builder.render.context import PROJECT_ROOT
    from builder.spec import load_spec

    loaded = load_spec(spec or PROJECT_ROOT / "deploy" / "default.yaml")
    with sigterm_as_interrupt():
        written = render.write_monitoring(loaded, ttft_p99, Path(out))
    click.echo(
        f"wrote {written} file(s) into {out} (trident-alerts.yaml for Prometheus' "
        "rule_files, trident-dashboard.json for Grafana)"
    )
    return 0


COMMANDS = [k8s, monitoring]
