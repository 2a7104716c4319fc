"""Triton's administrative APIs behind a header that only trident knows.

`trident serve` runs tritonserver in explicit model-control mode, so whoever reaches its
HTTP or gRPC port could load and unload models. Triton 2.51 can restrict API categories to
requests carrying one header with one value (`--http-restricted-api`,
`--grpc-restricted-protocol`); trident restricts the ones nothing outside it needs:
loading and unloading (model-repository, which also holds the index), shared-memory
registration, and the log and trace settings. Inference, health, metadata, model-config
and statistics stay open (the frontend and clients use them).

The value (the admin key) can only be given on tritonserver's command line, which any
local user may read in /proc/PID/cmdline. So it is its own random value per start, never
anything derived from the router secret: reading it grants model control on a server
whose loopback ports that user reaches anyway, and says nothing about the router's proofs
or the tenants' salts. An operator may set their own in the environment (KEY_ENV), e.g.
to control models by hand or to point a separate `trident openai` at the server.

Pure: the caller hands in the environment.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

from builder.errors import EXIT_USAGE, TridentError

HEADER = "trident-admin"
# Triton 2.51 looks for a restricted gRPC protocol's value under this prefixed metadata
# key (its refusal says so); over HTTP it takes the header as named, in any case.
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"
RESTRICTED = ("model-repository", "shared-memory", "logging", "trace")
KEY_ENV = "TRIDENT_TRITON_ADMIN_KEY"
MIN_KEY_CHARS = 32
# The flag's own separators (':' ',' '=') cannot be in the value; neither can space.
_KEY_CHARS = re.compile(r"[A-Za-z0-9_.~-]+")


class AdminKeyError(TridentError):
    """An operator's admin key that Triton could not take or that is too short."""

    exit_code = EXIT_USAGE


def new_key() -> str:
    return secrets.token_hex(32)


def key_from(environ: Mapping[str, str]) -> str:
    """The operator's key from the environment, else a fresh random one."""
    given = environ.get(KEY_ENV, "")
    if not given:
        return new_key()
    if len(given) < MIN_KEY_CHARS or not _KEY_CHARS.fullmatch(given):
        raise AdminKeyError(
            f"{KEY_ENV}: must be at least {MIN_KEY_CHARS} characters of "
            "letters, digits, '_', '.', '~' or '-' (it is not shown)"
        )
    return given


def server_args(key: str) -> list[str]:
    """tritonserver flags restricting RESTRICTED to requests that carry the key. The form
    is `APIS:HEADER=VALUE` (2.51's --help writes `APIS,HEADER=VALUE`; its parser splits
    at the ':')."""
    spec = f"{','.join(RESTRICTED)}:{HEADER}={key}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]


def http_headers(key: str | None) -> dict[str, str]:
    return {HEADER: key} if key else {}


def grpc_headers(key: str | None) -> dict[str, str]:
    return {GRPC_HEADER: key} if key else {}
