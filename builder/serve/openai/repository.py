"""The context length of each model of a rendered repository, for the frontend's
`max_tokens` check (limits.check_max_tokens). Read once at start; the frontend reaches
Triton over gRPC only, and a model's config.pbtxt does not carry its context length.

Only a length the spec set is used (`max_model_len` for vLLM, `context_length` for
SGLang, in the model's model.json): the engine's own default depends on the weights'
config and rope scaling, and guessing it low would refuse requests the engine takes.
The router's length is the largest of its backends' (no backend can give more), and only
when every backend's is known. A file that cannot be read means no check, never a failed
start.
"""

from __future__ import annotations

import json
from pathlib import Path

from builder.engines.traits import TRAITS

# The engine arguments that hold a context length (vLLM's, SGLang's).
CONTEXT_KEYS = tuple(t.context_arg for t in TRAITS.values() if t.context_arg)


def context_tokens(repo: Path) -> dict[str, int]:
    """model name -> context length in tokens, for the models whose length is known."""
    repo = Path(repo)
    contexts: dict[str, int] = {}
    for model_json in sorted(repo.glob("*/1/model.json")):
        length = _context(_load(model_json))
        if length is not None:
            contexts[model_json.parent.parent.name] = length
    for router_json in sorted(repo.glob("*/1/router.json")):
        backends = (_load(router_json) or {}).get("backends")
        # A backend with replicas (`<model>__rN`) has no model.json of its own: theirs.
        lengths = [
            contexts.get(called)
            for name, entry in (backends or {}).items()
            for called in (entry.get("replicas") if isinstance(entry, dict) else None) or [name]
        ]
        known = [n for n in lengths if n is not None]
        if lengths and len(known) == len(lengths):  # every backend's length is known
            contexts[router_json.parent.parent.name] = max(known)
    return contexts


def _context(args: dict | None) -> int | None:
    for key in CONTEXT_KEYS:
        value = (args or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _load(path: Path) -> dict | None:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None
