"""The least a BLS hop can cost: three bare relay models installed beside an engine model in
a benchmark's rendered repository, so that the router's first-token time can be split into
what any Python BLS model in front of the engine pays (the request's way from tritonserver
into a second stub and out again, twice) and what the router's own code adds.

- `bls_blocking`: each request relayed on the stub's main thread inside a synchronous
  `execute`, one request at a time, no thread or event-loop hop and no routing: the
  floor. It serves one stream at a time (its `execute` blocks until the answer is done),
  so it is measured sequentially only.
- `bls_threaded`: a synchronous `execute` that makes the BLS request on the stub's main
  thread and hands the call to a pool thread, which relays the stream: the least a relay
  serving many streams at once pays (one thread hop, no event loop, no routing).
- `bls_async`: the idiom of python_backend's `examples/bls_decoupled` (an `async def
  execute` awaiting `async_exec(decoupled=True)`): the stub's hop onto its event loop and
  async_exec's hop into the loop's executor, and nothing else.

All three take the engine model's inputs and forward the client's tensors unchanged, and ask
for errors in band as the router does (interface.ERRORS_IN_BAND); the
models themselves are support/bls_floor_models.py (they import the stub's
`triton_python_backend_utils`, so they load inside a stub only).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKING, THREADED, ASYNC = "bls_blocking", "bls_threaded", "bls_async"
CLASSES = {BLOCKING: "BlockingRelay", THREADED: "ThreadedRelay", ASYNC: "AsyncRelay"}


def install(repo: Path, target: str) -> tuple[str, ...]:
    """Write the relay models into `repo`, each forwarding to the model `target` with
    its inputs and outputs; returns their names."""
    config = (repo / target / "config.pbtxt").read_text()
    for name, cls in CLASSES.items():
        version = repo / name / "1"
        version.mkdir(parents=True)
        renamed, count = re.subn(r'^name: "[^"]*"$', f'name: "{name}"', config, flags=re.M)
        if count != 1:
            raise ValueError(f"{target}/config.pbtxt: no single name line to replace")
        (repo / name / "config.pbtxt").write_text(
            renamed + f'parameters {{ key: "target" value: {{ string_value: "{target}" }} }}\n'
        )
        (version / "model.py").write_text(
            f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            f"from support.bls_floor_models import {cls} as TritonPythonModel\n"
        )
    return tuple(CLASSES)
