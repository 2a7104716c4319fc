"""A TRT-LLM build profile → the exact command lines that make its engine, and a runner.

Targets TensorRT-LLM v0.16 (`trtllm-build` from tensorrt_llm/commands/build.py, the
convert scripts under examples/<family>/, examples/quantization/quantize.py). The flags,
one by one, are documented where they are produced below and in docs/trtllm.md.

Pure: `target_of`, `conversion_step`, `build_step`, `plan_steps`, `key_args` are functions of
their inputs (the environment and the machine probe are passed in). I/O: `MachineProbe`
(package versions, nvidia-smi) and `run_steps` (subprocesses with live logs and progress).
"""

from __future__ import annotations

import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from builder.engines import lora as lora_mod
from builder.engines.lora import LoraBuild
from builder.errors import EXIT_USAGE, TridentError
from builder.spec.trtllm import BuildSettings, Checkpoint, Profile

TRTLLM_TARGET_VERSION = "0.16"
ENV_BUILD = "TRIDENT_TRTLLM_BUILD"
ENV_CONVERT = "TRIDENT_TRTLLM_CONVERT"
ENV_QUANTIZE = "TRIDENT_TRTLLM_QUANTIZE"
ENV_EXAMPLES = "TRIDENT_TRTLLM_EXAMPLES"
ENV_TRTLLM_VERSION = "TRIDENT_TRTLLM_VERSION"
ENV_TENSORRT_VERSION = "TRIDENT_TENSORRT_VERSION"
ENV_TARGET_SM = "TRIDENT_TARGET_SM"

# trident dtype → TRT-LLM dtype names (convert --dtype, plugin dtypes).
TRT_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
# Quantizations made by ModelOpt through quantize.py --qformat.
QFORMATS = {"fp8": "fp8", "int4-awq": "int4_awq", "w4a8-awq": "w4a8_awq", "int8-sq": "int8_sq"}
# Weight-only quantizations made by convert_checkpoint.py.
WEIGHT_ONLY = {"int8-wo": "int8", "int4-wo": "int4"}
SPECULATIVE_BUILD_MODES = {
    "draft-model": "draft_tokens_external",
    "medusa": "medusa",
    "eagle": "eagle",
}


class ToolchainError(TridentError):
    """The build machine's TensorRT-LLM / TensorRT / GPU cannot be determined or disagree."""

    exit_code = EXIT_USAGE


class BuildStepFailed(TridentError):
    """A conversion or trtllm-build subprocess failed; the message names it and its log."""


# ---------------------------------------------------------------------------------------
# What the engine is built for: versions and SM (detected or from the environment)


@dataclass(frozen=True)
class Target:
    trtllm_version: str
    tensorrt_version: str
    sm: str  # compute capability without the dot, e.g. "90"


