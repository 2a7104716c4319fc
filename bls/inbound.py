"""What the router reads from a client's request, and how many requests one backend may
hold (its engine's capacity). Chat messages are checked by trident_common.request's
parse_messages, shared with the engine models."""

import json
import os
import re

# Requests the router lets wait for one backend: its engine's concurrent sequences
# (× instances) running, as many again queued in the engine. More only wait longer for a
# first token; the router sheds them at once with an "overloaded" error instead.
QUEUE_FACTOR = 2
ENGINE_CAPACITY_KEYS = {"vllm": "max_num_seqs", "sglang": "max_running_requests"}


class Inbound:
    """What the router reads from a client's request, once."""

    __slots__ = ("features", "stream", "replaced", "returns", "parameters", "prompt")

    def __init__(self, features, stream, replaced, returns=None, parameters=None, prompt=None):
        self.features, self.stream, self.replaced = features, stream, replaced
        # The prompt's parts, (text, messages): the replicas' prefix index makes its key
        # from them (prefix_index.prompt_key) only for a route with replicas.
        self.prompt = prompt
        # The client's request parameters, forwarded to the backend as they are: they may
        # carry sampling values (vllm_backend's dialect). None when there are none.
        self.parameters = parameters
        # The return_* flags the client sent, name → value (None: it sent none; then
        # the engine reports running token totals, else per-response counts).
        self.returns = returns


def inflight_limit(configured: int, capacity: int | None, instances: int = 1) -> int:
    """One router instance's limit for one backend: the spec's, capped by the engine's,
    shared out among the router's instances (each counts its own requests; rounded up,
    so every instance may send at least one)."""
    limit = configured if capacity is None else min(configured, QUEUE_FACTOR * capacity)
    return -(-limit // max(1, instances))


def engine_capacity(repository: str, backend: str, engine: str) -> int | None:
    """How many sequences a backend's engine runs at once (per-instance limit from its
    model.json × instances in its config.pbtxt), or None when its files do not say."""
    key = ENGINE_CAPACITY_KEYS.get(engine)
    model_dir = os.path.join(repository, backend)
    if key is None or not os.path.isdir(model_dir):
        return None
    try:
        versions = sorted((d for d in os.listdir(model_dir) if d.isdigit()), key=int)
        with open(os.path.join(model_dir, versions[-1], "model.json")) as f:
            per_instance = json.load(f).get(key)
        with open(os.path.join(model_dir, "config.pbtxt")) as f:
            counts = re.findall(r"\bcount:\s*(\d+)", f.read())
    except (OSError, IndexError, ValueError):
        return None  # no readable engine config: the spec's limit alone applies
    if not isinstance(per_instance, int) or per_instance < 1:
        return None
    return per_instance * max(1, sum(int(c) for c in counts))
