"""What the router's steps share about one client request (bls/model.py): route,
attempt, serve, finish and watch each take the request's Job, and an attempt's steps its
Attempt, instead of passing the same values through every signature."""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING

from trident_common import trust

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


class RequestIds:
    """The ids of backend requests (Attempt says why they are random): a counter signed
    with a key drawn once per router process (trust.sign, keyed BLAKE2b), 128 bits kept.
    Unique across router instances (their keys differ), unguessable without the key, and
    made with no system call: os.urandom per request releases the GIL, and the event loop
    that makes the ids then waits to take it back behind the relays (py-spy at 64
    streams: 270-329 of the loop's samples in secrets.token_hex)."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.key, self.count = prefix, os.urandom(32), itertools.count()

    def new(self) -> str:
        return f"{self.prefix}-{trust.sign(self.key, next(self.count))[:32]}"
