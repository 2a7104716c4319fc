"""The request the router sends a backend for one attempt (bls/model.py, serve): the
client's inputs less the router's own, the tenant's values and the request id, in the
backend engine's interface, with the parameters an engine model checks: errors asked in
band, the trace's parent and the router's proof."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import triton_python_backend_utils as pb_utils

from bls.adapters import ROUTER_ONLY_INPUTS
from trident_common import trust
from trident_common.interface import ERRORS_IN_BAND, ROUTER_PROOF, TRACEPARENT

if TYPE_CHECKING:
    from bls.adapters import Adapters
    from bls.job import Job, RequestId
    from bls.tenants import Tenant, Tenants
    from trident_common.tracing import RouteRecord


class BackendRequests:
    """Makes each attempt's backend request. `proof_key`: the router's (None: it sends no
    proof); `exports_traces`: the router exports its own spans (else Triton's span of
    the client's request is the engine model's parent)."""

    def __init__(
        self,
        adapters: Adapters,
        tenants: Tenants,
        proof_key: bytes | None,
        exports_traces: bool,
    ) -> None:
        self.adapters, self.tenants = adapters, tenants
        self.proof_key, self.exports_traces = proof_key, exports_traces

    def make(
        self, job: Job, backend: str, request_id: RequestId, record: RouteRecord | None
    ) -> pb_utils.InferenceRequest:
        """The backend's request (raises adapters.Unsupported, or BadRequest for a value
        no engine could take). `record`: the router's span of a traced request."""
        request, inbound, adapter = job.request, job.inbound, self.adapters[backend]
        tenant = self.tenants.of(inbound)
        added = self.tenants.inputs(tenant, inbound)
        skipped = ROUTER_ONLY_INPUTS.union(t.name() for t in added) if added else ROUTER_ONLY_INPUTS
        inputs = [t for name, t in inbound.inputs if name not in skipped] + added
        return pb_utils.InferenceRequest(
            model_name=backend,
            inputs=adapter.inputs(inputs, request_id.tensor, inbound.features.adapter),
            requested_output_names=adapter.outputs,
            parameters=self.parameters(inbound.parameters, request_id, tenant, request, record),
        )

    def parameters(
        self,
        parameters: dict[str, Any] | None,
        request_id: RequestId,
        tenant: Tenant | None,
        request: pb_utils.InferenceRequest,
        record: RouteRecord | None,
    ) -> dict[str, Any]:
        """The client's parameters, errors asked in band (interface.ERRORS_IN_BAND: the
        relay could not read an error response), the traceparent of this request's span
        when Triton traces it (the engine model's span joins the trace:
        trident_common/tracing.py), and the router's proof for its id and the values it
        sets for `tenant` (its priority and cache salt) when it has a key."""
        outgoing = {**(parameters or {}), ERRORS_IN_BAND: True}
        if record is not None:  # the engine model's span is the router's span's child
            outgoing[TRACEPARENT] = record.traceparent
        elif not self.exports_traces:  # Triton's span is the parent
            traced = request.trace().get_context()  # ~1 us; None when untraced
            if traced:  # '{"traceparent": "00-..."}'
                traceparent = json.loads(traced).get("traceparent")
                if traceparent:
                    outgoing[TRACEPARENT] = traceparent
        if self.proof_key is None:
            return outgoing
        if tenant is None and request_id.plain_proof is not None:  # made ahead (RequestIds)
            outgoing[ROUTER_PROOF] = request_id.plain_proof
            return outgoing
        outgoing[ROUTER_PROOF] = trust.generate_proof(
            self.proof_key,
            request_id.text,
            tenant.priority if tenant is not None else None,
            tenant.salt if tenant is not None else None,
        )
        return outgoing
