"""Who reaches the serving pods, and which secrets they read.

The OpenAI frontend (`server.openai_port` in the spec) runs inside the pod with
`trident serve --openai-port`. With API keys (`--api-keys-secret`), it is the only public
face: Triton's HTTP and gRPC ports bind to the pod's loopback and the Services carry only
`openai` and `metrics`, so no request without a key reaches a model through the
Service. Without keys, Triton's ports stay on every interface and in the Services, as
before. The metrics port is always open: Prometheus scrapes it from elsewhere. Either
way, Triton's model control (load, unload, the index) needs the admin key that `trident
serve` makes at each container start (builder/serve/admin.py): nothing is rendered for it.

Secrets are only ever referenced: the API keys file and the Redis password come from
Secrets the operator creates (names below, documented in docs/kubernetes.md); no value
is rendered. Pure: spec + options → fragments of pod specs.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from builder.errors import printable
from builder.k8s.names import K8sError
from builder.spec import DeploymentSpec
from builder.spec.adapters import adapters_of

LOOPBACK = "127.0.0.1"
EVERYWHERE = "0.0.0.0"
KEYS_DIR = "/etc/trident-keys"
KEYS_KEY = "api-keys"  # the key of the API keys Secret: `KEY TENANT` lines
REDIS_KEY = "password"  # the key of the Redis password Secret


def redis_secret_name(app: str) -> str:
    """The Secret the operator creates with the Redis password under key `password`."""
    return f"{app}-redis"


def keyed(options) -> bool:
    return bool(options.api_keys_secret)


def check(spec: DeploymentSpec, options) -> None:
    """What cannot work in a pod, refused in one line before anything is written."""
    if keyed(options) and spec.server.openai_port is None:
        raise K8sError(
            f"{spec.file}: --api-keys-secret needs server.openai_port in the "
            "spec (the OpenAI frontend is what checks the keys)"
        )
    tenants = spec.tenants
    if tenants and tenants.password_file and not PurePosixPath(tenants.password_file).is_absolute():
        raise K8sError(
            f"{spec.file}: tenants.password_file: "
            f"{printable(tenants.password_file)} is relative; in a pod the "
            "Secret is mounted at an absolute path: give one"
        )
    for i, model in enumerate(spec.models):
        if model.model and _relative_path(model.model, spec.file):
            raise K8sError(
                f"{spec.file}: models[{i}].model: {printable(model.model)} is "
                "a relative path, which does not exist in the pod; give an "
                "absolute path on a volume mounted in the pod, or a Hugging Face "
                "model id"
            )
        for name, path in adapters_of(model).items():  # always folders
            if not PurePosixPath(path).is_absolute():
                raise K8sError(
                    f"{spec.file}: models[{i}].adapters.{printable(name)}: "
                    f"{printable(path)} is a relative path, which does not "
                    "exist in the pod; give an absolute path on a volume "
                    "mounted in the pod"
                )


def _relative_path(value: str, spec_file: str) -> bool:
    """A relative filesystem path rather than a Hugging Face id (`org/name`) or a
    builtin: it starts with '.' or '~', has more than one '/', or names a folder here
    (beside the spec or in the current directory), which the pod will not have."""
    if value.startswith(("builtin:", "s3://", "/")):
        return False
    return (
        value.startswith((".", "~"))
        or value.count("/") > 1
        or Path(value).exists()
        or (Path(spec_file).parent / value).exists()
    )


def serve_args(spec: DeploymentSpec, options, expose: tuple[str, ...]) -> list[str]:
    """The bind addresses and the frontend of `trident serve` in a pod."""
    args = ["--metrics-host", EVERYWHERE]
    if spec.server.openai_port is None:
        return ["--triton-host", EVERYWHERE, *args]
    args = [
        "--triton-host",
        LOOPBACK if keyed(options) else EVERYWHERE,
        *args,
        "--openai-port",
        str(spec.server.openai_port),
        "--openai-host",
        EVERYWHERE,
    ]
    for model in expose:
        args += ["--expose", model]
    if keyed(options):
        args += ["--api-keys-file", f"{KEYS_DIR}/{KEYS_KEY}"]
    return args


def public_ports(spec: DeploymentSpec, options) -> tuple[str, ...]:
    """The named container ports the Services carry (and the pod declares)."""
    openai = ("openai",) if spec.server.openai_port is not None else ()
    if keyed(options):
        return (*openai, "metrics")
    return ("http", "grpc", "metrics", *openai)


def health_check(spec: DeploymentSpec) -> tuple[str, str, str]:
    """(readiness path, port, liveness path) of the probes.

    With the frontend in the pod, keys or not, its endpoints: `/health` answers only
    once Triton is ready and asks Triton on every call, so readiness still reflects
    Triton, and it also answers 503 from the first moment of a drain, which Triton's
    /v2/health/ready does not. Kubernetes takes a terminating pod out of the Service's
    ready endpoints anyway, but the EndpointSlice's `serving` condition of a terminating
    endpoint follows readiness, and kube-proxy sends new connections to serving
    terminating endpoints when a Service has no ready one left (a single replica during
    its rollout): with Triton's probe a draining pod would keep getting requests it can
    only refuse. `/health/live` stays 200 while draining, so a drain never fails
    liveness and gets the container restarted mid-drain. Without the frontend, Triton's
    own endpoints on `http` (not drain-aware: docs/kubernetes.md)."""
    if spec.server.openai_port is not None:
        return "/health", "openai", "/health/live"
    return "/v2/health/ready", "http", "/v2/health/live"


def server_env(spec: DeploymentSpec, app: str) -> list[dict]:
    """tenants.password_env as a secretKeyRef: the router reads it in the server."""
    tenants = spec.tenants
    if not tenants or not tenants.password_env:
        return []
    return [
        {
            "name": tenants.password_env,
            "valueFrom": {"secretKeyRef": {"name": redis_secret_name(app), "key": REDIS_KEY}},
        }
    ]


def secret_volumes(spec: DeploymentSpec, app: str, options) -> tuple[list[dict], list[dict]]:
    """(volumes, server container mounts): the API keys file, and the Redis password
    file at tenants.password_file (one key of the Secret, mounted as that file)."""
    volumes, mounts = [], []
    if keyed(options):
        volumes.append(
            {
                "name": "api-keys",
                "secret": {
                    "secretName": options.api_keys_secret,
                    "items": [{"key": KEYS_KEY, "path": KEYS_KEY}],
                },
            }
        )
        mounts.append({"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True})
    tenants = spec.tenants
    if tenants and tenants.password_file:
        volumes.append(
            {
                "name": "redis-password",
                "secret": {
                    "secretName": redis_secret_name(app),
                    "items": [{"key": REDIS_KEY, "path": REDIS_KEY}],
                },
            }
        )
        mounts.append(
            {
                "name": "redis-password",
                "mountPath": tenants.password_file,
                "subPath": REDIS_KEY,
                "readOnly": True,
            }
        )
    return volumes, mounts
