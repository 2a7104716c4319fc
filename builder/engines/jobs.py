"""TRT-LLM engines of a spec: plan (model × profile → cache key), build through the cache,
and find the served engines for `trident repo` (which never builds).

For each tensorrt_llm model and profile: EngineInputs (checkpoint content digest, every
build argument, target SM, TRT-LLM and TensorRT versions) → engine_key →
EngineCache.get_or_build, whose build callable runs the conversion and trtllm-build steps
of builder.engines.trtllm_build as subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from builder.engines import lora as lora_mod
from builder.engines import trtllm_build
from builder.engines.lora import LoraBuild
from builder.engines.trtllm_build import MachineProbe, Progress, Target, Tools
from builder.errors import EXIT_USAGE, TridentError
from builder.plan import gpus
from builder.spec import DeploymentSpec, EngineCacheSpec, ModelSpec
from builder.spec import trtllm as trtllm_spec
from builder.spec.trtllm import BuildSettings, Checkpoint, Profile
from engine_cache import (
    CacheError,
    EngineCache,
    EngineInputs,
    checkpoint_digest,
    engine_key,
    parse_s3_uri,
)

ENGINE_INFO_FILE = "trident-engine.json"
BUILD_LOG_FILE = "build.log"
STATUS_WORDS = {"built": "built", "hit-s3": "fetched", "hit-local": "skipped"}


class EngineMissing(TridentError):
    """`trident repo` needs an engine that is in no cache tier."""


@dataclass(frozen=True)
class EngineJob:
    """One engine: a model's profile, its inputs and its cache key."""

    model: str
    checkpoint: Checkpoint
    build: BuildSettings
    profile: Profile
    inputs: EngineInputs
    key: str
    lora: LoraBuild | None = None  # the model's adapters, when it has any

    @property
    def title(self) -> str:
        return f"{self.model}/{self.profile.name}"


@dataclass(frozen=True)
class ServedEngine:
    """The engine `trident repo` serves for a model: where it lies, and its cache key
    (named in the rendered config, so an operator can find the entry in the cache)."""

    path: str
    key: str


def spec_path(spec: DeploymentSpec, value: str) -> str:
    """A path in the spec, relative to the spec file's folder (s3:// URIs unchanged)."""
    if value.startswith("s3://"):
        return value
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else Path(spec.file).parent / path)


def spec_target(spec: DeploymentSpec, env: Mapping[str, str], probe: MachineProbe) -> Target:
    spec_sm = gpus.GPU_TYPES[spec.hardware.gpu].sm if spec.hardware.gpu != "cpu" else None
    return trtllm_build.target_of(env, probe, spec_sm)


# ---------------------------------------------------------------------------------------
# Planning (pure apart from the digest function it is given)


def trtllm_models(spec: DeploymentSpec) -> list[ModelSpec]:
    return [m for m in spec.models if m.engine == "tensorrt_llm"]


def selected_profiles(model: ModelSpec, profile: str | None) -> list[Profile]:
    _, _, profiles = trtllm_spec.sections(model)
    return [p for name, p in profiles.items() if profile is None or name == profile]


def plan_job(
    spec: DeploymentSpec,
    model: ModelSpec,
    profile: Profile,
    target: Target,
    digest: Callable[[str], str],
) -> EngineJob:

    checkpoint, build, _ = trtllm_spec.sections(model)
    checkpoint, profile = _with_spec_paths(spec, checkpoint, profile)
    extra = {}
    if profile.speculative and profile.speculative.heads_model:
        extra["speculative_heads"] = digest(profile.speculative.heads_model)
    lora = lora_mod.lora_build(spec.file, model, build.dtype)
    args = trtllm_build.key_args(checkpoint, build, profile, extra, lora_mod.key_args(lora, digest))
    inputs = EngineInputs(
        checkpoint_digest=digest(checkpoint_source(checkpoint)),
        build_args=args,
        target_sm=target.sm,
        trtllm_version=target.trtllm_version,
        tensorrt_version=target.tensorrt_version,
    )
    return EngineJob(model.name, checkpoint, build, profile, inputs, engine_key(inputs), lora)


def checkpoint_source(checkpoint: Checkpoint) -> str:
    """What a job reads: the Hugging Face folder it converts, else the converted
    checkpoint (local or s3://). The spec's parser requires one of the two."""
    source = checkpoint.hf_model if checkpoint.needs_conversion else checkpoint.path
    if source is None:
        raise TridentError("a tensorrt_llm checkpoint names neither path nor hf_model")
    return source


