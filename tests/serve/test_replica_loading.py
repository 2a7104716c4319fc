"""Loading a repository with a model rendered as replicas (builder/serve/loading.py):
naming the model loads its replicas first; naming the router alone still loads the
router alone."""

from __future__ import annotations

from builder.serve import loading

DEPENDS = {
    "chat__r0": set(),
    "chat__r1": set(),
    "chat": {"chat__r0", "chat__r1"},
    "one": set(),
    "router": {"chat", "chat__r0", "chat__r1", "one"},
    # A model whose name only resembles: not a replica of what calls it.
    "x": {"chat__r0"},
}


def test_naming_a_model_loads_its_replicas_first():
    assert loading.load_order(["chat"], DEPENDS) == ["chat__r0", "chat__r1", "chat"]
    assert loading.load_order(["chat", "router"], DEPENDS) == [
        "chat__r0",
        "chat__r1",
        "chat",
        "router",
    ]
    # Only a model's own replicas come with it.
    assert loading.load_order(["router"], DEPENDS) == ["router"]
    assert loading.load_order(["x"], DEPENDS) == ["x"]
