"""What the router reads from a client's request, and how many requests one backend may
hold (from its engine's capacity, which the builder writes into router.json). Chat
messages are checked by trident_common.request's parse_messages, shared with the engine
models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Annotations only: the stub adds pb_utils' classes after the model's files import.
    import triton_python_backend_utils as pb_utils

    from bls.policy import RequestFeatures
    from bls.tenant_store import FanOut

# Requests the router lets wait for one backend: its engine's concurrent sequences
# (× instances) running, as many again queued in the engine. More only wait longer for a
# first token; the router sheds them at once with an "overloaded" error instead.
QUEUE_FACTOR = 2


class Inbound:
    """What the router reads from a client's request, once."""

    __slots__ = (
        "features",
        "stream",
        "inputs",
        "returns",
        "parameters",
        "prompt",
        "fan_out",
        "traceparent",
    )

    def __init__(
        self,
        features: RequestFeatures,
        stream: bool,
        inputs: list[tuple[str, pb_utils.Tensor]],
        prompt: tuple[str | None, list[Any] | None],
        returns: dict[str, bool] | None = None,
        parameters: dict[str, Any] | None = None,
        fan_out: FanOut | None = None,
        traceparent: str | None = None,
    ) -> None:
        self.features, self.stream = features, stream
        # The client's inputs by name, in its order, messages normalised (read_request):
        # what the backend request forwards, read from the stub once.
        self.inputs = inputs
        # The prompt's parts, (text, messages): the replicas' prefix index makes its key
        # from them (prefix_index.prompt_key) only for a route with replicas.
        self.prompt = prompt
        # The client's request parameters, forwarded to the backend as they are: they may
        # carry sampling values (vllm_backend's dialect). None when there are none.
        self.parameters = parameters
        # The return_* flags the client sent, name → value (None: it sent none; then
        # the engine reports running token totals, else per-response counts).
        self.returns = returns
        # The OpenAI request's fan-out this request is one choice of (None: not one);
        # its tenant admits the n together (tenants.py).
        self.fan_out = fan_out
        # The traceparent the caller sent as a request parameter besides its metadata
        # (the OpenAI frontend does: tracing.EngineTraces.follow_caller says why).
        self.traceparent = traceparent


def inflight_limit(configured: int, capacity: int | None) -> int:
    """The router's limit for one backend, over all its instances (bls/inflight.py): the
    spec's, capped by the engine's."""
    return configured if capacity is None else min(configured, QUEUE_FACTOR * capacity)
