"""The project's one rule for secrets in text, and its one check of URLs a user gives.

`redact` masks what may be a secret in a line about to be printed or logged (CLI errors,
log records, cache errors). `url_credentials` says why a URL in a spec, option or
environment variable carries a credential, without repeating the URL: those values end
up in specs under version control, Kubernetes ConfigMaps, logs and error messages, and
credentials come from the environment or a Secret instead.

Here in engine_cache because engine_cache depends on nothing of trident's; the builder
(spec, CLI, logs) imports it from here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

MASK = "***"
# Shorter values are not plausible secrets, and replacing them would garble messages.
MIN_SECRET_LEN = 6
# Environment variables whose values are secrets (AWS_SECRET_ACCESS_KEY, HF_TOKEN, ...).
_SECRET_NAME = re.compile(r"secret|token|passw|credential|api_?key|access_?key", re.I)
_SCHEME = r"\b[a-z][a-z0-9+.-]*://"
# scheme://user:password@host: everything between "://" and the "@" is a credential,
# and it may contain "/" (an AWS secret does), so a path holding "@" is over-masked
# rather than a secret shown.
_USERINFO = re.compile(rf"({_SCHEME})[^\s@'\"]+@", re.I)
# A URL's query (presigned X-Amz-Signature, ?token=, ?password=) and fragment: nothing
# trident prints needs them, so they are masked whole.
_QUERY = re.compile(rf"({_SCHEME}[^\s?#'\"]*)([?#])[^\s'\"]*", re.I)
# A Redis URL's path is a db number; anything else there (a pasted password) is masked.
_REDIS_PATH = re.compile(
    r"(\brediss?://[^\s/'\"]*/)(?![0-9]{1,2}(?:[?#]|(?![^\s'\"])))"
    r"[^\s'\"]+",
    re.I,
)
# name=value and name: value where the name ends in a credential word (password,
# hf_token, aws_secret_access_key): `password_env: must be ...`, `tokenizer: ...` or
# `tokens_per_minute: ...` in an error line are field names, not secrets.
_ASSIGNMENT = re.compile(
    r"\b(\w*(?:secret|token|passw(?:or)?d|credentials?|api_?key|access_?key(?:_id)?))"
    r"(\s*[=:]\s*)(['\"]?)([^\s,;'\"]+)",
    re.I,
)


def redact(
    text: str, secrets: Iterable[str | None] = (), environ: Mapping[str, str] | None = None
) -> str:
    """text with credentials masked: the given secrets, the values of environment
    variables whose names say secret, URL userinfo, queries and fragments, a Redis URL's
    non-numeric path, and `password=...`-style assignments."""
    environ = os.environ if environ is None else environ
    known = [*secrets, *(value for name, value in environ.items() if _SECRET_NAME.search(name))]
    for secret in sorted(filter(None, known), key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LEN:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUERY.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = _REDIS_PATH.sub(lambda m: m.group(1) + MASK, text)
    return _ASSIGNMENT.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + MASK, text)


def url_credentials(url: str) -> str | None:
    """Why `url` carries a credential (a reason that does not repeat it), or None.

    user:secret@ (an "@" anywhere: a secret may hold "/"), a query string (presigned
    URLs sign with X-Amz-Credential/X-Amz-Signature; ?token=, ?password=) or a fragment."""
    if "@" in url:
        return "contains credentials"
    if "?" in url:
        return "contains a query string (a presigned or token-bearing URL is a credential)"
    if "#" in url:
        return "contains a fragment (#...)"
    return None


def host_of(url: str) -> str:
    """scheme://host of a URL for a message, never what precedes an "@" or follows the
    host (a secret may contain "/", so only what follows the last "@" is the host)."""
    scheme, sep, rest = url.partition("://")
    rest = rest.rsplit("@", 1)[-1]
    host = re.split(r"[/?#\s]", rest, maxsplit=1)[0]
    return f"{scheme}://{host}" if sep else host
