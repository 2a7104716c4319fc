"""A rendered TRT-LLM ensemble's Python models in a real tritonserver (no TRT-LLM needed):
the tokenizer models round-trip a prompt, and the LoRA wiring (lora_name →
pre-processing with a real tokenizer and converted adapters → a stand-in engine,
tests/fakes/fake_tensorrtllm_backend.py, that records the lora_* tensors it gets and
keeps an adapter cache like the real backend) shows that Triton's ensemble passes the
optional LoRA tensors only when the pre-processing model produced them. Each repository
is served by the pool (tests/helpers/pool.py)."""

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


def test_lora_tensors_reach_the_engine_step(tmp_path, pool):
    import tritonclient.grpc as grpcclient

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
    with pool.serving(
        "trtllm-lora", tmp_path / "repo", load_models=["llama"], timeout_s=180
    ) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert generate(client)[1] is None
        assert generate(client, "support")[1] is None
        assert generate(client, "support")[1] is None  # task cached: no weights now
        text, error = generate(client, "nope")
        assert (
            text is None
            and "[lora_name] unknown adapter 'nope': model llama has no adapter of that name"
            in error
        )
        assert generate(client, sampling={"lora_name": "legal"})[1] is None
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["task"], r["weights"] is not None) for r in seen] == [
        (None, False),
        (2, True),
        (2, False),
        (1, True),
    ]
    assert seen[1]["weights_dtype"] == "float16" and seen[1]["weights"][:2] == [1, 60]
    assert seen[1]["config"][:2] == [[1, 0, 8], [3, 0, 8]]  # attn_q, attn_v of layer 0


def test_preprocessing_and_postprocessing_round_trip(tmp_path, pool):
    import tritonclient.grpc as grpcclient

    tokenizer_dir = str(assets.ensure("tiny-llama"))
    m = model(
        build={"dtype": "fp16"},
        engine_args={},
        checkpoint={"hf_model": tokenizer_dir, "family": "llama"},
    )
    render([m], tmp_path)
    tokenizers = ["llama_preprocessing", "llama_postprocessing"]
    with pool.serving("trtllm-tokenizers", tmp_path / "repo", load_models=tokenizers) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        text = "The capital of France is"
        inputs = [
            grpcclient.InferInput("QUERY", [1, 1], "BYTES"),
            grpcclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        inputs[1].set_data_from_numpy(np.array([[16]], dtype=np.int32))
        pre = client.infer("llama_preprocessing", inputs)
        ids, length = pre.as_numpy("INPUT_ID"), pre.as_numpy("REQUEST_INPUT_LEN")
        assert ids.dtype == np.int32 and ids.shape == (1, int(length[0, 0]))
        assert pre.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[16]]
        assert pre.as_numpy("OUT_END_ID")[0, 0] >= 0
        tokens = ids.reshape(1, 1, -1)
        post_inputs = [
            grpcclient.InferInput("TOKENS_BATCH", list(tokens.shape), "INT32"),
            grpcclient.InferInput("SEQUENCE_LENGTH", [1, 1], "INT32"),
        ]
        post_inputs[0].set_data_from_numpy(tokens)
        post_inputs[1].set_data_from_numpy(length.reshape(1, 1))
        out = client.infer("llama_postprocessing", post_inputs).as_numpy("OUTPUT")
        assert out[0, 0].decode().strip() == text
        inputs[1].set_data_from_numpy(np.array([[0]], dtype=np.int32))
        with pytest.raises(Exception, match="max_tokens must be >= 1"):
            client.infer("llama_preprocessing", inputs)
