"""`make run`: serve a rendered repository, ask it one question through the router over
gRPC (streamed) and once more through the OpenAI endpoint, print both answers, and stop.
The main job of the README, end to end."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from builder.errors import TridentError
from builder.serve import client as infer
from builder.serve.server import free_port, start_on_free_ports

QUESTION = "What is the capital of France?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="model_repository")
    parser.add_argument("--model", default="router")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    log = Path(args.repo).absolute().parent / "tritonserver.log"
    server = None
    try:
        started = time.monotonic()
        print(f"starting tritonserver on {args.repo} (log: {log}) ...", flush=True)
        server = start_on_free_ports(Path(args.repo), log)
        print(
            f"ready in {time.monotonic() - started:.1f} s: HTTP {server.http_url}, "
            f"gRPC {server.grpc_url}, metrics {server.metrics_url}",
            flush=True,
        )
        print(f"\n> {args.question}\n", flush=True)
        result = infer.stream_generate(
            server.grpc_url,
            args.model,
            args.question,
            args.max_tokens,
            sampling={"temperature": 0},
            on_text=lambda t: print(t, end="", flush=True),
        )
        print(
            f"\n\n[served_by={result.served_by} finish_reason={result.finish_reason} "
            f"time_to_first_token={result.ttft_s * 1000:.0f} ms "
            f"tokens={result.output_tokens} in {result.total_s:.2f} s]"
        )
        ask_openai(server.grpc_url, args.model, args.question, args.max_tokens, server.admin_key)
        return 0
    except TridentError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if server is not None:
            server.stop()


def ask_openai(
    triton_url: str, model: str, question: str, max_tokens: int, admin_key: str | None
) -> None:
    """The same question through the OpenAI frontend (`trident serve --openai-port`),
    with the openai SDK as any OpenAI client would send it. The frontend lists models
    through Triton's index, which needs the server's admin key (builder/serve/admin.py),
    as `trident serve` hands it over."""
    from openai import OpenAI

    from builder.serve.openai.runner import Frontend

    frontend = Frontend(
        triton_url,
        port=free_port(),
        expose=(model,),  # --model
        admin_key=admin_key,
    ).start()
    try:
        print(f"\nOpenAI API: {frontend.url}/v1 (trident serve --openai-port PORT)", flush=True)
        client = OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            max_tokens=max_tokens,
            temperature=0,
        )
        usage = answer.usage  # optional in OpenAI's schema; trident's frontend sends it
        tokens = f"{usage.prompt_tokens}+{usage.completion_tokens}" if usage else "?"
        print(
            f"> {question}\n\n{answer.choices[0].message.content}\n\n"
            f"[model={answer.model} finish_reason={answer.choices[0].finish_reason} "
            f"usage={tokens} tokens]"
        )
    finally:
        frontend.stop()


if __name__ == "__main__":
    sys.exit(main())
