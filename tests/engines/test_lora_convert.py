"""PEFT adapter → TRT-LLM's lora_weights / lora_config (builder/engines/lora.py), checked
against a random SmolLM2 adapter written with safetensors (support/lora.py)."""

import json
import math

import numpy as np
import pytest

from builder.engines.lora import (
    MODULE_IDS,
    AdapterError,
    convert_adapter,
    npy_bytes,
    read_safetensors,
)
from support.lora import SMOLLM2, write_adapter, write_config

HIDDEN, LAYERS = SMOLLM2["hidden_size"], SMOLLM2["num_hidden_layers"]
Q_OUT = SMOLLM2["num_attention_heads"] * SMOLLM2["head_dim"]  # 576
V_OUT = SMOLLM2["num_key_value_heads"] * SMOLLM2["head_dim"]  # 192


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return write_adapter(tmp_path_factory.mktemp("lora") / "a", seed=3, rank=8)


def split_row(row, rank, in_dim, out_dim):
    """Undo one lora_weights row: (A [rank, in], B·scale [out, rank], the padding)."""
    a = row[: rank * in_dim].reshape(rank, in_dim)
    b = row[rank * in_dim : rank * in_dim + out_dim * rank].reshape(out_dim, rank)
    return a, b, row[rank * in_dim + out_dim * rank :]


@pytest.mark.parametrize("dtype, tolerance", [("fp32", 0), ("fp16", 2e-3)])
def test_round_trip_shapes_and_values(adapter, dtype, tolerance):
    weights, config = convert_adapter(adapter, dtype)
    source = read_safetensors(adapter / "adapter_model.safetensors")
    assert weights.dtype == np.dtype({"fp32": "float32", "fp16": "float16"}[dtype])
    assert config.dtype == np.int32 and config.shape == (1, LAYERS * 2, 3)
    assert weights.shape == (1, LAYERS * 2, 8 * HIDDEN + Q_OUT * 8)  # the q row is longest
    scale = 8 / 8  # lora_alpha / r
    for i, (module_id, layer, rank) in enumerate(config[0].tolist()):
        module = {MODULE_IDS["attn_q"]: "q_proj", MODULE_IDS["attn_v"]: "v_proj"}[module_id]
        assert (layer, rank) == (i // 2, 8)  # by layer, q then v
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
        out_dim = Q_OUT if module == "q_proj" else V_OUT
        a, b, pad = split_row(weights[0, i].astype(np.float32), rank, HIDDEN, out_dim)
        np.testing.assert_allclose(a, source[f"{prefix}.lora_A.weight"], atol=tolerance)
        np.testing.assert_allclose(b, source[f"{prefix}.lora_B.weight"] * scale, atol=tolerance)
        assert not pad.any()


def test_alpha_and_rslora_scale_b(tmp_path):
    folder = write_adapter(tmp_path / "a", seed=1, rank=4, targets=("v_proj",))
    base, _ = convert_adapter(folder, "fp32")
    write_config(folder, rank=4, targets=["v_proj"], lora_alpha=16)
    scaled, _ = convert_adapter(folder, "fp32")
    write_config(folder, rank=4, targets=["v_proj"], lora_alpha=16, use_rslora=True)
    rs, _ = convert_adapter(folder, "fp32")
    a_len = 4 * HIDDEN
    np.testing.assert_array_equal(scaled[0, :, :a_len], base[0, :, :a_len])  # A unscaled
    np.testing.assert_allclose(scaled[0, :, a_len:], base[0, :, a_len:] * 4, rtol=1e-6)
    # base: alpha = r = 4 → scale 1; rsLoRA: alpha / sqrt(r) = 16 / 2
    np.testing.assert_allclose(rs[0, :, a_len:], base[0, :, a_len:] * 16 / math.sqrt(4), rtol=1e-6)


def test_bf16_tensors_are_widened(tmp_path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "bf"
    folder.mkdir()
    a = torch.randn(2, 6).to(torch.bfloat16)
    b = torch.randn(5, 2).to(torch.bfloat16)
    save_file(
        {
            "m.model.layers.0.mlp.down_proj.lora_A.weight": a,
            "m.model.layers.0.mlp.down_proj.lora_B.weight": b,
        },
        str(folder / "adapter_model.safetensors"),
    )
    write_config(folder, rank=2, targets=["down_proj"])
    weights, config = convert_adapter(folder, "fp32")
    assert config.tolist() == [[[MODULE_IDS["mlp_4h_to_h"], 0, 2]]]
    np.testing.assert_array_equal(weights[0, 0, :12], a.float().numpy().reshape(-1))
    np.testing.assert_array_equal(weights[0, 0, 12:], b.float().numpy().reshape(-1))


@pytest.mark.parametrize(
    "tensors, expected",
    [
        (
            {"x.layers.0.self_attn.q_proj.lora_A.weight": np.ones((2, 4), np.float32)},
            "layer 0 q_proj lacks lora_B",
        ),
        (
            {"x.embed_tokens.lora_embedding_A": np.ones((2, 4), np.float32)},
            "is not the LoRA A or B matrix",
        ),
        (
            {
                "x.layers.0.self_attn.q_proj.lora_A.weight": np.ones((2, 4), np.float32),
                "x.layers.0.self_attn.q_proj.lora_B.weight": np.ones((4, 3), np.float32),
            },
            "lora_A has rank 2 but lora_B has 3",
        ),
    ],
)
def test_bad_weights_are_named(tmp_path, tensors, expected):
    from safetensors.numpy import save_file

    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    write_config(tmp_path, rank=2)
    with pytest.raises(AdapterError, match=expected):
        convert_adapter(tmp_path, "fp16")


def test_npy_bytes_load_back(adapter):
    import io

    weights, config = convert_adapter(adapter, "fp16")
    np.testing.assert_array_equal(np.load(io.BytesIO(npy_bytes(config))), config)
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
