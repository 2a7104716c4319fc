"""Monitoring objects on trident's own metrics: a PodMonitor, a PrometheusRule with the
alerts of templates/alerts.yaml.j2, and a Grafana dashboard (templates/dashboard.yaml)
in a ConfigMap labelled for Grafana's dashboard sidecar. `trident monitoring` writes the
rules and the dashboard as plain files for Prometheus and Grafana without Kubernetes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jinja2
import yaml

from builder.k8s import names
from builder.k8s.names import K8sError
from builder.spec import BreakerSpec, DeploymentSpec

TEMPLATES = Path(__file__).resolve().parent / "templates"
SCRAPE_INTERVAL = "15s"
DASHBOARD_FILE = "trident-dashboard.json"


def _threshold(value: float, what: str) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise K8sError(f"{what}: must be a number > 0, got {value}")
    return float(value)


def alert_rules(spec: DeploymentSpec, ttft_p99_s: float) -> list[dict]:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    # Without a router, the alert's threshold is the breaker's own default (bls/router_config.py).
    error_rate = (spec.router.breaker if spec.router else BreakerSpec()).error_rate
    text = env.get_template("alerts.yaml.j2").render(
        error_rate=_threshold(error_rate, "router.breaker.error_rate"),
        ttft_p99_s=_threshold(ttft_p99_s, "--ttft-p99-seconds"),
    )
    return yaml.safe_load(text)


def rule_groups(spec: DeploymentSpec, ttft_p99_s: float) -> list[dict]:
    return [
        {
            "name": f"trident-{names.dns_label(spec.name, 'name')}",
            "rules": alert_rules(spec, ttft_p99_s),
        }
    ]


def dashboard(spec: DeploymentSpec) -> dict:
    """Grafana's dashboard JSON model: one time-series panel per template entry, two
    per row, on a Prometheus data source chosen by the ${datasource} variable."""
    panels = []
    entries = yaml.safe_load((TEMPLATES / "dashboard.yaml").read_text())
    for i, entry in enumerate(entries):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": entry["title"],
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": entry["unit"]}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + k),
                        "expr": q["expr"],
                        "legendFormat": q["legend"],
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    }
                    for k, q in enumerate(entry["queries"])
                ],
            }
        )
    title = f"trident: {spec.name}"
    return {
        "title": title,
        "uid": names.dns_label(f"trident-{spec.name}", "name", limit=40),
        "tags": ["trident", "triton", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Data source",
                }
            ]
        },
        "panels": panels,
    }


def dashboard_json(spec: DeploymentSpec) -> str:
    return json.dumps(dashboard(spec), indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def pod_monitor(app: str, namespace: str | None) -> dict:
    """Scrape Triton's metrics port of every trident pod of this deployment."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": names.metadata(app, namespace, names.labels(app, "monitoring")),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": app}},
            "podMetricsEndpoints": [
                {"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL}
            ],
        },
    }


def prometheus_rule(
    spec: DeploymentSpec, app: str, namespace: str | None, ttft_p99_s: float
) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": names.metadata(app, namespace, names.labels(app, "monitoring")),
        "spec": {"groups": rule_groups(spec, ttft_p99_s)},
    }


def dashboard_configmap(spec: DeploymentSpec, app: str, namespace: str | None) -> dict:
    """Grafana's sidecar loads every ConfigMap labelled grafana_dashboard: "1"."""
    labels = {**names.labels(app, "monitoring"), "grafana_dashboard": "1"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.metadata(f"{app}-dashboard", namespace, labels),
        "data": {DASHBOARD_FILE: dashboard_json(spec)},
    }


def monitoring_files(spec: DeploymentSpec, ttft_p99_s: float) -> dict[str, str]:
    """`trident monitoring`: Prometheus rule file + Grafana dashboard, no Kubernetes."""
    rules = {"groups": rule_groups(spec, ttft_p99_s)}
    return {
        "trident-alerts.yaml": yaml.safe_dump(
            rules, sort_keys=False, width=100, allow_unicode=False
        ),
        DASHBOARD_FILE: dashboard_json(spec),
    }
