"""The LoRA wiring of a rendered TRT-LLM ensemble in a real tritonserver: lora_name →
pre-processing (real tokenizer, converted adapters) → a stand-in engine
(tests/fakes/fake_tensorrtllm_backend.py) that records the lora_* tensors it gets and keeps
an adapter cache like the real backend. Shows that Triton's ensemble passes the optional
LoRA tensors only when the pre-processing model produced them."""

from __future__ import annotations

import json
import queue
import shutil
from pathlib import Path

import numpy as np
import pytest

from builder.engines import assets
from support.lora import write_adapter
from tests.render.test_trtllm import model, render

pytestmark = pytest.mark.server
STAND_IN = Path(__file__).resolve().parents[1] / "fakes" / "fake_tensorrtllm_backend.py"


def stand_in_engine(repo: Path, record: Path) -> None:
    """Serve the engine step with the stand-in: same tensors, Python backend."""
    folder = repo / "llama_tensorrt_llm"
    text = (
        (folder / "config.pbtxt").read_text().replace('backend: "tensorrtllm"', 'backend: "python"')
    )
    text += f'\nparameters: {{ key: "record_path" value: {{ string_value: "{record}" }} }}\n'
    (folder / "config.pbtxt").write_text(text)
    shutil.copy(STAND_IN, folder / "1" / "model.py")


def generate(client, lora_name=None, sampling=None):
    """One streamed request to the ensemble: (text or None, error message or None)."""
    import tritonclient.grpc as grpcclient

    values = {
        "text_input": np.array([[b"hello there"]], dtype=object),
        "max_tokens": np.array([[4]], dtype=np.int32),
    }
    if lora_name is not None:
        values["lora_name"] = np.array([[lora_name.encode()]], dtype=object)
    if sampling is not None:
        values["sampling_parameters"] = np.array([[json.dumps(sampling).encode()]], dtype=object)
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(
            name, list(value.shape), "BYTES" if value.dtype == object else "INT32"
        )
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("llama", inputs)
        result, error = results.get(timeout=60)
    finally:
        client.stop_stream()
    if error is not None:
        return None, str(error)
    return result.as_numpy("text_output").reshape(-1)[0].decode(), None


def test_lora_tensors_reach_the_engine_step(tmp_path):
    import tritonclient.grpc as grpcclient

    from tests.helpers.servers import start_server

    tokenizer = str(assets.ensure("tiny-llama"))
    adapters = {
        name: str(write_adapter(tmp_path / name, seed=seed, rank=8))
        for name, seed in (("support", 1), ("legal", 2))
    }
    render(
        [
            model(
                build={"dtype": "fp16"},
                engine_args={},
                adapters=adapters,
                lora={"max_lora_rank": 8},
                checkpoint={"hf_model": tokenizer, "family": "llama"},
            )
        ],
        tmp_path,
    )
    record = tmp_path / "engine-inputs.jsonl"
    stand_in_engine(tmp_path / "repo", record)
    server = start_server(tmp_path / "repo", tmp_path, load_models=["llama"], timeout_s=180)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert generate(client)[1] is None
        assert generate(client, "support")[1] is None
        assert generate(client, "support")[1] is None  # task cached: no weights now
        text, error = generate(client, "nope")
        assert (
            text is None
            and "unknown adapter 'nope' (lora_name): model llama has adapters: legal, support"
            in error
        )
        assert generate(client, sampling={"lora_name": "legal"})[1] is None
    finally:
        server.stop()
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["task"], r["weights"] is not None) for r in seen] == [
        (None, False),
        (2, True),
        (2, False),
        (1, True),
    ]
    assert seen[1]["weights_dtype"] == "float16" and seen[1]["weights"][:2] == [1, 60]
    assert seen[1]["config"][:2] == [[1, 0, 8], [3, 0, 8]]  # attn_q, attn_v of layer 0
