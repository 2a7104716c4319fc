"""What the router's steps share about one client request (bls/model.py): route,
attempt, serve, finish and watch each take the request's Job, and an attempt's steps its
Attempt, instead of passing the same values through every signature."""

from __future__ import annotations

import collections
import itertools
import os
from typing import TYPE_CHECKING, NamedTuple

from bls.adapters import string_tensor
from trident_common import trust
from trident_common.interface import REQUEST_ID

if TYPE_CHECKING:
    # Annotations only: the stub adds pb_utils' classes after the model's files import.
    from collections.abc import Mapping

    import triton_python_backend_utils as pb_utils

    from bls.inbound import Inbound
    from bls.relay import Relay
    from bls.replicas import Choice
    from bls.tenants import Admission


class Job:
    """One client request once its route is known: the request and its sender, when it
    arrived (its deadline counts from then), what the router read from it, the route,
    the relays started for it (one per attempt; the last one still talking gets the
    router's own error) and, for a route with replicas, the chooser's choices."""

    __slots__ = (
        "request",
        "sender",
        "arrival",
        "inbound",
        "route",
        "attempts",
        "choices",
        "admission",
    )

    def __init__(
        self,
        request: pb_utils.InferenceRequest,
        sender: pb_utils.ResponseSender,
        arrival: float,
        inbound: Inbound,
        route: str,
        attempts: list[Relay],
    ) -> None:
        self.request, self.sender, self.arrival = request, sender, arrival
        self.inbound, self.route, self.attempts = inbound, route, attempts
        self.choices: Mapping[str, Choice] | None = None
        # The tenant's admission when it is still under way as the first attempt is
        # prepared (a remote tenant store: bls/tenants.py, Tenants.run); None otherwise.
        self.admission: Admission | None = None


class Attempt:
    """One backend's try at a Job: the backend, the request id it knows the request by
    and the relay carrying its stream. The id is unpredictable (RequestIds): a backend
    aborts by it, and the first request with an id owns it (trident_common/aborts.py), so
    every instance of the router, each naming ids after the same model, must draw ids that
    never meet. An abort needs the router's proof for its id (trident_common/trust.py);
    that the id is also unguessable is defence in depth."""

    __slots__ = ("backend", "request_id", "relay")

    def __init__(self, backend: str, request_id: str, relay: Relay) -> None:
        self.backend, self.request_id, self.relay = backend, request_id, relay


# Ids kept ready (RequestIds.restock): a quiet router's next requests find theirs made; a
# burst past them makes the rest on the spot.
READY_IDS = 8


class RequestId(NamedTuple):
    """A backend request's id with what the first-token path needs of it, made ahead:
    the request_id input trident's vLLM and SGLang models take, and the router's proof
    for the id when it sets no priority or salt (None: the router has no key)."""

    text: str
    tensor: pb_utils.Tensor
    plain_proof: str | None


class RequestIds:
    """The ids of backend requests (Attempt says why they are random): a counter signed
    with a key drawn once per router process (trust.sign, keyed BLAKE2b), 128 bits kept.
    Unique across router instances (their keys differ), unguessable without the key, and
    made with no system call: os.urandom per request releases the GIL, and the event loop
    that makes the ids then waits to take it back behind the relays (py-spy at 64
    streams: 270-329 of the loop's samples in secrets.token_hex).

    Made ahead, READY_IDS of them, when a request ends (restock): in a serving stub the
    caches are cold again by each request's arrival, and the id's tensor and proof cost
    ~70 and ~15 us of the first-token path there, against a few when made together
    (docs/results/2026-12-06-0205-ids-ahead-and-hiredis.md)."""

    def __init__(self, prefix: str, proof_key: bytes | None = None) -> None:
        self.prefix, self.key, self.count = prefix, os.urandom(32), itertools.count()
        self.proof_key = proof_key
        self.ready: collections.deque[RequestId] = collections.deque()

    def new(self) -> RequestId:
        return self.ready.popleft() if self.ready else self._make()

    def restock(self) -> None:
        """Make ids until READY_IDS wait (off any request's first-token path)."""
        while len(self.ready) < READY_IDS:
            self.ready.append(self._make())

    def _make(self) -> RequestId:
        text = f"{self.prefix}-{trust.sign(self.key, next(self.count))[:32]}"
        proof = None
        if self.proof_key is not None:
            proof = trust.generate_proof(self.proof_key, text, None, None)
        return RequestId(text, string_tensor(REQUEST_ID, text), proof)
