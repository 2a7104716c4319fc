"""What the router reads from a client's request (chat messages in the shapes clients
send), and how many requests one backend may hold (its engine's capacity)."""
import json
import os
import re

import numpy as np

from trident_common.request import first_scalar

# Requests the router lets wait for one backend: its engine's concurrent sequences
# (× instances) running, as many again queued in the engine. More only wait longer for a
# first token; the router sheds them at once with an "overloaded" error instead.
QUEUE_FACTOR = 2
ENGINE_CAPACITY_KEYS = {"vllm": "max_num_seqs", "sglang": "max_running_requests"}


class Inbound:
    """What the router reads from a client's request, once."""

    __slots__ = ("features", "stream", "replaced")

    def __init__(self, features, stream, replaced):
        self.features, self.stream, self.replaced = features, stream, replaced


def read_messages(array):
    """Chat messages from the `messages` tensor, in the shapes clients send: one JSON
    string holding the list (the documented form), one message object on its own, or one
    message object per element. Returns (messages, the JSON list to forward when it had
    to be rewritten, else None); raises ValueError naming the problem."""
    items = [first_scalar(item) for item in np.asarray(array, dtype=np.object_).reshape(-1)]
    if not items or not all(isinstance(item, str) for item in items):
        raise ValueError("messages must be a JSON string: a list of {role, content} objects")
    try:
        parsed = [json.loads(item) for item in items]
    except ValueError as e:
        raise ValueError(f"messages is not valid JSON: {e}") from None
    if len(parsed) == 1 and isinstance(parsed[0], list):
        return parsed[0], None
    if all(isinstance(message, dict) for message in parsed):
        return parsed, json.dumps(parsed)
    raise ValueError("messages must be a JSON list of {role, content} objects")


def inflight_limit(configured, capacity):
    """The router's limit for one backend: the spec's, capped by the engine's."""
    return configured if capacity is None else min(configured, QUEUE_FACTOR * capacity)


def engine_capacity(repository, backend, engine):
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
        return None   # no readable engine config: the spec's limit alone applies
    if not isinstance(per_instance, int) or per_instance < 1:
        return None
    return per_instance * max(1, sum(int(c) for c in counts))
