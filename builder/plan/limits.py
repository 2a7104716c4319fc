"""Limits a spec can break only against its model's own config.json, checked at plan
time (offline): the context length, and the numbers config.json holds."""

from __future__ import annotations

from collections.abc import Callable

from builder.engines.traits import traits
from builder.plan import memory
from builder.spec import DeploymentSpec, ModelSpec, SpecError


def check_context_lengths(
    spec: DeploymentSpec,
    load_shape: Callable[[str], memory.ModelShape],
    model_ref: Callable[[ModelSpec], str],
) -> None:
    """A context length above the model's max_position_embeddings fails here, when the
    model's config.json is at hand (a local folder, a builtin, a well-known id), instead
    of when the engine starts. A config.json with broken numbers fails here too."""
    for i, model in enumerate(spec.models):
        key = traits(model.engine).context_arg
        wanted = model.engine_args.get(key) if key else None
        ref = model_ref(model)
        try:
            shape = load_shape(ref) if ref else None
        except memory.BadModelConfig as e:
            raise SpecError(spec.file, f"models[{i}].model", str(e)) from None
        except memory.UnknownModelSize:
            continue  # a hub id trident cannot read offline: the engine checks it
        if (
            shape is not None
            and shape.max_context_known
            and wanted is not None
            and wanted > shape.max_context
        ):
            raise SpecError(
                spec.file,
                f"models[{i}].engine_args.{key}",
                f"{wanted} is more than the model's max_position_embeddings ({shape.max_context})",
            )
