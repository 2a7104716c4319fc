"""Does every pin of the lock resolve from the indexes the lock declares (PyPI and its
--extra-index-url lines), with nothing of this machine's pip configuration (local wheel
folders, file:// mirrors) helping? `.ci/run` runs it after `make install`:

    python -m tests.packaging.lock_check requirements.lock

Exit 1 when a reachable index says a pin does not exist (no such project, or no release
file for that version that this interpreter can install). A network failure proves
nothing about the pins, so it only warns (exit 0). Each pin is one request for its
project's simple page (PEP 503), eight at a time, within DEADLINE_S.
"""

from __future__ import annotations

import html
import os
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version
from pip._internal.models import index as _pip_index

# pip's own default index (the lock's implicit first index), as pip itself names it.
PYPI = _pip_index.PyPI.simple_url
DEADLINE_S = 45.0
REQUEST_TIMEOUT_S = 10.0
WORKERS = 8
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)")
ANCHOR = re.compile(r"<a\s[^>]*>([^<]+)</a>", re.IGNORECASE)


class Unreachable(Exception):
    """The index did not answer (connection, timeout, server error): nothing learned."""


@dataclass
class Lock:
    pins: list[tuple[str, str]] = field(default_factory=list)
    indexes: list[str] = field(default_factory=lambda: [PYPI])


def read_lock(path: Path) -> Lock:
    lock = Lock()
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        option = re.match(r"^(--index-url|--extra-index-url|-i)[ =]\s*(\S+)$", line)
        if option:
            if option.group(1) == "--extra-index-url":
                lock.indexes.append(option.group(2).rstrip("/"))
            else:
                lock.indexes[0] = option.group(2).rstrip("/")
            continue
        pin = PIN.match(line)
        if not pin:
            raise ValueError(f"{path}:{number}: not an exact pin (name==version): {line}")
        lock.pins.append((pin.group(1), pin.group(3)))
    return lock


def files_on(index: str, name: str) -> list[str]:
    """File names on the project's simple page; [] when the index has no such project."""
    url = f"{index}/{canonicalize_name(name)}/"
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            page = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise Unreachable(f"{index}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{index}: {getattr(e, 'reason', e)}") from None
    return [html.unescape(text).strip() for text in ANCHOR.findall(page)]


def installable(filenames: list[str], name: str, version: str, tags: frozenset) -> bool:
    """A wheel of name==version for one of these interpreter tags, or its sdist."""
    want_name, want_version = canonicalize_name(name), Version(version)
    for filename in filenames:
        try:
            if filename.endswith(".whl"):
                found, found_version, _, file_tags = parse_wheel_filename(filename)
                if not file_tags & tags:
                    continue
            else:
                found, found_version = parse_sdist_filename(filename)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if found == want_name and found_version == want_version:
            return True
    return False


def check_pin(name: str, version: str, indexes: list[str], tags: frozenset) -> str | None:
    """None when some index has the pin; else 'missing: ...' or 'unreachable: ...'."""
    unreachable = []
    for index in indexes:
        try:
            if installable(files_on(index, name), name, version, tags):
                return None
        except Unreachable as e:
            unreachable.append(str(e))
    if unreachable:
        return (
            f"unreachable: {name}=={version} is not on the indexes that answered "
            f"({'; '.join(unreachable)})"
        )
    return f"missing: {name}=={version} is on none of {', '.join(indexes)}"


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "requirements.lock")
    lock = read_lock(path)
    tags = frozenset(sys_tags())
    started = time.monotonic()
    pool = ThreadPoolExecutor(WORKERS)
    futures = {
        pool.submit(check_pin, name, version, lock.indexes, tags): (name, version)
        for name, version in lock.pins
    }
    done, late = wait(futures, timeout=DEADLINE_S)
    verdicts = [f.result() for f in done]
    missing = [v[len("missing: ") :] for v in verdicts if v and v.startswith("missing")]
    unknown = [v[len("unreachable: ") :] for v in verdicts if v and v.startswith("unreach")]
    unknown += [
        f"{n}=={v}: no answer within {DEADLINE_S:.0f} s" for n, v in (futures[f] for f in late)
    ]
    for line in missing:
        print(f"{path}: {line}", file=sys.stderr)
    if unknown and len(unknown) == len(lock.pins):
        print(f"lock check skipped: no index answered ({unknown[0]})", file=sys.stderr)
    elif unknown:
        print(
            f"warning: lock check: {len(unknown)} pin(s) unchecked, the network failed: "
            f"{unknown[0]}" + (" ..." if len(unknown) > 1 else ""),
            file=sys.stderr,
        )
    print(
        f"lock check: {len(lock.pins) - len(missing) - len(unknown)} of "
        f"{len(lock.pins)} pins resolve from {', '.join(lock.indexes)} "
        f"({time.monotonic() - started:.1f} s)"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    # Requests still running past the deadline are abandoned, not waited for.
    os._exit(1 if missing else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
