"""Multi-LoRA for real: two random PEFT adapters on SmolLM2 in vLLM (CPU) inside
tritonserver as `primary`, a second real vLLM engine without adapters beside it
(`backup`, tiny-llama, where the free tier's rule routes), and `router` in front: the
session's fallback_server (tests/server/configs.py), whose other tests send no adapter."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from builder.serve import client as infer
from tests.helpers import metric_value, wait_for

pytestmark = [pytest.mark.server, pytest.mark.vllm]
PROMPT = "What is the capital of France?"


def ask(server, model="primary", adapter=None, prompt=PROMPT, max_tokens=16, hints=None):
    sampling = {"temperature": 0}
    if adapter is not None:
        sampling["lora_name"] = adapter
    return infer.stream_generate(
        server.grpc_url, model, prompt, max_tokens=max_tokens, sampling=sampling, hints=hints
    )


# cpu-fallback.yaml's rule for free tenants: `backup`, which holds no adapter.
FREE = {"tier": "free"}


def test_an_adapter_broken_after_rendering_fails_alone(fallback_server):
    """First in this module, before any request has loaded `france`: its file is garbage
    by the time a request names it (changed after `trident repo` checked it). vLLM used to
    load it inside its engine core, whose death failed every later request of every
    client; now that request is the client's error, again on a second try, and the engine
    serves the others. Then the file is written back as it was, for the tests below."""
    adapters = Path(fallback_server.repository).parent / "adapters"  # configs.FALLBACK wrote them
    weights = adapters / "france" / "adapter_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(b"garbage")
    try:
        for _ in range(2):
            with pytest.raises(infer.InferError) as broken:
                ask(fallback_server, adapter="france")
            assert "invalid request: adapter 'france' cannot be loaded" in str(broken.value)
        assert ask(fallback_server).served_by == "primary"
        assert ask(fallback_server, model="router", hints=FREE).served_by == "backup"
    finally:
        weights.write_bytes(good)


def test_an_adapter_changes_the_answer_and_leaves_the_base_alone(fallback_server):
    base = ask(fallback_server)
    paris = ask(fallback_server, adapter="paris")
    france = ask(fallback_server, adapter="france")
    assert len({base.text, paris.text, france.text}) == 3, (base.text, paris.text, france.text)
    assert (base.served_by, paris.served_by, france.served_by) == (
        "primary",
        "primary:paris",
        "primary:france",
    )
    assert ask(fallback_server).text == base.text  # the base is unchanged afterwards
    assert ask(fallback_server, adapter="paris").text == paris.text


def concurrent(server, order):
    with ThreadPoolExecutor(len(order)) as pool:
        return list(pool.map(lambda name: (name, ask(server, adapter=name)), order))


def test_interleaved_concurrent_requests_each_get_their_adapter(fallback_server):
    alone = {name: ask(fallback_server, adapter=name).text for name in ("paris", "france")}
    for name, result in concurrent(fallback_server, ["paris", "france"] * 4):
        assert result.text == alone[name], name
        assert result.served_by == f"primary:{name}"


# Not strict: the defect shows only when vLLM batches a base request with adapter ones,
# which six concurrent requests make likely but cannot force (a loaded CI run once served
# them apart, and the test passed).
@pytest.mark.xfail(
    strict=False,
    reason=(
        "vLLM 0.32 on CPU: the torch-native punica ops (vllm/lora/ops/torch_ops/lora_ops.py, "
        "bgmv_shrink/bgmv_expand) index the LoRA weights with -1 for tokens without an "
        "adapter, which selects the last slot: in a batch that mixes base and adapter "
        "requests the base ones get an adapter. The GPU kernels skip index -1."
    ),
)
def test_base_requests_batched_with_adapter_requests_keep_the_base_answer(fallback_server):
    alone = ask(fallback_server).text
    results = concurrent(fallback_server, [None, "paris", "france"] * 2)
    assert [r.text for name, r in results if name is None] == [alone, alone]


def test_an_unknown_adapter_is_a_clear_error_and_the_server_keeps_serving(fallback_server):
    with pytest.raises(infer.InferError) as direct:
        ask(fallback_server, adapter="nope")
    assert "unknown adapter 'nope'" in str(direct.value)
    assert "model primary has adapters: france, paris" in str(direct.value)
    with pytest.raises(infer.InferError) as routed:
        ask(fallback_server, model="router", adapter="nope")
    assert "no backend holds it (adapters: france (primary), paris (primary))" in str(routed.value)
    with pytest.raises(infer.InferError, match="has adapters: none"):
        ask(fallback_server, model="backup", adapter="paris")
    assert ask(fallback_server, adapter="paris").served_by == "primary:paris"


def test_the_router_sends_adapter_requests_only_to_holders(fallback_server):
    # The free tier's rule names backup alone; an adapter request goes to a holder all the
    # same, unless the client named the route itself.
    assert ask(fallback_server, model="router", hints=FREE).served_by == "backup"
    for _ in range(3):
        routed = ask(fallback_server, model="router", adapter="france", hints=FREE)
        assert routed.served_by == "primary:france"
    with pytest.raises(infer.InferError, match="route 'fast' has no backend holding adapter"):
        ask(fallback_server, model="router", adapter="france", hints={"route": "fast"})
    assert routed.text == ask(fallback_server, adapter="france").text
    router_json = json.loads(
        (Path(fallback_server.repository) / "router" / "1" / "router.json").read_text()
    )
    assert router_json["backends"]["primary"]["adapters"] == ["france", "paris"]
    assert router_json["backends"]["backup"]["adapters"] == []
    # The engine counted every adapter request among its own.
    assert (
        metric_value(
            fallback_server.metrics_url,
            "trident_adapter_requests_total",
            model="primary",
            adapter="france",
        )
        >= 4
    )


def test_the_openai_frontend_passes_the_adapter_a_client_names(fallback_server):
    # Before: the frontend dropped `lora_name` and the base model answered.
    import openai

    from builder.serve.openai.runner import Frontend
    from builder.serve.server import free_port

    grpc = ask(fallback_server, model="router", adapter="paris")
    with Frontend(fallback_server.grpc_url, port=free_port()) as frontend:
        client = openai.OpenAI(
            base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        for kwargs in (
            {"model": "router:paris"},
            {"model": "router", "extra_body": {"lora_name": "paris"}},
        ):
            answer = client.chat.completions.with_raw_response.create(
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=16,
                temperature=0,
                **kwargs,
            )
            assert answer.headers["x-trident-served-by"] == "primary:paris"
            assert answer.parse().choices[0].message.content == grpc.text


def test_the_pods_lora_gauge_names_the_adapters_in_use_as_clients_name_them(fallback_server):
    """What the endpoint picker's LoRA affinity reads on the inference port (the rendered
    loraSpec, pod_metrics.LORA_INFO): while `router:paris` streams run, paris is among
    the running adapters under the name the clients used; max_lora is primary's
    max_loras (backup has no adapters); after them, no adapter is in use."""
    import time

    import openai
    from prometheus_client.parser import text_string_to_metric_families

    from builder.k8s import pool
    from builder.serve.openai.pod_metrics import LORA_INFO
    from builder.serve.openai.runner import Frontend
    from builder.serve.server import free_port

    assert pool.LORA_INFO == LORA_INFO  # the name the rendered picker config reads

    def lora_info(frontend) -> dict[str, str]:
        text = httpx.get(frontend.url + "/metrics", timeout=10).text
        (sample,) = [
            s
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == LORA_INFO
        ]
        assert sample.value > time.time() - 60  # the time it was set: this scrape's
        return sample.labels

    with Frontend(
        fallback_server.grpc_url, port=free_port(), metrics_url=fallback_server.metrics_url
    ) as frontend:
        client = openai.OpenAI(
            base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        seen = []
        with ThreadPoolExecutor(3) as streams:
            answers = [
                streams.submit(
                    client.chat.completions.create,
                    model="router:paris",
                    messages=[{"role": "user", "content": PROMPT}],
                    max_tokens=48,
                )
                for _ in range(3)
            ]
            while not all(a.done() for a in answers):
                seen.append(lora_info(frontend))
                time.sleep(0.05)
        assert all(a.result().choices[0].message.content for a in answers)
        assert any("router:paris" in s["running_lora_adapters"].split(",") for s in seen), seen
        assert {s["max_lora"] for s in seen} == {"2"}
        assert not any("france" in s["running_lora_adapters"] for s in seen)
        wait_for(
            lambda: lora_info(frontend)["running_lora_adapters"] == "",
            timeout_s=10,
        )
        assert lora_info(frontend)["waiting_lora_adapters"] == ""
