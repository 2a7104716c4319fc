"""Profile → exact command lines; versions/SM never defaulted; the subprocess runner."""

import sys
from dataclasses import replace

import pytest

from builder.engines.trtllm_build import (
    BuildStepFailed,
    Progress,
    Step,
    Target,
    ToolchainError,
    Tools,
    build_step,
    conversion_step,
    key_args,
    normalize_sm,
    plan_steps,
    run_steps,
    target_of,
    tools_from_env,
)
from builder.spec.trtllm import BuildSettings, Checkpoint, Plugins, Profile, Speculative

TOOLS = Tools(build=("trtllm-build",), convert=None, quantize=None, examples="/trtllm/examples")
HF = Checkpoint(hf_model="/m/llama", family="llama")
SHORT = Profile(
    "short-context", max_batch_size=64, max_input_len=2048, max_seq_len=4096, max_num_tokens=8192
)
LONG = Profile(
    "long-context",
    max_batch_size=8,
    max_input_len=32768,
    max_seq_len=65536,
    max_num_tokens=16384,
    plugins=Plugins(paged_context_fmha=True, gemm_plugin="disable"),
)


def flags(argv):
    """--flag value pairs (and bare switches → True) of a command line."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[argv[i]] = argv[i + 1]
                i += 2
                continue
            out[argv[i]] = True
        i += 1
    return out


def test_build_command_of_short_context_bf16_exact():
    step = build_step(SHORT, BuildSettings(dtype="bf16", tp_size=4), TOOLS, "/w/ckpt", "/out")
    assert step.argv == (
        "trtllm-build",
        "--checkpoint_dir",
        "/w/ckpt",
        "--output_dir",
        "/out",
        "--max_batch_size",
        "64",
        "--max_input_len",
        "2048",
        "--max_seq_len",
        "4096",
        "--max_num_tokens",
        "8192",
        "--max_beam_width",
        "1",
        "--kv_cache_type",
        "paged",
        "--tokens_per_block",
        "64",
        "--gpt_attention_plugin",
        "bfloat16",
        "--gemm_plugin",
        "bfloat16",
        "--context_fmha",
        "enable",
        "--use_paged_context_fmha",
        "disable",
        "--remove_input_padding",
        "enable",
        "--multiple_profiles",
        "disable",
        "--workers",
        "1",
        "--log_level",
        "info",
    )


def test_build_command_follows_profile_plugins_and_features():
    profile = replace(
        LONG,
        weight_streaming=True,
        speculative=Speculative("medusa", 4, heads_model="/m/h", num_heads=3),
    )
    f = flags(build_step(profile, BuildSettings(dtype="fp16"), TOOLS, "/c", "/o").argv)
    assert f["--max_input_len"] == "32768" and f["--max_seq_len"] == "65536"
    assert f["--use_paged_context_fmha"] == "enable" and f["--gemm_plugin"] == "disable"
    assert f["--gpt_attention_plugin"] == "float16"
    assert f["--weight_streaming"] is True
    assert f["--speculative_decoding_mode"] == "medusa" and f["--max_draft_len"] == "4"


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (4, 2)])
def test_convert_command_per_tp_pp(tp, pp):
    step = conversion_step(
        HF, BuildSettings(dtype="fp16", tp_size=tp, pp_size=pp), SHORT, TOOLS, "/w/ckpt"
    )
    assert step.label == "convert"
    assert step.argv[:2] == (sys.executable, "/trtllm/examples/llama/convert_checkpoint.py")
    f = flags(step.argv)
    assert (f["--model_dir"], f["--output_dir"], f["--dtype"]) == ("/m/llama", "/w/ckpt", "float16")
    assert (f["--tp_size"], f["--pp_size"]) == (str(tp), str(pp))


@pytest.mark.parametrize(
    "quantization, qformat",
    [("fp8", "fp8"), ("int4-awq", "int4_awq"), ("w4a8-awq", "w4a8_awq"), ("int8-sq", "int8_sq")],
)
def test_modelopt_quantizations_use_quantize_py(quantization, qformat):
    build = BuildSettings(dtype="bf16", quantization=quantization, kv_cache_dtype="fp8", tp_size=2)
    step = conversion_step(HF, build, SHORT, TOOLS, "/w/ckpt")
    assert step.label == "quantize"
    assert step.argv[1] == "/trtllm/examples/quantization/quantize.py"
    f = flags(step.argv)
    assert f["--qformat"] == qformat and f["--kv_cache_dtype"] == "fp8"
    assert f["--dtype"] == "bfloat16" and f["--tp_size"] == "2"


def test_weight_only_and_int8_kv_use_the_convert_script():
    build = BuildSettings(quantization="int4-wo", kv_cache_dtype="int8")
    f = flags(conversion_step(HF, build, SHORT, TOOLS, "/w").argv)
    assert f["--use_weight_only"] is True and f["--weight_only_precision"] == "int4"
    assert f["--int8_kv_cache"] is True and "--qformat" not in f


def test_medusa_and_eagle_convert_with_their_scripts():
    medusa = replace(SHORT, speculative=Speculative("medusa", 5, heads_model="/h", num_heads=4))
    step = conversion_step(HF, BuildSettings(), medusa, TOOLS, "/w")
    assert step.argv[1] == "/trtllm/examples/medusa/convert_checkpoint.py"
    f = flags(step.argv)
    assert (f["--medusa_model_dir"], f["--num_medusa_heads"], f["--max_medusa_token_len"]) == (
        "/h",
        "4",
        "5",
    )
    eagle = replace(SHORT, speculative=Speculative("eagle", 3, heads_model="/e", num_heads=1))
    f = flags(conversion_step(HF, BuildSettings(), eagle, TOOLS, "/w").argv)
    assert f["--eagle_model_dir"] == "/e" and f["--num_eagle_layers"] == "1"


def test_plan_of_a_converted_checkpoint_is_only_the_build():
    steps = plan_steps(Checkpoint(path="/ckpt"), BuildSettings(), SHORT, TOOLS, "/ckpt", "/w", "/o")
    assert [s.label for s in steps] == ["build"]
    steps = plan_steps(HF, BuildSettings(), SHORT, TOOLS, "", "/w", "/o")
    assert [s.label for s in steps] == ["convert", "build"]
    assert flags(steps[1].argv)["--checkpoint_dir"] == flags(steps[0].argv)["--output_dir"]


def test_tool_paths_come_from_the_environment():
    tools = tools_from_env(
        {"TRIDENT_TRTLLM_BUILD": "python3 /x/fake build.py", "TRIDENT_TRTLLM_CONVERT": "/x/convert"}
    )
    assert tools.build == ("python3", "/x/fake", "build.py")
    assert conversion_step(HF, BuildSettings(), SHORT, tools, "/w").argv[0] == "/x/convert"
    assert tools_from_env({}).build == ("trtllm-build",)
    with pytest.raises(ToolchainError, match="TRIDENT_TRTLLM_EXAMPLES.*TRIDENT_TRTLLM_CONVERT"):
        conversion_step(HF, BuildSettings(), SHORT, tools_from_env({}), "/w")


def test_key_args_change_with_every_build_input_but_not_names_or_paths():
    base = key_args(HF, BuildSettings(), SHORT, {})
    assert key_args(HF, BuildSettings(), replace(SHORT, name="renamed", serve=True), {}) == base
    assert key_args(replace(HF, hf_model="/elsewhere"), BuildSettings(), SHORT, {}) == base
    for changed in (
        key_args(HF, BuildSettings(tp_size=2), SHORT, {}),
        key_args(HF, BuildSettings(), replace(SHORT, max_num_tokens=4096), {}),
        key_args(HF, BuildSettings(), replace(SHORT, plugins=Plugins(paged_context_fmha=True)), {}),
        key_args(HF, BuildSettings(), SHORT, {"speculative_heads": "ab"}),
    ):
        assert changed != base


class Probe:
    def __init__(self, trtllm=None, tensorrt=None, caps=None):
        self.versions = {"tensorrt_llm": trtllm, "tensorrt": tensorrt}
        self.caps = caps

    def package_version(self, name):
        return self.versions[name]

    def compute_capabilities(self):
        return self.caps


ENV = {
    "TRIDENT_TRTLLM_VERSION": "0.16.0",
    "TRIDENT_TENSORRT_VERSION": "10.7.0",
    "TRIDENT_TARGET_SM": "9.0",
}


def test_target_from_environment_or_machine():
    assert target_of(ENV, Probe()) == Target("0.16.0", "10.7.0", "90")
    assert target_of({}, Probe("0.16.0", "10.7.0", ["8.9", "8.9"])) == Target(
        "0.16.0", "10.7.0", "89"
    )
    assert (
        target_of({k: v for k, v in ENV.items() if "SM" not in k}, Probe(), spec_sm="90").sm == "90"
    )


@pytest.mark.parametrize(
    "missing, message",
    [
        (
            "TRIDENT_TRTLLM_VERSION",
            "cannot determine the TensorRT-LLM version: install "
            "tensorrt_llm or set TRIDENT_TRTLLM_VERSION",
        ),
        ("TRIDENT_TENSORRT_VERSION", "cannot determine the TensorRT version"),
        ("TRIDENT_TARGET_SM", "cannot determine the target GPU architecture (SM)"),
    ],
)
def test_missing_version_or_sm_is_a_clear_error(missing, message):
    env = {k: v for k, v in ENV.items() if k != missing}
    with pytest.raises(ToolchainError) as e:
        target_of(env, Probe())
    assert message in str(e.value) and e.value.exit_code == 2


def test_disagreeing_sources_are_an_error():
    with pytest.raises(ToolchainError, match="installed tensorrt_llm says 0.17.0"):
        target_of(ENV, Probe(trtllm="0.17.0"))
    with pytest.raises(ToolchainError, match="the spec's hardware.gpu says 80"):
        target_of(ENV, Probe(), spec_sm="80")
    with pytest.raises(ToolchainError, match="mixes GPU architectures"):
        target_of({}, Probe("0.16.0", "10.7.0", ["9.0", "8.0"]))


@pytest.mark.parametrize(
    "text, sm", [("9.0", "90"), ("sm_90", "90"), ("89", "89"), ("10.0", "100")]
)
def test_normalize_sm(text, sm):
    assert normalize_sm(text) == sm


def test_normalize_sm_rejects_garbage():
    with pytest.raises(ToolchainError, match="not a GPU compute capability"):
        normalize_sm("hopper")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_run_steps_streams_lines_logs_and_reports_progress(tmp_path):
    lines = []
    script = "import sys, time\nprint('one', flush=True)\ntime.sleep(0.3)\nprint('two')"
    steps = [
        Step("convert", (sys.executable, "-c", script)),
        Step("build", (sys.executable, "-c", "print('built')")),
    ]
    progress = Progress("m/p", len(steps), lines.append, FakeClock())
    run_steps(steps, tmp_path / "build.log", progress, heartbeat_s=0.1)
    assert lines[0].startswith("==> m/p [1/2] convert: ")
    assert any(line.endswith("| one") for line in lines)
    assert any("... still running" in line for line in lines)  # quiet for 0.3 s
    assert any(line.startswith("<== m/p [2/2] build done in") for line in lines)
    log = (tmp_path / "build.log").read_text()
    assert "one\ntwo\n" in log and "built\n" in log and log.startswith("$ ")


def test_failing_step_names_step_status_and_log(tmp_path):
    steps = [
        Step("build", (sys.executable, "-c", "import sys; print('boom'); sys.exit(3)")),
        Step("never", (sys.executable, "-c", "print('x')")),
    ]
    with pytest.raises(BuildStepFailed) as e:
        run_steps(steps, tmp_path / "b.log", Progress("m/p", 2, lambda _: None))
    assert "m/p: build exited with status 3" in str(e.value)
    assert str(tmp_path / "b.log") in str(e.value)
    assert "boom" in (tmp_path / "b.log").read_text()


def test_missing_tool_names_the_variable(tmp_path):
    with pytest.raises(BuildStepFailed, match="install TensorRT-LLM or set TRIDENT_TRTLLM_BUILD"):
        run_steps(
            [Step("build", ("/nonexistent/trtllm-build",))],
            tmp_path / "l",
            Progress("m/p", 1, lambda _: None),
        )


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1.5h", 5400), ("2w", 1209600)],
)
def test_gc_durations(text, seconds):
    from builder.cli.engines import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "d", "-1d", "7 days", "1y"])
def test_gc_duration_errors(text):
    from builder.cli.engines import parse_duration
    from builder.errors import TridentError

    with pytest.raises(TridentError, match="is not a duration") as e:
        parse_duration(text)
    assert e.value.exit_code == 2
