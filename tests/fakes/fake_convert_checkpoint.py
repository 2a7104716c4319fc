#!/usr/bin/env python3
"""A stand-in for TensorRT-LLM's examples/<family>/convert_checkpoint.py and
examples/quantization/quantize.py (v0.16 flags): reads a Hugging Face-style folder
(config.json + weight files) and writes a TRT-LLM checkpoint (config.json with the mapping
and quantization, one rank<N>.safetensors per rank), deterministically.
$FAKE_TRTLLM_CALLS counts invocations as for the fake trtllm-build.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path


def parse(argv):
    p = argparse.ArgumentParser(prog="convert_checkpoint.py")
    p.add_argument("--model_dir", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], required=True)
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    # convert_checkpoint.py
    p.add_argument("--use_weight_only", action="store_true")
    p.add_argument("--weight_only_precision", choices=["int8", "int4"])
    p.add_argument("--int8_kv_cache", action="store_true")
    p.add_argument("--medusa_model_dir")
    p.add_argument("--num_medusa_heads", type=int)
    p.add_argument("--max_medusa_token_len", type=int)
    p.add_argument("--eagle_model_dir")
    p.add_argument("--num_eagle_layers", type=int)
    p.add_argument("--max_draft_len", type=int)
    # quantize.py
    p.add_argument("--qformat", choices=["fp8", "int4_awq", "w4a8_awq", "int8_sq", "full_prec"])
    p.add_argument("--calib_size", type=int)
    p.add_argument("--kv_cache_dtype", choices=["fp8", "int8"])
    return p.parse_args(argv)


def main(argv):
    args = parse(argv)
    if os.environ.get("FAKE_TRTLLM_CALLS"):
        with open(os.environ["FAKE_TRTLLM_CALLS"], "a") as calls:
            calls.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    source = Path(args.model_dir)
    if not (source / "config.json").is_file():
        print(f"error: {source}/config.json: not a Hugging Face model folder", flush=True)
        sys.exit(1)
    if args.use_weight_only and not args.weight_only_precision:
        print("error: --use_weight_only needs --weight_only_precision", flush=True)
        sys.exit(1)
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(path.relative_to(source).as_posix().encode() + path.read_bytes())
    digest.update(
        json.dumps(vars(args) | {"model_dir": None, "output_dir": None}, sort_keys=True).encode()
    )
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = json.loads((source / "config.json").read_text())
    config = {
        "architecture": (hf.get("architectures") or ["LlamaForCausalLM"])[0],
        "dtype": args.dtype,
        "mapping": {"tp_size": args.tp_size, "pp_size": args.pp_size},
        "quantization": {"qformat": args.qformat, "weight_only": args.weight_only_precision},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    for rank in range(args.tp_size * args.pp_size):
        (out / f"rank{rank}.safetensors").write_bytes(digest.digest() + bytes([rank]) * 32)
        print(f"converted rank {rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
