"""`trident engines build | prebuild | plan` and `trident cache ls | stats | verify | gc`.

Failures are TridentErrors (one line, exit 1; exit 2 for bad input); `engines prebuild`
reports every engine and exits 1 when any failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time

import click

from builder.cli.common import complete_dir, group, spec_option
from builder.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, TridentError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' → seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise TridentError(
            f"--older-than: {text!r} is not a duration such as 90s, 30m, 12h, 7d or 2w", EXIT_USAGE
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _cache_options(spec_required: bool):
    """--spec, --cache and --local-cache, on every engines and cache command."""

    def decorate(command):
        command = click.option(
            "--local-cache",
            metavar="DIR",
            shell_complete=complete_dir,
            help="local tier (overrides the spec's engine_cache.local_dir)",
        )(command)
        command = click.option(
            "--cache",
            metavar="s3://BUCKET/PREFIX",
            help="shared S3 tier (overrides the spec's engine_cache.s3)",
        )(command)
        return spec_option(
            spec_required, help="deployment spec (YAML); its engine_cache section is used"
        )(command)

    return decorate


_profile_option = click.option("--profile", help="only this build profile")


# ---------------------------------------------------------------------------------------
# engines


@group()
def engines() -> None:
    """Build TensorRT-LLM engines into the content-addressed cache."""


def _prepare(
    spec_file: str, cache: str | None, local_cache: str | None, profile: str | None = None
):
    # lazy: the build machinery (and boto3 behind it) is for these commands only
    from builder.engines import jobs, trtllm_build
    from builder.spec import load_spec

    spec = load_spec(spec_file)
    env = dict(os.environ)
    target = jobs.spec_target(spec, env, trtllm_build.MachineProbe())
    location = jobs.cache_location(spec, cache, local_cache)
    s3_client = jobs.s3_client_factory(location.endpoint_url)
    digests = jobs.CheckpointDigests(s3_client, jobs.digest_memo(location))
    planned = jobs.plan_jobs(spec, target, digests, profile)
    return spec, env, target, location, s3_client, planned


def _builder(spec, env, target, location, s3_client):
    from builder.engines import jobs, trtllm_build

    tools = trtllm_build.tools_from_env(env)
    return jobs.Builder(spec, jobs.open_cache(location), tools, target, s3_client, env)


def _outcome_line(outcome) -> str:
    where = f" → {outcome.path}" if outcome.path else ""
    detail = f": {outcome.error}" if outcome.error else ""
    return (
        f"{outcome.status:8} {outcome.job.title} key={outcome.job.key[:16]} "
        f"({outcome.seconds:.1f} s){where}{detail}"
    )


@engines.command()
@_cache_options(spec_required=True)
@_profile_option
def build(spec: str, cache: str | None, local_cache: str | None, profile: str | None) -> int:
    """Build (or fetch) the spec's engines; idempotent."""
    from builder.engines import jobs

    spec_, env, target, location, s3_client, planned = _prepare(spec, cache, local_cache, profile)
    click.echo(
        f"{len(planned)} engine(s) for SM {target.sm}, TensorRT-LLM "
        f"{target.trtllm_version}, TensorRT {target.tensorrt_version}; cache: "
        f"{jobs.describe(location)}"
    )
    builder = _builder(spec_, env, target, location, s3_client)
    for job in planned:
        click.echo(_outcome_line(builder.run(job)))
    return 0


@engines.command()
@_cache_options(spec_required=True)
def prebuild(spec: str, cache: str | None, local_cache: str | None) -> int:
    """CI: build the whole matrix, print a summary, exit 1 on any failure."""
    spec_, env, target, location, s3_client, planned = _prepare(spec, cache, local_cache)
    builder = _builder(spec_, env, target, location, s3_client)
    outcomes = builder.run_all(planned, keep_going=True)
    for outcome in outcomes:
        click.echo(_outcome_line(outcome))
    counts = {
        word: sum(o.status == word for o in outcomes)
        for word in ("built", "fetched", "skipped", "failed")
    }
    click.echo(
        "summary: "
        + ", ".join(f"{n} {word}" for word, n in counts.items())
        + f" of {len(outcomes)} engine(s)"
    )
    return EXIT_FAILURE if counts["failed"] else EXIT_OK


