"""The OpenAI frontend's API keys (--api-keys-file): the file, 401s, the tenant a key sets."""

from __future__ import annotations

import os
import socket

import pytest
from fastapi.testclient import TestClient

from builder.cli.main import main
from builder.serve.openai.app import create_app
from builder.serve.openai.errors import from_triton
from builder.serve.openai.keys import MAX_KEYS_BYTES, KeysFileError, load_keys
from builder.serve.openai.tensors import ModelInfo, Piece, build_inputs
from tests.helpers import hostile_specs as hs
from tests.serve.test_openai_app import FakeTriton

SECRET = "sk-alice-0123456789"
CHAT = {"model": "router", "messages": [{"role": "user", "content": "Hi"}]}


class RecordingTriton(FakeTriton):
    def stream(self, generation, info):
        self.generations = getattr(self, "generations", []) + [generation]
        return super().stream(generation, info)


def app_with_keys():
    triton = RecordingTriton([Piece("Hi", "stop", 1, 1, "smollm2")])
    return TestClient(create_app("unused", triton, {SECRET: "alice"})), triton


def test_the_file_has_one_key_and_tenant_per_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# comment\n\n{SECRET} alice\nsk-bob bob\n")
    assert load_keys(path) == {SECRET: "alice", "sk-bob": "bob"}


def test_a_tenant_the_spec_allows_the_keys_file_allows(tmp_path):
    """Issue 34: `team@example.org` is a tenant name to the spec and the router, and the
    keys file refused it (one rule now: bls/tenant_names.py)."""
    from builder.spec import parse_spec

    tenant = "team@example.org"
    spec = {"models": [{"name": "a", "engine": "vllm", "model": "org/m"}], "router": {}}
    parse_spec({**spec, "tenants": {"limits": {tenant: {}}}})
    path = tmp_path / "keys"
    path.write_text(f"{SECRET} {tenant}\n")
    assert load_keys(path) == {SECRET: tenant}


@pytest.mark.parametrize(
    "text, why",
    [
        (f"{SECRET}\n", "expected `KEY TENANT`"),
        (f"{SECRET} alice extra\n", "expected `KEY TENANT`"),
        (f"{SECRET} al/ice\n", "a tenant name is"),
        (f"{SECRET} -alice\n", "a tenant name is"),
        (f"{SECRET} alice\n{SECRET} bob\n", "already on an earlier line"),
        ("# nothing\n", "no `KEY TENANT` line"),
    ],
)
def test_a_bad_file_is_refused_without_showing_a_key(tmp_path, text, why):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(KeysFileError, match=why) as error:
        load_keys(path)
    assert SECRET not in str(error.value) and error.value.exit_code == 2


