"""TRT-LLM spec sections: parsed into frozen objects; every defect names its field."""

import copy

import pytest

from builder.spec import SpecError, load_spec, parse_spec
from builder.spec.trtllm import Checkpoint, Profile, serving_profile

BASE = {
    "name": "t",
    "models": [
        {
            "name": "llama",
            "engine": "tensorrt_llm",
            "checkpoint": {"hf_model": "/m/llama", "family": "llama"},
            "build": {"dtype": "bf16", "tp_size": 2},
            "profiles": {
                "short-context": {
                    "max_batch_size": 64,
                    "max_input_len": 2048,
                    "max_seq_len": 4096,
                    "max_num_tokens": 8192,
                },
                "long-context": {
                    "max_batch_size": 8,
                    "max_input_len": 32768,
                    "max_seq_len": 65536,
                    "max_num_tokens": 8192,
                    "plugins": {"paged_context_fmha": True},
                    "serve": True,
                },
            },
        }
    ],
}


def spec_with(**changes):
    data = copy.deepcopy(BASE)
    model = data["models"][0]
    for path, value in changes.items():
        node = model
        *parents, last = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def error_of(data) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(data, "s.yaml")
    assert e.value.exit_code == 2
    return str(e.value)


def test_sections_parse_into_frozen_objects():
    model = parse_spec(copy.deepcopy(BASE)).models[0]
    assert model.extra["checkpoint"] == Checkpoint(hf_model="/m/llama", family="llama")
    assert model.extra["build"].world_size == 2
    profile = model.extra["profiles"]["short-context"]
    assert isinstance(profile, Profile) and profile.plugins.paged_kv_cache
    assert serving_profile(model.extra).name == "long-context"
    with pytest.raises(TypeError):
        model.extra["profiles"]["x"] = profile


def test_first_profile_is_served_without_a_serve_flag():
    data = spec_with(**{"profiles__long-context": None})
    assert serving_profile(parse_spec(data).models[0].extra).name == "short-context"


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {"profiles__short-context__max_seq_len": 1024},
            "models[0].profiles.short-context.max_seq_len: must be >= max_input_len (2048)",
        ),
        (
            {"profiles__short-context__max_num_tokens": 1024},
            "models[0].profiles.short-context.max_num_tokens: must be >= max_input_len",
        ),
        (
            {"profiles__short-context__max_batch_size": 0},
            "models[0].profiles.short-context.max_batch_size: must be >= 1",
        ),
        (
            {"profiles__short-context__turbo": True},
            "models[0].profiles.short-context.turbo: unknown key",
        ),
        (
            {"profiles__short-context__plugins__paged_kv_cache": False},
            "models[0].profiles.short-context.plugins.paged_kv_cache: inflight fused batching",
        ),
        (
            {"profiles__short-context__plugins__tokens_per_block": 48},
            "plugins.tokens_per_block: must be a power of two",
        ),
        (
            {"profiles__short-context__serve": True},
            "models[0].profiles: only one profile may set serve: true",
        ),
        (
            {"build__dtype": "fp8"},
            "models[0].build.dtype: 'fp8' is a quantization: set build.quantization: fp8",
        ),
        ({"build__quantization": "int3"}, "models[0].build.quantization: 'int3' is not one of"),
        ({"build__tp_size": 0}, "models[0].build.tp_size: must be >= 1"),
        ({"checkpoint__path": "s3://b/ckpt"}, "models[0].checkpoint: give exactly one of path"),
        ({"checkpoint__family": None}, "models[0].checkpoint.family: is required with hf_model"),
        ({"checkpoint__family": "llamma"}, "models[0].checkpoint.family: 'llamma' is not one of"),
        ({"checkpoint": None}, "models[0].checkpoint: is required for engine tensorrt_llm"),
        ({"profiles": {}}, "models[0].profiles: must name at least one build profile"),
        (
            {
                "engine_args": {"enable_kv_cache_reuse": True},
                "profiles__long-context__serve": False,
            },
            "models[0].engine_args.enable_kv_cache_reuse: needs the served profile 'short-context' "
            "built with profiles.short-context.plugins.paged_context_fmha: true",
        ),
        (
            {"engine_args": {"gpu_weights_percent": 0.5}},
            "models[0].engine_args.gpu_weights_percent: < 1 needs the served profile "
            "'long-context' built with profiles.long-context.weight_streaming: true",
        ),
        (
            {"engine_args": {"max_batch_size": 9}},
            "models[0].engine_args.max_batch_size: 9 exceeds the served profile's "
            "max_batch_size (8)",
        ),
        (
            {"profiles__short-context__speculative": {"mode": "medusa", "max_draft_len": 4}},
            "models[0].profiles.short-context.speculative.heads_model: is required for mode medusa",
        ),
        (
            {
                "profiles__short-context__speculative": {
                    "mode": "draft-model",
                    "max_draft_len": 4,
                    "draft_model": "small",
                    "num_heads": 2,
                }
            },
            "speculative.num_heads: only applies to medusa and eagle",
        ),
        (
            {
                "build__quantization": "fp8",
                "profiles__short-context__speculative": {
                    "mode": "eagle",
                    "max_draft_len": 4,
                    "heads_model": "/m/eagle",
                    "num_heads": 1,
                },
            },
            "models[0].profiles.short-context.speculative.mode: the eagle convert script",
        ),
    ],
)
def test_defects_name_the_field(changes, expected):
    assert expected in error_of(spec_with(**changes))


def test_converted_checkpoint_needs_tokenizer_and_no_quantization():
    data = spec_with(checkpoint={"path": "s3://bucket/ckpt"})
    assert "models[0].tokenizer: is required when checkpoint.path" in error_of(data)
    data["models"][0]["tokenizer"] = {"path": "/m/tok"}
    data["models"][0]["build"]["quantization"] = "fp8"
    assert "models[0].build.quantization: applies when trident converts" in error_of(data)
    del data["models"][0]["build"]["quantization"]
    assert parse_spec(data).models[0].extra["checkpoint"].path == "s3://bucket/ckpt"


def test_kv_cache_reuse_accepted_when_served_profile_supports_it():
    data = spec_with(engine_args={"enable_kv_cache_reuse": True, "gpu_weights_percent": 1})
    model = parse_spec(data).models[0]
    assert model.engine_args["enable_kv_cache_reuse"] is True


def test_h100x8_example_has_the_seeds_profiles(root):
    spec = load_spec(root / "deploy" / "examples" / "h100x8.yaml")
    model = next(m for m in spec.models if m.engine == "tensorrt_llm")
    assert set(model.extra["profiles"]) == {
        "short-context",
        "long-context",
        "small-batch",
        "large-batch",
    }
    assert model.extra["build"].quantization == "fp8"
