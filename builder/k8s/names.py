"""Names and labels of the rendered Kubernetes objects, and the checks on the values a
user passes on the command line (namespace, image, Secret name)."""

from __future__ import annotations

import re

from builder.errors import EXIT_USAGE, TridentError, printable

DEFAULT_IMAGE = "trident:0.1.0"
PART_OF = "trident"
# The Gateway API Inference Extension (GIE) release whose endpoint picker `trident k8s
# --inference-pool` renders (builder/k8s/pool.py): its image, and the pod label by which
# that picker's metrics extractor chooses the metric names of a pod's engine.
GIE_VERSION = "v1.5.0"
DEFAULT_EPP_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{GIE_VERSION}"
ENGINE_TYPE_LABEL = "inference.networking.k8s.io/engine-type"
ENGINE_TYPE = "trident"
# An InferencePool's name: its picker's objects are named `<pool>[-<component>]-epp`, a
# Service among them (an RFC 1035 label of at most 63 characters); a component is at most
# 20 characters (workloads.layout).
POOL_NAME_LIMIT = 63 - len("-epp") - 21

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
# registry/path:tag@digest: no whitespace, no control or quote characters.
# An image reference as the container runtimes parse it (the distribution project's
# reference grammar): [registry[:port]/]path[:tag][@digest], lower-case path components.
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


class K8sError(TridentError):
    """A value that cannot become part of a manifest (exit 2, one line)."""

    exit_code = EXIT_USAGE


def dns_label(text: str, what: str, limit: int = 63) -> str:
    """text as an RFC 1123 label: lower case, runs of other characters as '-'."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    if not label:
        raise K8sError(
            f"{what}: {printable(text)} has no letters or digits to name a Kubernetes object with"
        )
    return label


def _shown(value: str) -> str:
    """The value as an error line shows it: on one line, and an empty one said so."""
    return printable(value) if value else "an empty value"


def check_namespace(value: str) -> str:
    if len(value) > 63 or not _LABEL.fullmatch(value):
        raise K8sError(
            f"--namespace: {printable(value)} is not a namespace name (lower-case "
            "letters, digits and '-', at most 63 characters)"
        )
    return value


def check_secret(value: str, where: str) -> str:
    if not _SUBDOMAIN.fullmatch(value):
        raise K8sError(
            f"{where}: {printable(value)} is not a Secret name (lower-case "
            "letters, digits, '-' and '.')"
        )
    return value


def check_image(value: str, where: str = "--image") -> str:
    if len(value) > 512 or not _IMAGE.fullmatch(value):
        raise K8sError(f"{where}: {_shown(value)} is not an image reference")
    return value


def check_pinned_image(value: str, where: str) -> str:
    """An image reference with a tag or a digest: an upstream component trident did not
    build runs the version the manifests were written for, not whatever `latest` is."""
    check_image(value, where)
    last = value.split("@", 1)[0].rsplit("/", 1)[-1]
    if ":" not in last and "@" not in value:
        raise K8sError(
            f"{where}: {printable(value)} has no tag (pin the version, e.g. {DEFAULT_EPP_IMAGE})"
        )
    return value


def check_gateway_class(value: str) -> str:
    """A GatewayClass's name: an object name (a DNS subdomain)."""
    if not _SUBDOMAIN.fullmatch(value):
        raise K8sError(
            f"--gateway-class: {_shown(value)} is not a GatewayClass name (lower-case "
            "letters, digits, '-' and '.', at most 253 characters)"
        )
    return value


def check_pool_name(value: str) -> str:
    if len(value) > POOL_NAME_LIMIT or not _LABEL_1035.fullmatch(value):
        raise K8sError(
            f"--pool-name: {_shown(value)} is not a DNS label for an InferencePool "
            f"(lower-case letters, digits and '-', starting with a letter, at most "
            f"{POOL_NAME_LIMIT} characters: its picker's objects add '-<workload>-epp')"
        )
    return value


def app_name(spec_name: str) -> str:
    """Prefix of every object: `trident-<spec name>`, short enough for suffixes."""
    return "trident-" + dns_label(spec_name, "name", limit=30)


def labels(app: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "trident",
        "app.kubernetes.io/instance": app,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": PART_OF,
    }


def selector(app: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": app, "app.kubernetes.io/component": component}


def metadata(name: str, namespace: str | None, object_labels: dict[str, str], **extra) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(object_labels)
    meta.update(extra)
    return meta
