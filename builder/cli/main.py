"""The `trident` command line.

Exit codes: 0 success, 1 a failure of the job (invalid repository, server did not come
up, build failed), 2 bad input (a spec defect, a bad argument). Errors are one clear
message on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path

from builder.cli import engines as cli_engines
from builder.cli import placement as cli_placement
from builder.errors import TridentError, printable
from builder.spec import load_spec
from engine_cache.errors import CacheError

EXIT_FAILURE = 1
EXIT_USAGE = 2


# ---------------------------------------------------------------------------------------
# repo / validate


def cmd_repo(args: argparse.Namespace) -> int:
    from builder import pipeline as repository

    spec = load_spec(args.spec)
    with _sigterm_as_interrupt():   # the render cleans up after itself as on Ctrl-C
        written = repository.build_repository(spec, Path(args.out))
    print(f"rendered {len(spec.models)} model(s){' + router' if spec.router else ''} "
          f"into {args.out} ({written} files)")
    return 0


@contextlib.contextmanager
def _sigterm_as_interrupt():
    def on_sigterm(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_validate(args: argparse.Namespace) -> int:
    from builder.render.validate import validate_repository

    problems = validate_repository(Path(args.repo))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{args.repo}: {len(problems)} problem(s)", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{args.repo}: OK")
    return 0


# ---------------------------------------------------------------------------------------
# serve / infer


def cmd_serve(args: argparse.Namespace) -> int:
    from builder.serve.server import Ports, TritonServer

    repo = Path(args.repo)
    if not repo.is_dir():
        raise TridentError(f"{repo}: no such model repository (run `trident repo` first)",
                          EXIT_USAGE)
    server = TritonServer(repo, Ports(args.http_port, args.grpc_port, args.metrics_port),
                          load_models=tuple(args.load_model) if args.load_model else None)
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        server.start()
        server.wait_ready(args.timeout)
        print(f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  "
              f"metrics {server.metrics_url}", flush=True)
        server.monitor()   # returns only by raising: the server exited or a stub died
    except KeyboardInterrupt:
        print("stopping tritonserver", file=sys.stderr, flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        server.stop()


def cmd_infer(args: argparse.Namespace) -> int:
    from builder.serve import client as infer

    prompt = " ".join(args.prompt)
    result = infer.stream_generate(args.url, args.model, prompt, args.max_tokens,
                                   chat=not args.raw, on_text=_print_chunk,
                                   sampling={"temperature": args.temperature})
    print()
    print(f"[served_by={result.served_by} finish_reason={result.finish_reason} "
          f"ttft={result.ttft_s * 1000:.0f} ms tokens={result.output_tokens}]",
          file=sys.stderr)
    return 0


def _print_chunk(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_schema(args: argparse.Namespace) -> int:
    from builder.spec.schema import deployment_schema

    print(json.dumps(deployment_schema(), indent=2, sort_keys=True))
    return 0


def cmd_assets(args: argparse.Namespace) -> int:
    from builder.engines import assets

    for name in args.names or list(assets.BUILDERS):
        print(f"{name}: {assets.ensure(name)}")
    return 0


# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trident", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("repo", help="render a spec into a Triton model repository")
    p.add_argument("--spec", required=True, help="deployment spec (YAML)")
    p.add_argument("--out", required=True, help="model repository directory to (re)place")
    p.set_defaults(func=cmd_repo)

    p = sub.add_parser("validate", help="check a model repository")
    p.add_argument("repo")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("serve", help="run tritonserver on a model repository",
                       description="Run tritonserver on a model repository until Ctrl-C or "
                       "SIGTERM (exit 0). Exits 1, stopping the server, when the server "
                       "exits, or a model's stub process or engine dies (Triton would "
                       "keep the model READY), so a supervisor can restart it.")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for ready")
    p.add_argument("--load-model", action="append",
                   help="load only these models (explicit model control); repeatable")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("infer", help="stream a generation from a served model (gRPC)")
    p.add_argument("--model", default="router")
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC endpoint host:port")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--raw", action="store_true",
                   help="send text_input as is instead of a chat message")
    p.add_argument("prompt", nargs="+")
    p.set_defaults(func=cmd_infer)

    p = sub.add_parser("assets", help="build the builtin models (done by `make install`)")
    p.add_argument("names", nargs="*")
    p.set_defaults(func=cmd_assets)

    p = sub.add_parser("schema", help="print the JSON Schema of the deployment spec")
    p.set_defaults(func=cmd_schema)

    # Command groups that live beside their subsystem.
    cli_engines.add_commands(sub)
    cli_placement.add_commands(sub)
    return parser




def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (TridentError, CacheError) as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        # A file the job needed could not be read or written (permissions, a full disk):
        # one line naming it, as for trident's own errors.
        where = f"{printable(e.filename)}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
