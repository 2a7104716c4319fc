"""What a client of the frontend may reach and what it may say about itself. Pure.

Only exposed models are served (`router` unless the operator names others with
`--expose`): an engine model behind the router skips the router's tenant admission,
rate limits and cache salt, so naming one must not reach it. A model that is not exposed
is answered exactly as one that does not exist.

With API keys the key decides who the client is: its tenant replaces any `tenant` hint,
and the hints that would let a client claim another tenant's treatment (`tier`) are
dropped; the router derives them from the tenant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from builder.serve.openai.errors import invalid, model_not_found
from builder.serve.openai.protocol import Generation
from builder.serve.openai.schema import ADAPTER_CHARS

DEFAULT_EXPOSE = ("router",)
# Hints a keyed client may not set: who it is, and the treatment that follows from that.
TENANT_HINTS = frozenset({"tenant", "tier"})
ADAPTER_SEPARATOR = ":"  # model "router:support": the router, adapter `support`


def resolve(generation: Generation, exposed: Iterable[str]) -> tuple[str, Generation]:
    """(the Triton model to call, the generation with its adapter) for an exposed model,
    named alone or as `MODEL:ADAPTER`; a 404 that names only what the client sent
    otherwise."""
    exposed = frozenset(exposed)
    name = generation.model
    if name in exposed:
        return name, generation
    base, separator, adapter = name.partition(ADAPTER_SEPARATOR)
    if not separator or base not in exposed or not adapter or not set(adapter) <= ADAPTER_CHARS:
        raise model_not_found(name)
    if generation.lora_name not in (None, adapter):
        raise invalid(
            "lora_name",
            f"'lora_name' is {generation.lora_name!r} but 'model' "
            f"names adapter {adapter!r}: name one",
        )
    return base, replace(generation, lora_name=adapter)


def as_tenant(generation: Generation, tenant: str | None) -> Generation:
    """The generation as the keyed client `tenant` may send it (None: no keys, as sent)."""
    if tenant is None:
        return generation
    hints = {k: v for k, v in generation.hints.items() if k not in TENANT_HINTS}
    return replace(generation, hints={**hints, "tenant": tenant})