def test_the_cli_names_the_file_and_never_the_key(tmp_path, capsys):
    path = tmp_path / "keys"
    path.write_text(f"{SECRET}\n")
    assert main(["openai", "--api-keys-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1" in err and SECRET not in err
    assert main(["serve", "--repo", str(tmp_path), "--api-keys-file", str(path)]) == 2
    assert main(["openai", "--api-keys-file", str(tmp_path / "no")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": SECRET}]
)
def test_a_missing_or_unknown_key_is_401_in_openai_shape(headers):
    client, triton = app_with_keys()
    for response in (
        client.post("/v1/chat/completions", json=CHAT, headers=headers),
        client.get("/v1/models", headers=headers),
    ):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert "sk-wrong" not in response.text
    assert not triton.calls


def test_a_known_key_sets_the_tenant_over_the_clients_own():
    client, triton = app_with_keys()
    response = client.post(
        "/v1/chat/completions",
        json={**CHAT, "tenant": "bob"},
        headers={"Authorization": f"Bearer {SECRET}", "X-Trident-Tenant": "carol"},
    )
    assert response.status_code == 200, response.text
    assert triton.generations[0].hints["tenant"] == "alice"


def test_without_keys_no_key_is_needed():
    client = TestClient(create_app("unused", RecordingTriton([Piece("Hi", "stop", 1, 1)])))
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_the_routers_tenant_limit_is_429():
    error = from_triton("rate limit: tenant 'alice' is over 3 requests per minute", "router")
    assert error.status == 429 and error.body()["error"]["code"] == "rate_limit_exceeded"


def test_a_keyed_client_cannot_set_its_tier_or_any_tenant_input():
    # Before: `tier` (body or X-Trident-Tier) reached the router, so a keyed client
    # routed itself as premium.
    client, triton = app_with_keys()
    response = client.post(
        "/v1/chat/completions",
        json={
            **CHAT,
            "tier": "premium",
            "tenant": "bob",
            "conversation_id": "c-1",
        },
        headers={
            "Authorization": f"Bearer {SECRET}",
            "X-Trident-Tier": "premium",
            "X-Trident-Priority": "-100",
            "X-Trident-Cache-Salt": "bobs-salt",
        },
    )
    assert response.status_code == 200, response.text
    generation = triton.generations[0]
    assert generation.hints == {"tenant": "alice", "conversation_id": "c-1"}
    # What reaches Triton, on a model that would take every one of these inputs.
    inputs = {
        name: "TYPE_STRING"
        for name in ("messages", "tenant", "tier", "priority", "cache_salt", "conversation_id")
    }
    sent = {t.name() for t in build_inputs(generation, ModelInfo("router", inputs, False))}
    assert sent == {"messages", "tenant", "conversation_id"}
    # The engine's tenant inputs in the body are refused, naming them (issue 34: they were
    # dropped without a word); their X-Trident-* headers above are no hint, and ignored.
    for name, value in (("priority", -100), ("cache_salt", "bobs-salt")):
        response = client.post(
            "/v1/chat/completions",
            json={**CHAT, name: value},
            headers={"Authorization": f"Bearer {SECRET}"},
        )
        assert response.status_code == 400 and response.json()["error"]["param"] == name
    # Without keys the network is trusted: the client's own hints pass.
    triton = RecordingTriton([Piece("Hi", "stop", 1, 1)])
    TestClient(create_app("unused", triton)).post(
        "/v1/chat/completions", json={**CHAT, "tier": "gold", "tenant": "bob"}
    )
    assert triton.generations[0].hints == {"tier": "gold", "tenant": "bob"}


def test_a_key_does_not_reach_an_engine_model():
    # Before: `model: smollm2` with a valid key skipped the router's admission: a tenant
    # at its limit got 7 of 7 answers that way.
    client, triton = app_with_keys()
    headers = {"Authorization": f"Bearer {SECRET}"}
    response = client.post(
        "/v1/chat/completions", json={**CHAT, "model": "smollm2"}, headers=headers
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert [m["id"] for m in client.get("/v1/models", headers=headers).json()["data"]] == ["router"]
    assert not triton.calls


def test_expose_takes_model_names_and_needs_the_frontend(tmp_path, capsys):
    assert main(["openai", "--expose", "router:x"]) == 2
    assert "'router:x' is not a model name" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tmp_path), "--expose", "router"]) == 2
    assert "--expose needs --openai-port" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# Files that are not a small UTF-8 text file: refused at once, in one line, exit 2.


def test_a_named_pipe_as_the_keys_file_is_refused_at_once(tmp_path):
    # Before: Path.read_text waited for a writer, so `trident openai` never started.
    os.mkfifo(tmp_path / "keys")
    with socket.socket() as s:  # a free port: serve checks it before reading the keys
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for argv in (
        ["openai", "--api-keys-file", str(tmp_path / "keys"), "--port", port],
        [
            "serve",
            "--repo",
            str(tmp_path),
            "--api-keys-file",
            str(tmp_path / "keys"),
            "--openai-port",
            port,
        ],
    ):
        code, stderr = hs.call_cli(argv)
        assert code == 2 and "Traceback" not in stderr, stderr
        assert stderr.count("\n") == 1 and "not a regular file" in stderr, stderr


def test_a_keys_file_past_the_bound_is_refused_before_it_is_split(tmp_path):
    # Before: read whole (/dev/zero ended in a bare MemoryError); a device is now refused
    # as not a regular file, and a regular file past MAX_KEYS_BYTES by its size.
    big = tmp_path / "keys"
    with open(big, "wb") as f:
        f.truncate(MAX_KEYS_BYTES + 1)  # sparse: no disk, no time
    with pytest.raises(KeysFileError, match="larger than 16 MiB"):
        load_keys(big)
    with pytest.raises(KeysFileError, match="not a regular file"):
        load_keys("/dev/zero")


def test_a_keys_file_of_a_hundred_thousand_keys_fits_the_bound(tmp_path):
    path = tmp_path / "keys"
    path.write_text("".join(f"sk-{i:064x} tenant-{i % 1000}\n" for i in range(100_000)))
    assert len(load_keys(path)) == 100_000


def test_bad_bytes_name_the_file_and_line_but_no_key(tmp_path):
    # Before: "cannot read the API keys file: UnicodeDecodeError", no line.
    path = tmp_path / "keys"
    path.write_bytes(f"{SECRET} alice\nsk-b\xe9b bob\n".encode("latin-1"))
    with pytest.raises(KeysFileError) as error:
        load_keys(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "line 2: not UTF-8 text" in message
    assert SECRET not in message and "sk-b" not in message
    assert "0xe9" not in message  # the bad byte is part of a key: not even that
