"""The router's replica policy in the spec, and the names replicas take.

`router.policy` is the policy of every backend with replicas; `router.backend_policies`
sets it per backend, `router.rules[].policy` per rule (a rule's wins for the requests it
matches). The names and the default are the router's (bls/policy.py), which reads them
from router.json.

A model with replicas renders `<model>__r0` ... (builder/plan/replicas.py): a model
named like a replica could collide with one, so such names are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from bls.policy import DEFAULT_REPLICA_POLICY as DEFAULT_POLICY  # noqa: F401 (the spec's)
from bls.policy import REPLICA_POLICIES as POLICIES
from builder.spec.node import SpecError, _Node

REPLICA_SEPARATOR = "__r"
REPLICA_NAME = re.compile(rf".*{re.escape(REPLICA_SEPARATOR)}[0-9]+")


def check_model_name(node: _Node, name: str) -> None:
    if REPLICA_NAME.fullmatch(name):
        raise node.error(
            f"{name!r} ends in {REPLICA_SEPARATOR}<digits>, the names of a "
            "model's replicas (<model>__r0, ...): choose another name",
            "name",
        )


def parse_backend_policies(
    node: _Node, names: tuple[str, ...], policies: tuple[str, ...] = POLICIES
) -> Mapping[str, str]:
    """`router.backend_policies`: model name → one of `policies` (the field's rule)."""
    policies_node = node.child("backend_policies")
    chosen = {}
    for key in list(policies_node.data):
        if key not in names:
            raise SpecError(
                node.file,
                policies_node.child_path(str(key)),
                f"{key!r} is not a model (models: {', '.join(names)})",
            )
        chosen[key] = policies_node.choice(key, policies)
    policies_node.done()
    return MappingProxyType(chosen)


def backend_policy(router, backend: str) -> str:
    """The policy a backend's replicas are chosen by (without a rule's)."""
    return router.backend_policies.get(backend, router.policy)
