"""`trident engines build | prebuild | plan` and `trident cache ls | stats | verify | gc`.

Loaded by builder.cli.main as an extension. Failures are TridentErrors (one line, exit 1; exit 2
for bad input); `engines prebuild` reports every engine and exits 1 when any failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time

from builder.errors import TridentError
from builder.spec import load_spec

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' → seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise TridentError(f"--older-than: {text!r} is not a duration such as 90s, 30m, "
                           "12h, 7d or 2w", 2)
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


# ---------------------------------------------------------------------------------------
# engines


def _prepare(args: argparse.Namespace):
    from builder.engines import jobs as engines
    from builder.engines import trtllm_build

    spec = load_spec(args.spec)
    env = dict(os.environ)
    target = engines.spec_target(spec, env, trtllm_build.MachineProbe())
    location = engines.cache_location(spec, args.cache, args.local_cache)
    s3_client = engines.s3_client_factory(location.endpoint_url)
    digests = engines.CheckpointDigests(s3_client, engines.digest_memo(location))
    jobs = engines.plan_jobs(spec, target, digests, getattr(args, "profile", None))
    return spec, env, target, location, s3_client, jobs


def _builder(spec, env, target, location, s3_client):
    from builder.engines import jobs as engines
    from builder.engines import trtllm_build

    tools = trtllm_build.tools_from_env(env)
    return engines.Builder(spec, engines.open_cache(location), tools, target, s3_client, env)


def _outcome_line(outcome) -> str:
    where = f" → {outcome.path}" if outcome.path else ""
    detail = f": {outcome.error}" if outcome.error else ""
    return (f"{outcome.status:8} {outcome.job.title} key={outcome.job.key[:16]} "
            f"({outcome.seconds:.1f} s){where}{detail}")


def cmd_engines_build(args: argparse.Namespace) -> int:
    from builder.engines import jobs as engines

    spec, env, target, location, s3_client, jobs = _prepare(args)
    print(f"{len(jobs)} engine(s) for SM {target.sm}, TensorRT-LLM {target.trtllm_version}, "
          f"TensorRT {target.tensorrt_version}; cache: {engines.describe(location)}",
          flush=True)
    builder = _builder(spec, env, target, location, s3_client)
    for job in jobs:
        print(_outcome_line(builder.run(job)), flush=True)
    return 0


def cmd_engines_prebuild(args: argparse.Namespace) -> int:
    spec, env, target, location, s3_client, jobs = _prepare(args)
    builder = _builder(spec, env, target, location, s3_client)
    outcomes = builder.run_all(jobs, keep_going=True)
    for outcome in outcomes:
        print(_outcome_line(outcome), flush=True)
    counts = {word: sum(o.status == word for o in outcomes)
              for word in ("built", "fetched", "skipped", "failed")}
    print("summary: " + ", ".join(f"{n} {word}" for word, n in counts.items()) +
          f" of {len(outcomes)} engine(s)")
    return 1 if counts["failed"] else 0


def cmd_engines_plan(args: argparse.Namespace) -> int:
    """Keys and exact command lines, without building (what CI would run)."""
    from builder.engines import trtllm_build

    spec, env, target, location, s3_client, jobs = _prepare(args)
    tools = trtllm_build.tools_from_env(env)
    for job in jobs:
        print(f"{job.title} key={job.key}")
        checkpoint_dir = "" if job.checkpoint.needs_conversion else job.checkpoint.path
        for step in trtllm_build.plan_steps(job.checkpoint, job.build, job.profile, tools,
                                            checkpoint_dir, "$WORK", "$ENGINE_DIR"):
            print(f"  {step.label}: {step.shell()}")
    return 0


# ---------------------------------------------------------------------------------------
# cache


def _cache(args: argparse.Namespace):
    from builder.engines import jobs as engines

    spec = load_spec(args.spec) if args.spec else None
    location = engines.cache_location(spec, args.cache, args.local_cache)
    return engines.open_cache(location)


def cmd_cache_ls(args: argparse.Namespace) -> int:
    entries = list(_cache(args).entries())
    for entry in entries:
        print(json.dumps(dataclasses.asdict(entry), default=str, sort_keys=True)
              if args.json else _entry_line(entry))
    if not args.json:
        print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}", file=sys.stderr)
    return 0


def _entry_line(entry) -> str:
    meta = entry.metadata or {}
    title = f"{meta.get('model', '?')}/{meta.get('profile', '?')}"
    created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(entry.created))
    return (f"{entry.key}  {title}  {entry.size / 2**20:.1f} MiB  {entry.files} files  "
            f"{created}Z  {entry.tier}")


def cmd_cache_stats(args: argparse.Namespace) -> int:
    print(json.dumps(_cache(args).stats(), indent=2, sort_keys=True, default=str))
    return 0


def cmd_cache_verify(args: argparse.Namespace) -> int:
    problems = _cache(args).verify(args.key)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("OK")
    return 0


def cmd_cache_gc(args: argparse.Namespace) -> int:
    if args.keep_last is None and args.older_than is None:
        raise TridentError("cache gc: give --keep-last N and/or --older-than D", 2)
    if args.keep_last is not None and args.keep_last < 0:
        raise TridentError(f"--keep-last: must be >= 0, got {args.keep_last}", 2)
    older = parse_duration(args.older_than) if args.older_than else None
    removed = _cache(args).gc(keep_last=args.keep_last, older_than_s=older)
    for key in removed:
        print(f"removed {key}")
    print(f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} removed",
          file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------


def _cache_options(parser: argparse.ArgumentParser, spec_required: bool) -> None:
    parser.add_argument("--spec", required=spec_required,
                        help="deployment spec (YAML); its engine_cache section is used")
    parser.add_argument("--cache", metavar="s3://BUCKET/PREFIX",
                        help="shared S3 tier (overrides the spec's engine_cache.s3)")
    parser.add_argument("--local-cache", metavar="DIR",
                        help="local tier (overrides the spec's engine_cache.local_dir)")


def add_commands(subparsers) -> None:
    engines = subparsers.add_parser("engines", help="build TensorRT-LLM engines into the cache")
    verbs = engines.add_subparsers(dest="engines_command", required=True, metavar="VERB")
    p = verbs.add_parser("build", help="build (or fetch) the spec's engines; idempotent")
    _cache_options(p, spec_required=True)
    p.add_argument("--profile", help="only this build profile")
    p.set_defaults(func=cmd_engines_build)
    p = verbs.add_parser("prebuild", help="CI: the whole matrix, a summary, exit 1 on any "
                                          "failure")
    _cache_options(p, spec_required=True)
    p.set_defaults(func=cmd_engines_prebuild)
    p = verbs.add_parser("plan", help="print keys and exact command lines, build nothing")
    _cache_options(p, spec_required=True)
    p.add_argument("--profile", help="only this build profile")
    p.set_defaults(func=cmd_engines_plan)

    cache = subparsers.add_parser("cache", help="inspect and clean the engine cache")
    verbs = cache.add_subparsers(dest="cache_command", required=True, metavar="VERB")
    p = verbs.add_parser("ls", help="list entries")
    _cache_options(p, spec_required=False)
    p.add_argument("--json", action="store_true", help="one JSON object per entry")
    p.set_defaults(func=cmd_cache_ls)
    p = verbs.add_parser("stats", help="hits, misses, builds, bytes")
    _cache_options(p, spec_required=False)
    p.set_defaults(func=cmd_cache_stats)
    p = verbs.add_parser("verify", help="check every file's sha256 (exit 1 on a problem)")
    _cache_options(p, spec_required=False)
    p.add_argument("key", nargs="?", help="only this entry")
    p.set_defaults(func=cmd_cache_verify)
    p = verbs.add_parser("gc", help="remove old entries")
    _cache_options(p, spec_required=False)
    p.add_argument("--keep-last", type=int, metavar="N", help="keep the N most recently used")
    p.add_argument("--older-than", metavar="D", help="remove entries unused for D (7d, 12h)")
    p.set_defaults(func=cmd_cache_gc)
