"""Loading a repository's models one after another, and saying where a load is stuck.

`trident serve` starts tritonserver with explicit model control and loads each model
through the repository API, dependencies first (engine models, then the router or an
ensemble that calls them). Two vLLM models initializing at once hung tritonserver 2.51 on a
busy machine (its main thread in LoadModelByDependency, both engines ready): one load at a
time avoids that, and a load that does not finish is named with the stage it is in, read
from the server's log and its stub processes.

The order and the stage are pure (tested without a server); `request` is the one HTTP call.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

ROUTER_FILE = "router.json"  # rendered beside the router's model.py: its backends
# How a replica's name ends (builder/spec/router_policy.py; not imported: `trident serve`
# reads files, not specs).
REPLICA = "__r"
_REPLICA = re.compile(rf".+{re.escape(REPLICA)}[0-9]+")
# The ensemble's composing models in a config.pbtxt (the TensorRT-LLM pipeline).
_STEP_MODEL = re.compile(r'\bmodel_name\s*:\s*"([^"]+)"')


class LoadFailed(Exception):
    """The repository API refused a load or an unload; the message is the server's."""


def dependencies(repository: Path) -> dict[str, set[str]]:
    """Each model of a rendered repository and the models it calls: a router's backends
    (its router.json), an ensemble's steps. A model that calls none maps to an empty set."""
    found: dict[str, set[str]] = {}
    for config in sorted(Path(repository).glob("*/config.pbtxt")):
        model = config.parent.name
        calls: set[str] = set()
        try:
            text = config.read_text(errors="replace")
            if "ensemble_scheduling" in text:
                calls.update(_STEP_MODEL.findall(text))
            for router in config.parent.glob(f"*/{ROUTER_FILE}"):
                backends = json.loads(router.read_text()).get("backends", {})
                calls.update(backends)
                # A backend with replicas (`<model>__rN`) is called through them: they
                # load before the router and before `<model>`, which forwards to them.
                for entry in backends.values():
                    calls.update(entry.get("replicas", ()))
        except (OSError, ValueError, AttributeError):
            pass  # unreadable: the server's own load will say what is wrong with it
        found[model] = calls - {model}
    return found


def load_order(wanted: Iterable[str], depends_on: Mapping[str, set[str]]) -> list[str]:
    """`wanted` in an order where every model comes after the wanted models it calls
    (alphabetical among equals, so a start is repeatable). Only `wanted` is loaded:
    `--load-model router` alone loads the router alone; but a model rendered as replicas
    is its replicas, so `--load-model chat` loads `chat__r0`, `chat__r1`, then `chat`.
    A cycle cannot be rendered; if one appears all the same, its models come last,
    alphabetically."""
    remaining = sorted(with_replicas(wanted, depends_on))
    order: list[str] = []
    while remaining:
        free = [m for m in remaining if not (depends_on.get(m, set()) & set(remaining)) - {m}]
        step = free or remaining
        order += step
        remaining = [m for m in remaining if m not in step]
    return order


def with_replicas(wanted: Iterable[str], depends_on: Mapping[str, set[str]]) -> set[str]:
    """`wanted` and the replicas of each (`<model>__rN` that `<model>` calls: the
    forwarder builder/render/replicas.py renders in the model's name)."""
    models = set(wanted)
    return models | {
        called
        for model in models
        for called in depends_on.get(model, ())
        if _REPLICA.fullmatch(called) and called.rsplit(REPLICA, 1)[0] == model
    }


def request(
    http_url: str,
    model: str,
    action: str,
    timeout_s: float | None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """POST /v2/repository/models/MODEL/{load,unload}; returns once the server answered
    (a load answers when the model is READY). `headers`: the server's admin header
    (admin.py), without which trident's servers refuse the call. Raises LoadFailed with
    the server's reason, or OSError (a timeout among them) when it does not answer."""
    call = urllib.request.Request(
        f"{http_url}/v2/repository/models/{model}/{action}",
        data=b"{}",
        headers=dict(headers or {}),
        method="POST",
    )
    try:
        with urllib.request.urlopen(call, timeout=timeout_s):
            return
    except urllib.error.HTTPError as e:
        try:
            reason = str(json.loads(e.read())["error"])
        except (ValueError, KeyError, TypeError, OSError):
            reason = f"HTTP {e.code}"
        raise LoadFailed(reason[:500]) from None


def _message(line: str) -> str:
    """The text of one tritonserver log line (`I1201 16:16:20.10 8423 file.cc:12] "text"`)."""
    return line.split("] ", 1)[-1].strip().strip('"')


def load_stage(model: str, log_lines: list[str], stub_pids: Iterable[int]) -> str:
    """Where the load of `model` stands, in words: what the server's log says since its
    last `loading: MODEL:` line, and whether its stubs run. `log_lines`: the server's
    recent output (newest last); `stub_pids`: the model's live stub processes."""
    start = None
    for index in range(len(log_lines) - 1, -1, -1):
        if f"loading: {model}:" in log_lines[index]:
            start = index
            break
    stubs = sorted(stub_pids)
    running = (
        f"its stub process{'es' if len(stubs) > 1 else ''} {', '.join(map(str, stubs))} running"
        if stubs
        else "no stub process running"
    )
    if start is None:
        return f"tritonserver has not begun loading it ({running})"
    since = [_message(line) for line in log_lines[start + 1 :]]
    instances = [
        m for m in since if m.startswith(f"TRITONBACKEND_ModelInstanceInitialize: {model}_")
    ]
    if not instances:
        return f"tritonserver is preparing it, no instance created yet ({running})"
    said = [
        m
        for m in since
        if not m.startswith("TRITONBACKEND_") and re.search(rf"\b{re.escape(model)}\b", m)
    ]
    last = (
        f"; the model's last log line: {said[-1][:200]!r}"
        if said
        else ("; the model has logged nothing")
    )
    # Not "in initialize()": in the hang seen on a busy machine initialize() had returned
    # and tritonserver never marked the model loaded; the last log line tells which.
    names = ", ".join(dict.fromkeys(m.split(": ", 1)[1].split(" ")[0] for m in instances))
    where = (
        f"instance {names} created, not yet loaded"
        if stubs
        else f"instance {names} created, but its stub exited or never started"
    )
    return f"{where} ({running}){last}"
