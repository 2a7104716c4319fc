#!/usr/bin/env python3
"""A stand-in for `trtllm-build` (TensorRT-LLM v0.16) on machines without TensorRT-LLM.

It parses the flags trident passes (the same names and choices as the real parser), checks
them against the checkpoint it is given, and writes what a real build writes: config.json
and one rank<N>.engine per rank, deterministically (bytes derived from the checkpoint and
the flags). Each run appends a line to $FAKE_TRTLLM_CALLS (if set) so tests can count
compiler invocations; $FAKE_TRTLLM_SLEEP makes a build take that many seconds;
$FAKE_TRTLLM_FAIL makes it fail.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

SWITCH = ["enable", "disable"]
PLUGIN_DTYPES = ["float16", "float32", "bfloat16", "fp8", "disable"]
LORA_MODULES = [
    "attn_qkv",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_dense",
    "mlp_h_to_4h",
    "mlp_4h_to_h",
    "mlp_gate",
]


def parse(argv):
    p = argparse.ArgumentParser(prog="trtllm-build")
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--output_dir", required=True)
    for name in (
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "max_num_tokens",
        "max_beam_width",
        "tokens_per_block",
        "workers",
        "max_draft_len",
    ):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--kv_cache_type", choices=["continuous", "paged", "disabled"])
    p.add_argument("--gpt_attention_plugin", choices=PLUGIN_DTYPES)
    p.add_argument("--gemm_plugin", choices=PLUGIN_DTYPES + ["auto"])
    for name in (
        "context_fmha",
        "use_paged_context_fmha",
        "remove_input_padding",
        "multiple_profiles",
    ):
        p.add_argument(f"--{name}", choices=SWITCH)
    p.add_argument("--weight_streaming", action="store_true")
    p.add_argument(
        "--speculative_decoding_mode",
        choices=[
            "draft_tokens_external",
            "lookahead_decoding",
            "medusa",
            "explicit_draft_tokens",
            "eagle",
        ],
    )
    p.add_argument("--log_level", choices=["verbose", "info", "warning", "error"])
    # LoRA arguments (build.py's "LoRA arguments" group; lora_plugin from plugin.py).
    p.add_argument("--lora_plugin", choices=["auto", "float16", "float32", "bfloat16"])
    p.add_argument("--lora_dir", nargs="+")
    p.add_argument("--lora_ckpt_source", choices=["hf", "nemo"], default="hf")
    p.add_argument("--max_lora_rank", type=int, default=64)
    p.add_argument("--lora_target_modules", nargs="+", choices=LORA_MODULES)
    return p.parse_args(argv)


def check_lora(args):
    """What the real build reads of --lora_dir: each folder's adapter_config.json."""
    for folder in args.lora_dir or []:
        config_path = Path(folder) / "adapter_config.json"
        if not config_path.is_file():
            fail(f"{folder}: no adapter_config.json")
        rank = json.loads(config_path.read_text()).get("r", 0)
        if rank > args.max_lora_rank:
            fail(f"{folder}: LoRA rank {rank} exceeds max_lora_rank {args.max_lora_rank}")
    if args.lora_dir and not args.lora_plugin:
        print("[TRT-LLM] [W] --lora_dir without --lora_plugin: LoRA is ignored", flush=True)


def fail(message):
    print(f"[TRT-LLM] [E] {message}", flush=True)
    sys.exit(1)


def main(argv):
    args = parse(argv)
    if os.environ.get("FAKE_TRTLLM_CALLS"):
        with open(os.environ["FAKE_TRTLLM_CALLS"], "a") as calls:
            calls.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    if os.environ.get("FAKE_TRTLLM_FAIL"):
        fail(os.environ["FAKE_TRTLLM_FAIL"])
    checkpoint = Path(args.checkpoint_dir)
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        fail(f"{config_path}: no TRT-LLM checkpoint config")
    pretrained = json.loads(config_path.read_text())
    if args.max_seq_len < args.max_input_len:
        fail("max_seq_len must be >= max_input_len")
    if args.kv_cache_type != "paged" and args.gpt_attention_plugin == "disable":
        fail("inflight batching needs the GPT attention plugin")
    if args.use_paged_context_fmha == "enable" and args.context_fmha != "enable":
        fail("paged context FMHA needs context FMHA")
    check_lora(args)
    mapping = pretrained.get("mapping", {})
    world = int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
    print(f"[TRT-LLM] [I] Set dtype to {pretrained.get('dtype')}.", flush=True)
    print(
        f"[TRT-LLM] [I] Building {world} rank(s) for max_batch_size={args.max_batch_size}",
        flush=True,
    )
    time.sleep(float(os.environ.get("FAKE_TRTLLM_SLEEP", "0")))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_config = {
        k: v
        for k, v in vars(args).items()
        if k not in ("checkpoint_dir", "output_dir", "log_level", "workers")
    }
    for rank in range(world):
        weights = checkpoint / f"rank{rank}.safetensors"
        if not weights.is_file():
            fail(f"{weights}: missing rank weights")
        digest = hashlib.sha256(weights.read_bytes())
        digest.update(json.dumps(build_config, sort_keys=True).encode())
        (out / f"rank{rank}.engine").write_bytes(b"FAKE-TRT-ENGINE\n" + digest.digest() * 64)
        print(f"[TRT-LLM] [I] Engine for rank {rank} written", flush=True)
    config = {
        "version": "0.16.0-fake",
        "pretrained_config": pretrained,
        "build_config": build_config,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    print("[TRT-LLM] [I] Total time of building all engines: 00:00:00", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