class MachineProbe:
    """What this machine has installed; every answer may be None (not present)."""

    def package_version(self, name: str) -> str | None:
        from importlib import metadata

        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    def compute_capabilities(self) -> list[str] | None:
        try:
            result = subprocess.run(
                ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return None
        if result.returncode != 0:
            return None
        return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def normalize_sm(value: str) -> str:
    """'9.0', 'sm_90', 'sm90' and '90' all name SM 90."""
    text = value.strip().lower().removeprefix("sm_").removeprefix("sm")
    digits = text.replace(".", "")
    if not digits.isdigit() or len(digits) not in (2, 3):
        raise ToolchainError(f"{value!r} is not a GPU compute capability (e.g. 90 or 8.9)")
    return digits


def _agree(what: str, sources: Sequence[tuple[str, str | None]], hint: str) -> str:
    """The one value all present sources give; an error when none or when they differ."""
    present = [(label, value) for label, value in sources if value]
    if not present:
        raise ToolchainError(f"cannot determine the {what}: {hint}")
    if len({value for _, value in present}) > 1:
        detail = ", ".join(f"{label} says {value}" for label, value in present)
        raise ToolchainError(
            f"the {what} is ambiguous ({detail}): an engine keyed with one "
            "and built with another would be served on the wrong machine"
        )
    return present[0][1]


def _detected_sm(probe: MachineProbe) -> str | None:
    caps = probe.compute_capabilities()
    if not caps:
        return None
    sms = sorted({normalize_sm(c) for c in caps})
    if len(sms) > 1:
        raise ToolchainError(
            f"this machine mixes GPU architectures (SM {', '.join(sms)}); "
            f"set {ENV_TARGET_SM} and CUDA_VISIBLE_DEVICES to pick one"
        )
    return sms[0]


def target_of(env: Mapping[str, str], probe: MachineProbe, spec_sm: str | None = None) -> Target:
    """Versions and SM from the machine, the environment and the spec's hardware.

    Never defaulted: each must come from at least one source, and all sources that give
    one must agree."""
    trtllm = _agree(
        "TensorRT-LLM version",
        [
            ("installed tensorrt_llm", probe.package_version("tensorrt_llm")),
            (ENV_TRTLLM_VERSION, env.get(ENV_TRTLLM_VERSION)),
        ],
        f"install tensorrt_llm or set {ENV_TRTLLM_VERSION} (e.g. 0.16.0)",
    )
    tensorrt = _agree(
        "TensorRT version",
        [
            ("installed tensorrt", probe.package_version("tensorrt")),
            (ENV_TENSORRT_VERSION, env.get(ENV_TENSORRT_VERSION)),
        ],
        f"install tensorrt or set {ENV_TENSORRT_VERSION} (e.g. 10.7.0)",
    )
    env_sm = env.get(ENV_TARGET_SM)
    sm = _agree(
        "target GPU architecture (SM)",
        [
            ("nvidia-smi", _detected_sm(probe)),
            (ENV_TARGET_SM, normalize_sm(env_sm) if env_sm else None),
            ("the spec's hardware.gpu", spec_sm),
        ],
        f"run on the target GPU, set {ENV_TARGET_SM} (e.g. 90) or name hardware.gpu in the spec",
    )
    return Target(trtllm, tensorrt, sm)


# ---------------------------------------------------------------------------------------
# Tools


@dataclass(frozen=True)
class Tools:
    build: tuple[str, ...]  # trtllm-build
    convert: tuple[str, ...] | None  # one converter for every family (a stand-in), or None
    quantize: tuple[str, ...] | None
    examples: str | None  # a TensorRT-LLM checkout's examples/ directory


def tools_from_env(env: Mapping[str, str]) -> Tools:
    def command(name: str) -> tuple[str, ...] | None:
        value = env.get(name, "").strip()
        return tuple(shlex.split(value)) if value else None

    return Tools(
        build=command(ENV_BUILD) or ("trtllm-build",),
        convert=command(ENV_CONVERT),
        quantize=command(ENV_QUANTIZE),
        examples=env.get(ENV_EXAMPLES) or None,
    )


def _script(
    tools: Tools, override: tuple[str, ...] | None, override_env: str, relative: str
) -> tuple[str, ...]:
    if override:
        return override
    if tools.examples:
        return (sys.executable, str(Path(tools.examples) / relative))
    raise ToolchainError(
        f"no converter for {relative}: set {ENV_EXAMPLES} to a TensorRT-LLM "
        f"v{TRTLLM_TARGET_VERSION} examples/ directory, or {override_env}"
    )


# ---------------------------------------------------------------------------------------
# Command lines


@dataclass(frozen=True)
class Step:
    label: str  # convert | quantize | build
    argv: tuple[str, ...]

    def shell(self) -> str:
        return shlex.join(self.argv)


def uses_modelopt(build: BuildSettings) -> bool:
    return build.quantization in QFORMATS or build.kv_cache_dtype == "fp8"


def conversion_step(
    checkpoint: Checkpoint, build: BuildSettings, profile: Profile, tools: Tools, out_dir: str
) -> Step:
    """HF folder → TRT-LLM checkpoint in out_dir (one rank<N>.safetensors per rank)."""
    if checkpoint.hf_model is None:  # plan_steps converts only a checkpoint that has one
        raise ValueError("conversion_step: the checkpoint has no hf_model to convert")
    common = [
        "--model_dir",
        checkpoint.hf_model,  # the Hugging Face folder
        "--output_dir",
        out_dir,  # the TRT-LLM checkpoint written
        "--dtype",
        TRT_DTYPES[build.dtype],  # weights / activations dtype
        "--tp_size",
        str(build.tp_size),  # tensor parallel ranks
        "--pp_size",
        str(build.pp_size),
    ]  # pipeline parallel stages
    if uses_modelopt(build):
        # examples/quantization/quantize.py (NVIDIA ModelOpt, calibrates on cnn_dailymail).
        argv = [
            *_script(tools, tools.quantize, ENV_QUANTIZE, "quantization/quantize.py"),
            *common,
            "--qformat",
            QFORMATS.get(build.quantization, "full_prec"),
            "--calib_size",
            "512",
        ]  # calibration samples (its default)
        if build.kv_cache_dtype != "auto":
            argv += ["--kv_cache_dtype", build.kv_cache_dtype]
        return Step("quantize", tuple(argv))
    family = checkpoint.family
    speculative = profile.speculative
    if speculative and speculative.mode in ("medusa", "eagle"):
        family = speculative.mode  # its convert script merges the heads
    argv = [*_script(tools, tools.convert, ENV_CONVERT, f"{family}/convert_checkpoint.py"), *common]
    if build.quantization in WEIGHT_ONLY:
        argv += ["--use_weight_only", "--weight_only_precision", WEIGHT_ONLY[build.quantization]]
    if build.kv_cache_dtype == "int8":
        argv += ["--int8_kv_cache"]
    # The spec's parser requires heads_model for medusa and eagle.
    if speculative and speculative.mode == "medusa" and speculative.heads_model:
        argv += [
            "--medusa_model_dir",
            speculative.heads_model,
            "--num_medusa_heads",
            str(speculative.num_heads),
            "--max_medusa_token_len",
            str(speculative.max_draft_len),
        ]
    if speculative and speculative.mode == "eagle" and speculative.heads_model:
        argv += [
            "--eagle_model_dir",
            speculative.heads_model,
            "--num_eagle_layers",
            str(speculative.num_heads),
            "--max_draft_len",
            str(speculative.max_draft_len),
        ]
    return Step("convert", tuple(argv))


def gemm_plugin_value(profile: Profile, build: BuildSettings) -> str:
    value = profile.plugins.gemm_plugin
    return TRT_DTYPES[build.dtype] if value == "auto" else TRT_DTYPES.get(value, value)


def build_step(
    profile: Profile,
    build: BuildSettings,
    tools: Tools,
    checkpoint_dir: str,
    out_dir: str,
    lora: LoraBuild | None = None,
) -> Step:
    """trtllm-build: TRT-LLM checkpoint → rank<N>.engine + config.json in out_dir."""
    argv = [
        *tools.build,
        "--checkpoint_dir",
        checkpoint_dir,
        "--output_dir",
        out_dir,
        *_limit_flags(profile),
        *_plugin_flags(profile, build),
        "--workers",
        "1",  # ranks built one at a time
        "--log_level",
        "info",
    ]
    if profile.weight_streaming:
        argv += ["--weight_streaming"]  # lets gpu_weights_percent < 1 at runtime
    if profile.speculative:
        argv += [
            "--speculative_decoding_mode",
            SPECULATIVE_BUILD_MODES[profile.speculative.mode],
            "--max_draft_len",
            str(profile.speculative.max_draft_len),
        ]
    if lora:
        argv += lora_mod.build_flags(lora)  # LoRA plugin, adapters, rank, modules
    return Step("build", tuple(argv))


def _limit_flags(profile: Profile) -> list[str]:
    """The engine's shapes: what it is built to take at most."""
    return [
        "--max_batch_size",
        str(profile.max_batch_size),  # requests scheduled at once
        "--max_input_len",
        str(profile.max_input_len),  # longest prompt
        "--max_seq_len",
        str(profile.max_seq_len),  # prompt + output
        "--max_num_tokens",
        str(profile.max_num_tokens),  # tokens per forward pass
        "--max_beam_width",
        str(profile.max_beam_width),
    ]


def _plugin_flags(profile: Profile, build: BuildSettings) -> list[str]:
    """The KV cache's layout and the plugins, each switched on or off."""
    plugins = profile.plugins

    def switch(on: bool) -> str:
        return "enable" if on else "disable"

    return [
        "--kv_cache_type",
        "paged",  # inflight batching needs it
        "--tokens_per_block",
        str(plugins.tokens_per_block),
        "--gpt_attention_plugin",
        TRT_DTYPES[build.dtype],
        "--gemm_plugin",
        gemm_plugin_value(profile, build),
        "--context_fmha",
        switch(plugins.context_fmha),
        "--use_paged_context_fmha",
        switch(plugins.paged_context_fmha),
        "--remove_input_padding",
        switch(plugins.remove_input_padding),
        "--multiple_profiles",
        switch(plugins.multiple_profiles),
    ]


def plan_steps(
    checkpoint: Checkpoint,
    build: BuildSettings,
    profile: Profile,
    tools: Tools,
    checkpoint_dir: str,
    work_dir: str,
    out_dir: str,
    lora: LoraBuild | None = None,
) -> list[Step]:
    """All steps of one engine. checkpoint_dir: the converted checkpoint when the spec gives
    one (a local copy of checkpoint.path); else the conversion writes into work_dir."""
    steps = []
    if checkpoint.needs_conversion:
        checkpoint_dir = str(Path(work_dir) / "checkpoint")
        steps.append(conversion_step(checkpoint, build, profile, tools, checkpoint_dir))
    steps.append(build_step(profile, build, tools, checkpoint_dir, out_dir, lora))
    return steps


def key_args(
    checkpoint: Checkpoint,
    build: BuildSettings,
    profile: Profile,
    extra_digests: Mapping[str, str],
    lora: dict | None = None,
) -> dict:
    """Every build argument of one engine, for its cache key. Paths are left out: the
    checkpoint (and heads/draft weights, adapters) enter the key through content digests.
    `lora` (lora.key_args) only when the model has adapters: other keys stay as they were."""
    profile_args = asdict(profile)
    profile_args.pop("name")  # a profile renamed in the spec is the same engine
    profile_args.pop("serve")  # which engine is served is a runtime choice
    if profile.speculative:
        profile_args["speculative"].pop("heads_model")
    args = {
        "format": f"trtllm-{TRTLLM_TARGET_VERSION}-cli",
        "conversion": {"family": checkpoint.family, "modelopt": uses_modelopt(build)}
        if checkpoint.needs_conversion
        else None,
        "build": asdict(build),
        "profile": profile_args,
        "inputs": dict(sorted(extra_digests.items())),
    }
    if lora is not None:
        args["lora"] = lora
    return args


# ---------------------------------------------------------------------------------------
# Running the steps


class Progress:
    """Live display of a build: step headers, every tool line prefixed, a heartbeat when a
    tool is quiet, and elapsed times. `write` is where lines go (stderr by default)."""

    def __init__(
        self,
        title: str,
        total: int,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.title, self.total, self.clock = title, total, clock
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.started = clock()
        self.step_started = self.started
        self.index = 0

    def elapsed(self, since: float) -> str:
        seconds = int(self.clock() - since)
        return f"{seconds // 60}:{seconds % 60:02d}"

    def begin(self, step: Step) -> None:
        self.index += 1
        self.step_started = self.clock()
        self.write(f"==> {self.title} [{self.index}/{self.total}] {step.label}: {step.shell()}")

    def line(self, step: Step, text: str) -> None:
        self.write(f"    {step.label} {self.elapsed(self.step_started)} | {text}")

    def quiet(self, step: Step) -> None:
        self.write(f"    {step.label} {self.elapsed(self.step_started)} | ... still running")

    def end(self, step: Step) -> None:
        self.write(
            f"<== {self.title} [{self.index}/{self.total}] {step.label} done in "
            f"{self.elapsed(self.step_started)} (total {self.elapsed(self.started)})"
        )


def run_steps(
    steps: Sequence[Step],
    log_path: Path,
    progress: Progress,
    env: Mapping[str, str] | None = None,
    heartbeat_s: float = 30.0,
) -> None:
    """Run each step as a subprocess; its output goes to log_path and to the display.
    A failing step raises BuildStepFailed naming the step, its exit status and the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        for step in steps:
            progress.begin(step)
            log.write(f"$ {step.shell()}\n")
            log.flush()
            code = _run_one(step, log, progress, env, heartbeat_s)
            if code != 0:
                raise BuildStepFailed(
                    f"{progress.title}: {step.label} exited with status "
                    f"{code}: {step.shell()} (log: {log_path})"
                )
            progress.end(step)


def _run_one(
    step: Step, log, progress: Progress, env: Mapping[str, str] | None, heartbeat_s: float
) -> int:
    try:
        process = subprocess.Popen(
            step.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
        )
    except (FileNotFoundError, PermissionError) as e:
        variable = {"build": ENV_BUILD, "quantize": ENV_QUANTIZE}.get(step.label, ENV_CONVERT)
        raise BuildStepFailed(
            f"{progress.title}: cannot run {step.argv[0]!r} "
            f"({e.strerror}); install TensorRT-LLM or set {variable}"
        ) from None
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True)
    reader.start()
    try:
        while True:
            try:
                text = lines.get(timeout=heartbeat_s)
            except queue.Empty:
                progress.quiet(step)
                continue
            if text is None:
                break
            log.write(text)
            log.flush()
            progress.line(step, text.rstrip("\n"))
        return process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise


def _pump(stream, lines: queue.Queue) -> None:
    for text in stream:
        lines.put(text)
    lines.put(None)