def _with_spec_paths(
    spec: DeploymentSpec, checkpoint: Checkpoint, profile: Profile
) -> tuple[Checkpoint, Profile]:
    """Paths made absolute (relative to the spec file); keys never include paths."""

    def resolve(value: str | None) -> str | None:
        return spec_path(spec, value) if value else value

    checkpoint = replace(
        checkpoint, path=resolve(checkpoint.path), hf_model=resolve(checkpoint.hf_model)
    )
    if profile.speculative and profile.speculative.heads_model:
        profile = replace(
            profile,
            speculative=replace(
                profile.speculative, heads_model=resolve(profile.speculative.heads_model)
            ),
        )
    return checkpoint, profile


def plan_jobs(
    spec: DeploymentSpec, target: Target, digest: Callable[[str], str], profile: str | None = None
) -> list[EngineJob]:
    models = trtllm_models(spec)
    if not models:
        raise TridentError(f"{spec.file}: no tensorrt_llm model to build", EXIT_USAGE)
    jobs = [
        plan_job(spec, model, p, target, digest)
        for model in models
        for p in selected_profiles(model, profile)
    ]
    if not jobs:
        known = sorted({n for m in models for n in trtllm_spec.sections(m)[2]})
        raise TridentError(
            f"{spec.file}: no tensorrt_llm model has a profile {profile!r} "
            f"(profiles: {', '.join(known)})",
            EXIT_USAGE,
        )
    return jobs


def build_command(spec: DeploymentSpec, profile: str) -> str:
    return f"trident engines build --spec {spec.file} --profile {profile}"


# ---------------------------------------------------------------------------------------
# Checkpoint content (local folders hashed file by file; S3 checkpoints by their listing)


class CheckpointDigests:
    """Digest of a checkpoint path or s3:// URI, memoised for one command; with
    memo_file, each local file's hash is remembered across commands by its stat identity,
    so a warm `trident repo` does not re-read a checkpoint of hundreds of GB."""

    def __init__(self, s3_client: Callable[[], object], memo_file: Path | None = None):
        self.s3_client = s3_client
        self.memo_file = memo_file
        self.memo: dict[str, str] = {}

    def __call__(self, location: str) -> str:
        if location not in self.memo:
            self.memo[location] = (
                self._s3(location) if location.startswith("s3://") else self._local(location)
            )
        return self.memo[location]

    def _local(self, location: str) -> str:

        return checkpoint_digest(Path(location), memo_file=self.memo_file)

    def _s3(self, uri: str) -> str:
        # S3 ETags are content hashes of each object: the listing identifies the content
        # without downloading a checkpoint that may be hundreds of GB.
        records = [
            [rel, obj["Size"], obj["ETag"].strip('"')]
            for rel, obj in _s3_objects(self.s3_client(), uri)
        ]
        if not records:
            raise TridentError(f"checkpoint {uri}: no objects under this prefix", EXIT_USAGE)
        return hashlib.sha256(json.dumps(records, separators=(",", ":")).encode()).hexdigest()


def _split_s3(uri: str) -> tuple[str, str]:
    location = parse_s3_uri(uri, "checkpoint")
    return location.bucket, (location.prefix + "/") if location.prefix else ""


def _s3_objects(client, uri: str) -> list[tuple[str, dict]]:
    bucket, prefix = _split_s3(uri)
    objects = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            objects += [(obj["Key"][len(prefix) :], obj) for obj in page.get("Contents", [])]
    except Exception as e:  # botocore raises many kinds; all mean "cannot read it"
        raise TridentError(f"checkpoint {uri}: cannot list it on S3: {e}") from e
    return sorted(objects, key=lambda item: item[0])


def download_checkpoint(client, uri: str, dest: Path) -> Path:
    for rel, obj in _s3_objects(client, uri):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        bucket, _ = _split_s3(uri)
        client.download_file(bucket, obj["Key"], str(target))
    return dest


def s3_client_factory(endpoint_url: str | None) -> Callable[[], object]:
    def make():
        import boto3

        return boto3.client("s3", endpoint_url=endpoint_url)

    return make


# ---------------------------------------------------------------------------------------
# The cache


@dataclass(frozen=True)
class CacheLocation:
    local_dir: Path
    s3: str | None
    endpoint_url: str | None
    local_only: bool


def cache_location(
    spec: DeploymentSpec | None, s3: str | None = None, local_dir: str | None = None
) -> CacheLocation:
    """The spec's engine_cache section, overridden by --cache / --local-cache."""

    cfg = spec.engine_cache if spec else EngineCacheSpec()
    local = local_dir or (spec_path(spec, cfg.local_dir) if spec else cfg.local_dir)
    return CacheLocation(
        Path(os.path.expanduser(local)), s3 or cfg.s3, cfg.endpoint_url, cfg.local_only
    )


