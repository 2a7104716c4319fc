"""Who may set which engine input (trust.py, request.py): the router's proof, the keyed
tenant salt, the priority of a direct request, and integer ranges. Pure Python."""

from __future__ import annotations

import hashlib

import pytest

from builder.spec.tenants import TIERS
from tests.python_backends.test_request import getter
from trident_common import trust
from trident_common.interface import ROUTER_PROOF, ROUTER_SECRET_ENV, UNPROVEN_PRIORITY
from trident_common.request import BadRequest, GenerateRequest, parse_generate

SECRET = "a-router-secret-of-enough-characters-0123"
KEY = trust.proof_key({ROUTER_SECRET_ENV: SECRET})


def as_router(key=KEY, **inputs):
    """parse_generate of inputs sent with the router's proof for them."""
    proof = trust.generate_proof(
        KEY, inputs.get("request_id", ""), inputs.get("priority"), inputs.get("cache_salt")
    )
    return parse_generate(getter(**inputs), {ROUTER_PROOF: proof}, key)


# -- the secret and what is derived from it ----------------------------------------------------


def test_no_secret_means_no_key_and_a_short_one_is_refused():
    assert trust.proof_key({}) is None and trust.proof_key({ROUTER_SECRET_ENV: ""}) is None
    with pytest.raises(trust.SecretError, match=f"{ROUTER_SECRET_ENV} is too short"):
        trust.proof_key({ROUTER_SECRET_ENV: "hunter2"})


def test_the_salt_is_keyed_and_not_the_old_computable_hash():
    env = {ROUTER_SECRET_ENV: SECRET}
    salt = trust.tenant_salt("bob", env)
    assert len(salt) == 32 and int(salt, 16) >= 0
    assert salt != hashlib.sha256(b"bob").hexdigest()[:32]  # what anyone could compute
    assert salt == trust.tenant_salt("bob", env) != trust.tenant_salt("alice", env)
    assert salt != trust.tenant_salt("bob", {ROUTER_SECRET_ENV: SECRET + "x"})
    with pytest.raises(trust.SecretError, match=ROUTER_SECRET_ENV):
        trust.tenant_salt("bob", {})


def test_keys_differ_per_purpose_and_proofs_per_value():
    secret = SECRET.encode()
    assert trust.derive(secret, trust.PROOF) != trust.derive(secret, trust.SALT)
    proofs = {
        trust.generate_proof(KEY, "r1", None, "s"),
        trust.generate_proof(KEY, "r1", 0, "s"),
        trust.generate_proof(KEY, "r1", None, ""),
        trust.generate_proof(KEY, "r1s", None, None),
        trust.generate_proof(KEY, "r1", None, None),
        trust.abort_proof(KEY, "r1"),
    }
    assert len(proofs) == 6


# -- an engine model's request --------------------------------------------------------------------


def test_a_direct_request_may_not_set_the_salt_or_the_priority():
    with pytest.raises(BadRequest, match="^cache_salt is set by the router only"):
        parse_generate(getter(text_input="hi", cache_salt="0" * 32), {}, KEY)
    with pytest.raises(BadRequest, match="^priority is set by the router only"):
        parse_generate(getter(text_input="hi", priority=0), {}, KEY)


def test_a_proof_for_other_values_or_from_another_key_is_refused():
    proof = trust.generate_proof(KEY, "r1", 1, "alice-salt")
    for inputs in (
        {"cache_salt": "bob-salt", "priority": 1},  # another tenant's salt
        {"cache_salt": "alice-salt", "priority": 0},
    ):  # a better tier
        with pytest.raises(BadRequest, match="set by the router only"):
            parse_generate(
                getter(text_input="hi", request_id="r1", **inputs), {ROUTER_PROOF: proof}, KEY
            )
    other = trust.proof_key({ROUTER_SECRET_ENV: "another-server-secret-0123456789ab"})
    with pytest.raises(BadRequest, match="cache_salt is set by the router only"):
        as_router(other, text_input="hi", request_id="r1", cache_salt="s")
    with pytest.raises(BadRequest, match="cache_salt is set by the router only"):
        as_router(None, text_input="hi", request_id="r1", cache_salt="s")  # no secret here


def test_the_routers_values_pass_and_mark_the_request_proven():
    request = as_router(text_input="hi", request_id="router-1", priority=1, cache_salt="s")
    assert (request.priority, request.cache_salt, request.proven) == (1, "s", True)
    assert as_router(text_input="hi", request_id="router-2").priority == 0


def test_a_direct_request_is_not_proven_and_waits_behind_every_tier():
    request = parse_generate(getter(text_input="hi", request_id="mine"), {}, KEY)
    assert not request.proven and request.cache_salt is None
    assert request.priority == UNPROVEN_PRIORITY == max(TIERS.values())  # lower goes first
    assert GenerateRequest(None, [], False).priority == UNPROVEN_PRIORITY


def test_only_the_routers_abort_is_an_abort():
    with pytest.raises(BadRequest, match="^abort_request_id is the router's own input"):
        parse_generate(getter(abort_request_id="victim"), {}, KEY)
    with pytest.raises(BadRequest, match="abort_request_id"):  # a generate proof is not one
        parse_generate(
            getter(abort_request_id="victim"),
            {ROUTER_PROOF: trust.generate_proof(KEY, "victim", None, None)},
            KEY,
        )
    with pytest.raises(BadRequest, match="abort_request_id"):
        parse_generate(getter(abort_request_id="victim"), {ROUTER_PROOF: "é" * 64}, KEY)


# -- integer ranges -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling,field",
    [
        ({"max_tokens": 2**32 + 5}, "sampling_parameters.max_tokens"),  # would wrap to 5
        ({"max_tokens": 2**63}, "sampling_parameters.max_tokens"),
        ({"max_tokens": str(2**31)}, "sampling_parameters.max_tokens"),
        ({"top_k": 2**31}, "sampling_parameters.top_k"),
        ({"min_tokens": -(2**31) - 1}, "sampling_parameters.min_tokens"),
        ({"logprobs": 2**40}, "sampling_parameters.logprobs"),
        ({"seed": 2**63}, "sampling_parameters.seed"),
        ({"stop_token_ids": [2, 2**32]}, "sampling_parameters.stop_token_ids"),
        ({"logit_bias": {str(2**32): 1}}, "sampling_parameters.logit_bias"),
    ],
)
def test_integers_out_of_range_are_refused_naming_the_field(sampling, field):
    with pytest.raises(BadRequest, match=f"^{field} is out of range"):
        parse_generate(getter(text_input="hi", sampling_parameters=sampling))


def test_integers_sent_as_request_parameters_are_range_checked_too():
    with pytest.raises(BadRequest, match="^sampling_parameters.max_tokens is out of range"):
        parse_generate(getter(text_input="hi"), {"max_tokens": 2**32 + 5})
    request = parse_generate(
        getter(text_input="hi"),
        {  # the bounds themselves pass
            "max_tokens": 2**31 - 1,
            "seed": 2**63 - 1,
            "top_k": -1,
            "stop_token_ids": "[0]",
        },
    )
    assert request.max_tokens == 2**31 - 1 and request.sampling["seed"] == 2**63 - 1
