"""Stage 1 of the pipeline: the deployment spec, YAML in, typed frozen objects out.

`deployment` holds the typed spec and its parser; `node` the generic checked mapping;
`rules` each field's bounds, choices and patterns, on the field, read by the parser and
the schema alike; `engine_args` and `trtllm` the engine-specific sections; `yaml_loader`
the one reader with limits; `schema` the JSON Schema generated from the typed spec.
"""

from builder.spec.deployment import (
    ENGINES,
    INSTANCE_KINDS,
    BreakerSpec,
    DeploymentSpec,
    EngineCacheSpec,
    HardwareSpec,
    MatchSpec,
    ModelSpec,
    PlacementSpec,
    RouterSpec,
    RuleSpec,
    ServerSpec,
    load_spec,
    parse_spec,
)
from builder.spec.node import SpecError, frozen_mapping, thaw

__all__ = [
    "ENGINES",
    "INSTANCE_KINDS",
    "BreakerSpec",
    "DeploymentSpec",
    "EngineCacheSpec",
    "HardwareSpec",
    "MatchSpec",
    "ModelSpec",
    "PlacementSpec",
    "RouterSpec",
    "RuleSpec",
    "ServerSpec",
    "SpecError",
    "frozen_mapping",
    "load_spec",
    "parse_spec",
    "thaw",
]