@engines.command("plan")
@_cache_options(spec_required=True)
@_profile_option
def plan_engines(spec: str, cache: str | None, local_cache: str | None, profile: str | None) -> int:
    """Print cache keys and exact command lines, build nothing (what CI would run)."""
    from builder.engines import trtllm_build

    _, env, _, _, _, planned = _prepare(spec, cache, local_cache, profile)
    tools = trtllm_build.tools_from_env(env)
    for job in planned:
        click.echo(f"{job.title} key={job.key}")
        checkpoint_dir = "" if job.checkpoint.needs_conversion else job.checkpoint.path
        for step in trtllm_build.plan_steps(
            job.checkpoint,
            job.build,
            job.profile,
            tools,
            checkpoint_dir,
            "$WORK",
            "$ENGINE_DIR",
            job.lora,
        ):
            click.echo(f"  {step.label}: {step.shell()}")
    return 0


# ---------------------------------------------------------------------------------------
# cache


@group("cache")
def cache_group() -> None:
    """Inspect and clean the engine cache.

    The local tier, and the S3 tier when the spec or --cache names one.
    """


def _open_cache(spec_file: str | None, cache: str | None, local_cache: str | None):
    from builder.engines import jobs
    from builder.spec import load_spec

    spec = load_spec(spec_file) if spec_file else None
    return jobs.open_cache(jobs.cache_location(spec, cache, local_cache))


@cache_group.command("ls")
@_cache_options(spec_required=False)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per entry")
def ls(spec: str | None, cache: str | None, local_cache: str | None, as_json: bool) -> int:
    """List the cache's entries."""
    entries = list(_open_cache(spec, cache, local_cache).entries())
    for entry in entries:
        click.echo(
            json.dumps(dataclasses.asdict(entry), default=str, sort_keys=True)
            if as_json
            else _entry_line(entry)
        )
    if not as_json:
        click.echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}", err=True)
    return 0


def _entry_line(entry) -> str:
    meta = entry.metadata or {}
    title = f"{meta.get('model', '?')}/{meta.get('profile', '?')}"
    created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(entry.created))
    return (
        f"{entry.key}  {title}  {entry.size / 2**20:.1f} MiB  {entry.files} files  "
        f"{created}Z  {entry.tier}"
    )


@cache_group.command()
@_cache_options(spec_required=False)
def stats(spec: str | None, cache: str | None, local_cache: str | None) -> int:
    """Print hits, misses, builds and bytes (JSON)."""
    cache_ = _open_cache(spec, cache, local_cache)
    click.echo(json.dumps(cache_.stats(), indent=2, sort_keys=True, default=str))
    return 0


@cache_group.command()
@_cache_options(spec_required=False)
@click.argument("key", required=False)
def verify(spec: str | None, cache: str | None, local_cache: str | None, key: str | None) -> int:
    """Check every file's sha256 (of all entries, or of KEY); exit 1 on a problem."""
    problems = _open_cache(spec, cache, local_cache).verify(key)
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s)", err=True)
        return EXIT_FAILURE
    click.echo("OK")
    return EXIT_OK


@cache_group.command()
@_cache_options(spec_required=False)
@click.option("--keep-last", type=int, metavar="N", help="keep the N most recently used")
@click.option("--older-than", metavar="D", help="remove entries unused for D (7d, 12h)")
def gc(
    spec: str | None,
    cache: str | None,
    local_cache: str | None,
    keep_last: int | None,
    older_than: str | None,
) -> int:
    """Remove old entries (give --keep-last and/or --older-than)."""
    if keep_last is None and older_than is None:
        raise TridentError("cache gc: give --keep-last N and/or --older-than D", EXIT_USAGE)
    if keep_last is not None and keep_last < 0:
        raise TridentError(f"--keep-last: must be >= 0, got {keep_last}", EXIT_USAGE)
    older = parse_duration(older_than) if older_than else None
    removed = _open_cache(spec, cache, local_cache).gc(keep_last=keep_last, older_than_s=older)
    for key in removed:
        click.echo(f"removed {key}")
    click.echo(f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} removed", err=True)
    return 0


COMMANDS = [engines, cache_group]