def digest_memo(location: CacheLocation) -> Path:
    """Where checkpoint file hashes are remembered: beside the local engine tier."""
    return Path(location.local_dir) / "checkpoint-digests.json"


def open_cache(location: CacheLocation):

    return EngineCache(
        location.local_dir,
        s3_uri=location.s3,
        endpoint_url=location.endpoint_url,
        local_only=location.local_only,
    )


def describe(location: CacheLocation) -> str:
    return f"local {location.local_dir}" + (f", {location.s3}" if location.s3 else "")


# ---------------------------------------------------------------------------------------
# Building


@dataclass(frozen=True)
class Outcome:
    job: EngineJob
    status: str  # built | fetched | skipped | failed
    seconds: float
    path: Path | None = None
    error: str | None = None


class Builder:
    """Runs jobs through the cache; the build callable converts and compiles."""

    def __init__(
        self,
        spec: DeploymentSpec,
        cache,
        tools: Tools,
        target: Target,
        s3_client: Callable[[], object],
        env: Mapping[str, str],
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.spec, self.cache, self.tools, self.target = spec, cache, tools, target
        self.s3_client, self.env, self.write, self.clock = s3_client, env, write, clock

    def run(self, job: EngineJob) -> Outcome:
        started = self.clock()
        path, status = self.cache.get_or_build(
            job.key, self.build_callable(job), self.metadata(job)
        )
        return Outcome(job, STATUS_WORDS[status], self.clock() - started, Path(path))

    def run_all(self, jobs: Iterable[EngineJob], keep_going: bool) -> list[Outcome]:
        outcomes = []
        for job in jobs:
            started = self.clock()
            try:
                outcomes.append(self.run(job))
            except (TridentError, CacheError) as e:
                if not keep_going:
                    raise
                outcomes.append(Outcome(job, "failed", self.clock() - started, error=str(e)))
        return outcomes

    def metadata(self, job: EngineJob) -> dict:
        return {
            "model": job.model,
            "profile": job.profile.name,
            "spec": self.spec.file,
            "target_sm": self.target.sm,
            "trtllm_version": self.target.trtllm_version,
            "tensorrt_version": self.target.tensorrt_version,
            "build_args": dict(job.inputs.build_args),
        }

    def build_callable(self, job: EngineJob) -> Callable[[Path], None]:
        def build(out_dir: Path) -> None:
            out_dir = Path(out_dir)
            with tempfile.TemporaryDirectory(prefix="trident-build-") as work:
                checkpoint_dir = self.checkpoint_dir(job, Path(work))
                steps = trtllm_build.plan_steps(
                    job.checkpoint,
                    job.build,
                    job.profile,
                    self.tools,
                    checkpoint_dir,
                    work,
                    str(out_dir),
                    job.lora,
                )
                progress = Progress(job.title, len(steps), self.write, self.clock)
                trtllm_build.run_steps(steps, out_dir / BUILD_LOG_FILE, progress, self.env)
            info = {
                **self.metadata(job),
                "key": job.key,
                "commands": [step.shell() for step in steps],
            }
            (out_dir / ENGINE_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))

        return build

    def checkpoint_dir(self, job: EngineJob, work: Path) -> str:
        """Where trtllm-build reads the converted checkpoint from ("" when converting)."""
        if job.checkpoint.needs_conversion:
            return ""
        path = checkpoint_source(job.checkpoint)
        if path.startswith("s3://"):
            return str(download_checkpoint(self.s3_client(), path, work / "source"))
        return path


# ---------------------------------------------------------------------------------------
# `trident repo`


def engines_for_repository(
    spec: DeploymentSpec,
    trtllm: list[ModelSpec],
    env: Mapping[str, str] | None = None,
    probe: MachineProbe | None = None,
) -> dict[str, ServedEngine]:
    """Model name → the engine of its served profile (local dir and key), fetched from
    the cache when needed. Never builds: a missing engine fails naming its key and the
    build command."""
    env = os.environ if env is None else env
    target = spec_target(spec, env, probe or MachineProbe())
    location = cache_location(spec)
    digest = CheckpointDigests(s3_client_factory(location.endpoint_url), digest_memo(location))
    cache = open_cache(location)
    engines = {}
    for model in trtllm:
        profile = trtllm_spec.serving_profile(model.extra)
        job = plan_job(spec, model, profile, target, digest)
        path = cache.lookup(job.key)
        if path is None:
            raise EngineMissing(
                f"model {model.name}: no engine for profile {profile.name!r} "
                f"(key {job.key}, SM {target.sm}, TensorRT-LLM {target.trtllm_version}) in "
                f"the engine cache ({describe(location)}); build it with: "
                f"{build_command(spec, profile.name)}"
            )
        engines[model.name] = ServedEngine(str(Path(path).resolve()), job.key)
    return engines
