"""Small random PEFT LoRA adapters for the builtin SmolLM2, written with safetensors.

A real PEFT folder (adapter_config.json + adapter_model.safetensors) that vLLM loads as a
LoRA: rank `rank` on q_proj and v_proj of every layer. B is non-zero (PEFT initialises it
to zero, which would leave the output unchanged), so the adapter changes the answers.
"""

from __future__ import annotations

import json
from pathlib import Path

SMOLLM2 = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
}


def _out_features(config: dict, module: str) -> int:
    if module == "q_proj":
        return config["num_attention_heads"] * config["head_dim"]
    return config["num_key_value_heads"] * config["head_dim"]  # k_proj / v_proj


def write_adapter(
    folder: Path,
    seed: int,
    rank: int = 8,
    scale: float = 0.5,
    targets: tuple = ("q_proj", "v_proj"),
    config: dict = SMOLLM2,
    base_model: str = "smollm2-135m-instruct",
) -> Path:
    """Write a LoRA adapter for a llama-shaped model into `folder` and return it."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    hidden = config["hidden_size"]
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in targets:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            out = _out_features(config, module)
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(rank, hidden, generator=generator) * scale / hidden**0.5
            )
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out, rank, generator=generator) * scale / rank**0.5
            )
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors")
    )
    write_config(folder, rank=rank, targets=list(targets), base_model=base_model)
    return folder


def write_config(
    folder: Path,
    rank: int = 8,
    targets: list | None = None,
    base_model: str = "smollm2-135m-instruct",
    **overrides,
) -> None:
    """adapter_config.json as PEFT writes it (the fields vLLM and trident read)."""
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets or ["q_proj", "v_proj"],
        "base_model_name_or_path": base_model,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    config.update(overrides)
    Path(folder, "adapter_config.json").write_text(json.dumps(config, indent=2))
