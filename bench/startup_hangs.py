"""Busy-machine start-up check (a script, not a CI test): start the two-vLLM example
(deploy/examples/cpu-fallback.yaml) N times while other processes keep the CPUs busy, and
count the starts that became ready, hung, were too slow, or failed.

Why: on a loaded 2-core machine tritonserver 2.51 hung in 3 of 12 starts of this
repository when both vLLM models initialized at once (main thread in
LoadModelByDependency). `trident serve` now loads them one after another; `--all-at-once`
starts them the old way (every model named on tritonserver's command line) for a
side-by-side count.

    .venv/bin/python -m bench.startup_hangs [--starts 20] [--busy 4] [--timeout 300]
        [--all-at-once] [--out DIR]

Run it alone (under `flock /tmp/trident-heavy.lock` on a shared machine). A start that
does not become ready within --timeout counts as a hang and its message says which model
was stuck where; each start's server log is kept in the work folder.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from builder.pipeline import build_repository
from builder.serve.server import Ports, ServeError, TritonServer, free_port
from builder.spec import load_spec

SPEC = Path(__file__).resolve().parents[1] / "deploy" / "examples" / "cpu-fallback.yaml"
SPIN = "while True: pass"  # one busy core's worth of other work


def classify(message: str) -> str:
    """hung: the hang seen before (the engine said it is ready, the model never loaded),
    or a timeout of the old start (its health stays unready and the stage is unknown);
    slow: a load still under way at the timeout (the engine still starting); failed:
    anything else."""
    if "did not answer" in message:
        return "hung"
    if "did not load within" in message:
        return "hung" if "is ready'" in message else "slow"
    return "failed"


def one_start(repo: Path, log: Path, timeout_s: float, all_at_once: bool) -> dict:
    models = sorted(p.parent.name for p in repo.glob("*/config.pbtxt"))
    ports = Ports(free_port(), free_port(), free_port())
    if all_at_once:  # the old way: tritonserver loads every model itself, concurrently
        server = TritonServer(
            repo,
            ports,
            load_models=(),
            log_path=log,
            self_test=False,
            extra_args=tuple(f"--load-model={m}" for m in models),
        )
    else:
        server = TritonServer(repo, ports, log_path=log, self_test=False)
    started = time.monotonic()
    try:
        server.start()
        server.wait_ready(timeout_s)
        states = {m["name"]: m.get("state") for m in server.model_states()}
        outcome = "ready" if all(states.get(m) == "READY" for m in models) else "hung"
        message = "" if outcome == "ready" else f"not all READY: {states}"
    except ServeError as e:
        message = str(e)
        outcome = classify(message)
    finally:
        server.stop()
    return {
        "outcome": outcome,
        "seconds": round(time.monotonic() - started, 1),
        "message": message[:400],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--busy", type=int, default=4, help="busy-looping processes")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per start")
    parser.add_argument(
        "--all-at-once",
        action="store_true",
        help="the old start: every model loaded by tritonserver at once",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON result")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="trident-startup-hangs-"))
    repo = work / "repo"
    build_repository(load_spec(SPEC), repo)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    results = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C
    try:
        for index in range(args.starts):
            result = one_start(
                repo, work / f"start-{index:02d}.log", args.timeout, args.all_at_once
            )
            results.append(result)
            print(
                f"start {index + 1}/{args.starts}: {result['outcome']} in "
                f"{result['seconds']} s {result['message']}",
                flush=True,
            )
    except KeyboardInterrupt:
        print(f"interrupted after {len(results)} starts", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    counts = {
        kind: sum(r["outcome"] == kind for r in results)
        for kind in ("ready", "hung", "slow", "failed")
    }
    summary = {
        "spec": str(SPEC),
        "mode": "all-at-once" if args.all_at_once else "one-by-one",
        "busy_processes": args.busy,
        "starts": len(results),
        **counts,
        "ready_seconds": sorted(r["seconds"] for r in results if r["outcome"] == "ready"),
        "logs": str(work),
        "results": results,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "startup_hangs.json").write_text(json.dumps(summary, indent=2))
    return 0 if counts["hung"] == counts["slow"] == counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
