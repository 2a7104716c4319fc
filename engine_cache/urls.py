"""The one check of each URL a user gives trident: an S3 URI (the engine cache's S3 tier,
a checkpoint), an S3 endpoint URL and a Redis URL (the tenants' counters).

Each `*_problem` function says why a value is refused, or returns None. The reason never
repeats the value: a refused URL may hold a credential, and even an accepted one ends up
in specs under version control, ConfigMaps and logs. A credential is looked for first,
so that the reason names it rather than a format rule it also breaks. The patterns are
the JSON Schema's too (`trident schema`), written so that ECMA-262 reads them the same.

Read by the spec's parser and schema (builder/spec), `trident engines` and the engine
cache; here in engine_cache, beside redact, because engine_cache depends on nothing of
trident's. The router does not parse a Redis URL itself: redis-py does, on one that
passed here when the spec was read.
"""

from __future__ import annotations

import re

from engine_cache.redact import url_credentials

AWS_CREDENTIALS_HINT = (
    "credentials go in the standard AWS environment variables "
    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or an AWS profile "
    "(AWS_PROFILE)"
)
REDIS_PASSWORD_HINT = "the password goes in password_env or password_file"

# A port in 1..65535, as a pattern (JSON Schema has no numeric check inside a string).
PORT = (
    r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
    r"|[1-9][0-9]{0,3})"
)
# A bracketed IPv6 address or a name (`_` too: container runtimes resolve such names).
HOST = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
# s3://bucket[/prefix]: a bucket is 3-63 lower-case letters, digits, '.' and '-' (S3's
# naming rule), starting and ending with a letter or digit.
S3_URI = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s@?#]*)?"
ENDPOINT_URL = rf"https?://{HOST}(:{PORT})?(/[^\s?#@]*)?"
REDIS_URL = rf"rediss?://{HOST}(:{PORT})?(/([0-9]{{1,2}})?)?"
# host:port with a numeric port (an IPv6 host is bracketed: its last ':' is the port's).
_NUMERIC_PORT = re.compile(r".*:(?P<port>[0-9]+)")


def s3_uri_problem(uri: object) -> str | None:
    """Why `uri` is not an s3://bucket[/prefix] URI trident accepts, or None."""
    if not isinstance(uri, str):
        return "is not an s3://bucket[/prefix] URI"
    scheme, _, rest = uri.partition("://")
    bucket = rest.partition("/")[0]
    # KEY:SECRET@bucket (a secret may hold "/"), a presigned query, a fragment; in an
    # s3:// URI a ":" in the bucket is a credential too (never in a bucket name).
    problem = url_credentials(uri) or (scheme == "s3" and ":" in bucket and "contains credentials")
    if problem:
        return f"{problem}; {AWS_CREDENTIALS_HINT}"
    if scheme != "s3" or not uri.startswith("s3://"):
        return "is not an s3://bucket[/prefix] URI"
    if not bucket:
        return "names no bucket (s3://bucket[/prefix])"
    if re.fullmatch(S3_URI, uri) is None:
        return (
            "is not an s3://bucket[/prefix] URI (a bucket is 3-63 lower-case letters, "
            "digits, '.' and '-')"
        )
    return None


def endpoint_url_problem(url: str) -> str | None:
    """Why `url` is not an http(s)://host[:port] endpoint trident accepts, or None."""
    problem = url_credentials(url)
    if problem:
        return f"{problem}; {AWS_CREDENTIALS_HINT}"
    if re.fullmatch(ENDPOINT_URL, url) is None:
        return _port_problem(url.partition("://")[2]) or "is not an http(s)://host[:port] URL"
    return None


def redis_url_problem(url: str) -> str | None:
    """Why `url` is not a redis[s]://host[:port][/db] URL trident accepts, or None. Only
    a port number is ever repeated: the db's place may hold a password
    (redis://host:6379/secret)."""
    problem = url_credentials(url)
    if problem:
        problem = "must not hold a password (user:secret@)" if "@" in url else problem
        return f"{problem}; give the password in password_env or password_file"
    if re.fullmatch(REDIS_URL, url) is not None:
        return None
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("redis", "rediss"):
        authority, slash, db = rest.partition("/")
        port = _port_problem(authority)
        if port:
            return port
        if slash and re.fullmatch(r"[0-9]{0,2}", db) is None:
            return (
                f"the db (after the host's '/') is not a number from 0 to 99; {REDIS_PASSWORD_HINT}"
            )
    return (
        f"is not a redis://host[:port][/db] URL (db: a number from 0 to 99; {REDIS_PASSWORD_HINT})"
    )


def _port_problem(rest: str) -> str | None:
    """The reason a numeric port after the host is out of range (the number is said
    only when short: a long run of digits may be a pasted secret)."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    port = _NUMERIC_PORT.fullmatch(authority)
    if port is None or re.fullmatch(PORT, port["port"]) is not None:
        return None
    number = port["port"]
    return f"port {number} is not in 1..65535" if len(number) < 7 else "the port is not in 1..65535"
