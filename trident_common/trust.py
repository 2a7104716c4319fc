"""The router is the only caller whose tenant-sensitive engine inputs count (docs/security.md).

One secret per server, in the environment (interface.ROUTER_SECRET_ENV): tritonserver's
stubs inherit its environment, so the router and the engine models of one server share
it, and nothing else does (it is never rendered into the repository). From it, one key
per purpose (an HMAC of the purpose's name), so a value derived for one use (a tenant's
cache salt, which an engine may log) tells nothing about another (the proofs).

- A proof: the router signs, for each request it sends an engine model, exactly the values
  it vouches for (a keyed BLAKE2b): the request id with the tenant's priority and cache
  salt, or the id it aborts. It travels as the request parameter interface.ROUTER_PROOF;
  the engine model signs the values it received and compares in constant time. A proof is
  good for those values only: seen in a log, it cannot vouch for another salt, priority
  or abort.
- A tenant's prefix-cache salt: an HMAC of the tenant's name, unknowable without the secret.

Pure Python with no Triton: the secret is read from the mapping it is given.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trident_common.interface import ROUTER_PROOF, ROUTER_SECRET_ENV

# `trident serve` generates 64 hex characters; a hand-set secret shorter than this is
# guessable enough to refuse.
MIN_SECRET_CHARS = 32
PROOF, SALT = "router-proof", "cache-salt"  # the purposes keys are derived for
SALT_CHARS = 32


class SecretError(ValueError):
    """The secret in the environment is unusable; the message says what to set."""


def read_secret(environ: Mapping[str, str]) -> bytes | None:
    """The server's router secret, or None when the environment has none."""
    value = environ.get(ROUTER_SECRET_ENV)
    if not value:
        return None
    if len(value) < MIN_SECRET_CHARS:
        raise SecretError(
            f"{ROUTER_SECRET_ENV} is too short ({len(value)} characters, at "
            f"least {MIN_SECRET_CHARS}): unset it to have `trident serve` "
            "generate one, or set a long random value"
        )
    return value.encode("utf-8")


@functools.lru_cache(maxsize=8)
def derive(secret: bytes, purpose: str) -> bytes:
    """The key for one purpose (cached: the router derives per unknown tenant)."""
    return hmac.new(secret, b"trident/" + purpose.encode(), hashlib.sha256).digest()


def proof_key(environ: Mapping[str, str]) -> bytes | None:
    """The key proofs are made and checked with; None without a secret."""
    secret = read_secret(environ)
    return None if secret is None else derive(secret, PROOF)


def _message(fields: Iterable[object]) -> bytes:
    """Fields as one unambiguous byte string: each is its length and text; None
    (absent) is a lone '-', distinct from an empty text ('0:')."""
    parts = []
    for value in fields:
        if value is None:
            parts.append("-")
        else:
            text = str(value)
            parts.append(f"{len(text)}:{text}")
    return "".join(parts).encode("utf-8", "surrogatepass")


def sign(key: bytes, *fields: Any) -> str:
    # Keyed BLAKE2b (RFC 7693's MAC mode, Python's own code) rather than OpenSSL's
    # HMAC-SHA256: the router and the engine model each sign every request on its way to
    # its first token, and in a serving stub the first HMAC of a request took about 50 us
    # against 8 us for BLAKE2b: OpenSSL's long code path is cold again by the next request
    # (docs/results/2026-12-05-1600-router-prep.md).
    return hashlib.blake2b(_message(fields), key=key, digest_size=32).hexdigest()


def generate_proof(
    key: bytes, request_id: str, priority: int | None, cache_salt: str | None
) -> str:
    """The router's proof for a generate request with these router-set values."""
    return sign(key, "generate", request_id, priority, cache_salt)


def abort_proof(key: bytes, request_id: str) -> str:
    """The router's proof for aborting request_id."""
    return sign(key, "abort", request_id)


def _proves(
    key: bytes | None, parameters: Mapping[str, Any] | None, expected: Callable[[bytes], str]
) -> bool:
    if key is None or not parameters:
        return False
    proof = parameters.get(ROUTER_PROOF)
    # compare_digest on str needs ASCII: a client's non-ASCII "proof" is simply wrong.
    if not isinstance(proof, str) or not proof.isascii():
        return False
    return hmac.compare_digest(expected(key), proof)


def proves_generate(
    key: bytes | None,
    parameters: Mapping[str, Any] | None,
    request_id: str,
    priority: int | None,
    cache_salt: str | None,
) -> bool:
    """Did the router send this generate request with exactly these values?"""
    return _proves(key, parameters, lambda k: generate_proof(k, request_id, priority, cache_salt))


def proves_abort(key: bytes | None, parameters: Mapping[str, Any] | None, request_id: str) -> bool:
    """Did the router send this abort?"""
    return _proves(key, parameters, lambda k: abort_proof(k, request_id))


def tenant_salt(tenant: str, environ: Mapping[str, str] = os.environ) -> str:
    """A tenant's prefix-cache salt: a keyed HMAC of its name. Raises SecretError when the
    environment holds no secret (the router refuses to load with tenants then)."""
    secret = read_secret(environ)
    if secret is None:
        raise SecretError(f"tenants need {ROUTER_SECRET_ENV} in tritonserver's environment")
    key = derive(secret, SALT)
    return hmac.new(key, tenant.encode("utf-8"), hashlib.sha256).hexdigest()[:SALT_CHARS]
