"""LoRA adapters in the spec, the router and the request parser, without a server.

Real PEFT folders (support/lora.py) on disk; `trident repo` as the CLI runs it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from bls.policy import Policy, RequestFeatures, UnknownAdapter, adapter_name
from bls.router_config import RouterConfig
from builder.cli.main import main as trident
from builder.render.router_json import router_config
from builder.spec import parse_spec
from builder.spec.adapter_weights import base_shape
from builder.spec.adapters import LoraSettings, adapter_problem, engine_args
from builder.spec.node import SpecError
from support.lora import SMOLLM2, write_adapter, write_config
from trident_common.request import parse_generate


def model(name="m", engine="vllm", **extra):
    return {
        "name": name,
        "engine": engine,
        "model": "builtin:tiny-llama",
        "family": "llama",
        **extra,
    }


def trt_model(**extra):
    base = {
        "name": "t",
        "engine": "tensorrt_llm",
        "adapters": {"a": "x"},
        "checkpoint": {"path": "/ckpt"},
        "tokenizer": {"path": "/tok"},
        "profiles": {
            "p": {"max_batch_size": 1, "max_input_len": 8, "max_seq_len": 16, "max_num_tokens": 16}
        },
    }
    return {**base, **extra}


def test_tensorrt_llm_adapters_parse():
    m = spec_of(trt_model(build={"dtype": "fp16"}, lora={"max_lora_rank": 8})).models[0]
    assert dict(m.extra["adapters"]) == {"a": "x"} and m.extra["lora"].max_lora_rank == 8


def spec_of(*models, router=None):
    data = {"name": "t", "models": list(models)}
    if router is not None:
        data["router"] = router
    return parse_spec(data, "deploy/t.yaml")


def error_of(*models) -> str:
    with pytest.raises(SpecError) as e:
        spec_of(*models)
    return str(e.value)


# -- parsing ------------------------------------------------------------------------------


def test_adapters_and_limits_are_typed():
    spec = spec_of(
        model(
            adapters={"support": "a/support", "legal.v2": "/srv/legal"},
            lora={"max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 3},
        )
    )
    m = spec.models[0]
    assert dict(m.extra["adapters"]) == {"support": "a/support", "legal.v2": "/srv/legal"}
    assert m.extra["lora"] == LoraSettings(2, 8, 3)


@pytest.mark.parametrize(
    "models, expected",
    [
        (
            [model(adapters={"a:b": "x"})],
            "deploy/t.yaml: models[0].adapters: 'a:b' is not a safe adapter name",
        ),
        ([model(adapters={"../x": "x"})], "models[0].adapters: '../x' is not a safe"),
        ([model(adapters={"a": 3})], "models[0].adapters.a: expected"),
        ([model(adapters={"a": " "})], "models[0].adapters.a: must be the path"),
        ([model(adapters={})], "models[0].adapters: must name at least one adapter"),
        ([model(lora={"max_loras": 2})], "models[0].lora: is set but the model declares no"),
        ([model(adapters={"a": "x"}, lora={"max_lora_rank": 0})], "models[0].lora.max_lora_rank"),
        (
            [model(adapters={"a": "x"}, lora={"max_loras": 4, "max_cpu_loras": 2})],
            "models[0].lora.max_cpu_loras: must be >= max_loras (4), got 2",
        ),
        ([model(adapters={"a": "x"}, lora={"rank": 8})], "models[0].lora.rank"),
        (
            [model(adapters={"a": "x"}, engine_args={"max_loras": 2})],
            "models[0].engine_args.max_loras: is set by the lora section",
        ),
        (
            [trt_model(build={"dtype": "bf16"})],
            "models[0].adapters: TensorRT-LLM adapters need build.dtype fp16 or fp32",
        ),
        (
            [trt_model(adapters={"a": "s3://b/a"})],
            "models[0].adapters.a: TensorRT-LLM adapters are local folders",
        ),
        ([trt_model(lora={"max_cpu_loras": 8})], "models[0].lora.max_cpu_loras: applies to vllm"),
    ],
)
def test_bad_sections_name_the_field(models, expected):
    assert expected in error_of(*models)


# -- the folders (render time) ------------------------------------------------------------


def test_a_real_adapter_passes(tmp_path):
    folder = write_adapter(tmp_path / "a", seed=0, rank=8)
    assert adapter_problem(str(folder), "llama", LoraSettings(max_lora_rank=8)) is None


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda f: (f / "adapter_config.json").unlink(), "has no adapter_config.json"),
        (lambda f: write_config(f, peft_type="IA3"), "peft_type 'IA3', not 'LORA'"),
        (lambda f: write_config(f, rank=16), "rank r=16 is larger than lora.max_lora_rank (8)"),
        (lambda f: write_config(f, r="8"), "r must be a positive integer"),
        (
            lambda f: write_config(f, targets=["q_proj", "qkv_proj"]),
            "target_modules qkv_proj are not modules of a llama model",
        ),
        (lambda f: (f / "adapter_model.safetensors").unlink(), "no adapter_model.safetensors"),
        (lambda f: (f / "adapter_config.json").write_text("{"), "cannot read"),
    ],
)
def test_bad_folders_say_why(tmp_path, change, expected):
    folder = tmp_path / "a"
    folder.mkdir()
    write_config(folder)
    (folder / "adapter_model.safetensors").write_bytes(b"")
    change(folder)
    assert expected in adapter_problem(str(folder), "llama", LoraSettings(max_lora_rank=8))


def test_a_missing_folder(tmp_path):
    assert "is not a folder" in adapter_problem(str(tmp_path / "no"), "llama", LoraSettings())


def test_trident_repo_refuses_a_bad_adapter_with_one_line(tmp_path, capsys):
    write_adapter(tmp_path / "support", seed=0, rank=8)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "models": [
                    model(
                        model="builtin:tiny-llama",
                        adapters={"support": "support"},
                        lora={"max_lora_rank": 4},
                    )
                ],
            }
        )
    )
    out = tmp_path / "repo"
    assert trident(["repo", "--spec", str(spec_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {spec_file}: models[0].adapters.support: rank r=8 is larger "
        f"than lora.max_lora_rank (4)"
    )
    assert not out.exists()


# -- the weights and options vLLM would choke on (render time, issue 21) ------------------

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}  # builtin:tiny-llama (intermediate 128)
SMOLLM2_BASE = base_shape({**SMOLLM2, "intermediate_size": 1536})


def _safetensors(path, tensors: dict) -> None:
    """A real safetensors file (the library's writer) of zero tensors: name → (dtype, shape)."""
    from safetensors.numpy import save_file

    save_file(
        {name: np.zeros(shape, dtype=dtype) for name, (dtype, shape) in tensors.items()}, str(path)
    )


def _header_only(path, header: dict, data: bytes = b"") -> None:
    """A file framed as safetensors with any header (lengths the writer would never give)."""
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


_Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda f: (f / "adapter_model.safetensors").write_bytes(b""),
            "adapter_model.safetensors is empty, not a safetensors file",
        ),
        (
            lambda f: (f / "adapter_model.safetensors").write_bytes(b"\x00garbage, not weights"),
            "does not fit the file (21 bytes; not a safetensors file)",
        ),
        (
            lambda f: (f / "adapter_model.safetensors").write_bytes(
                b"\x04" + b"\x00" * 7 + b"{{{{"
            ),
            "the header is not JSON",
        ),
        (
            lambda f: _header_only(
                f / "adapter_model.safetensors",
                {
                    f"{_Q}.lora_A.weight": {
                        "dtype": "F32",
                        "shape": [8, 576],
                        "data_offsets": [0, 18432],
                    }
                },
                b"\x00" * 64,
            ),
            "lies outside the file's data (offsets 0..18432 of 64 bytes)",
        ),
        (
            lambda f: _header_only(
                f / "adapter_model.safetensors",
                {
                    f"{_Q}.lora_A.weight": {
                        "dtype": "F32",
                        "shape": [8, 576],
                        "data_offsets": [0, 64],
                    }
                },
                b"\x00" * 64,
            ),
            "holds 64 bytes, not the 18432 of F32 [8, 576]",
        ),
        (
            lambda f: _header_only(f / "adapter_model.safetensors", {f"{_Q}.lora_A.weight": [1]}),
            "has a malformed header entry",
        ),
        (
            lambda f: _safetensors(
                f / "adapter_model.safetensors",
                {
                    f"{_Q}.lora_A.weight": ("int32", (8, 576)),
                    f"{_Q}.lora_B.weight": ("int32", (576, 8)),
                },
            ),
            "has dtype I32 (LoRA weights are floats)",
        ),
        (
            lambda f: _safetensors(
                f / "adapter_model.safetensors", {f"{_Q}.lora_A.weight": ("float32", (8, 576))}
            ),
            "layer 0 q_proj has lora_A without lora_B",
        ),
        (
            lambda f: _safetensors(
                f / "adapter_model.safetensors",
                {
                    f"{_Q}.lora_A.weight": ("float32", (4, 576)),
                    f"{_Q}.lora_B.weight": ("float32", (576, 4)),
                },
            ),
            "do not have rank 8 (adapter_config.json)",
        ),
        (
            lambda f: _safetensors(
                f / "adapter_model.safetensors",
                {
                    f"{_Q}.lora_A.weight".replace("layers.0", "layers.30"): ("float32", (8, 576)),
                    f"{_Q}.lora_B.weight".replace("layers.0", "layers.30"): ("float32", (576, 8)),
                },
            ),
            "layer 30 q_proj: the base model has 30 layers",
        ),
        (
            lambda f: write_adapter(f, seed=0, rank=8, config=TINY),
            "layer 0 q_proj: lora_A takes 64 and lora_B gives 64 features; the base model's q_proj "
            "takes 576 and gives 576",
        ),
        (
            lambda f: _safetensors(
                f / "adapter_model.safetensors",
                {
                    f"{_Q}.lora_A.weight": ("float32", (8, 576)),
                    f"{_Q}.lora_B.weight": ("float32", (576, 8)),
                    f"{_Q}.lora_magnitude_vector.weight": ("float32", (576,)),
                },
            ),
            "is a DoRA magnitude",
        ),
        (
            lambda f: _safetensors(
                f / "adapter_model.safetensors",
                {"base_model.model.lm_head.lora_A.weight": ("float32", (8, 576))},
            ),
            "lm_head.lora_A.weight is not the lora_A/lora_B weight of a layer module",
        ),
        (lambda f: write_config(f, use_dora=True), "DoRA (use_dora) is not supported"),
        (lambda f: write_config(f, lora_bias=True), "LoRA bias (lora_bias) is not supported"),
        (lambda f: write_config(f, bias="all"), "bias 'all' is not supported by vLLM"),
        (lambda f: write_config(f, init_lora_weights="pissa"), "init_lora_weights 'pissa'"),
        (lambda f: write_config(f, modules_to_save=["lm_head"]), "modules_to_save lm_head"),
        (lambda f: write_config(f, layer_replication=[[0, 4]]), "layer_replication"),
        (
            lambda f: write_config(f, rank_pattern={"q_proj": 32}),
            "rank r=32 is larger than lora.max_lora_rank (8)",
        ),
        (lambda f: write_config(f, rank_pattern={"(": 4}), "rank_pattern key '(' is not a pattern"),
    ],
)
def test_weights_and_options_vllm_refuses_are_refused_at_render(tmp_path, change, expected):
    """Each of these rendered with exit 0 before; the first request naming the adapter then
    killed vLLM's engine core (and the server with it)."""
    folder = write_adapter(tmp_path / "a", seed=0, rank=8, targets=("q_proj",))
    assert (
        adapter_problem(str(folder), "llama", LoraSettings(max_lora_rank=8), SMOLLM2_BASE) is None
    )
    change(folder)
    reason = adapter_problem(str(folder), "llama", LoraSettings(max_lora_rank=8), SMOLLM2_BASE)
    assert reason is not None and expected in reason


def test_per_module_ranks_and_plain_inits_pass(tmp_path):
    folder = write_adapter(tmp_path / "a", seed=0, rank=4, targets=("v_proj",))
    write_config(
        folder,
        rank=8,
        targets=["v_proj"],
        rank_pattern={"v_proj": 4},
        init_lora_weights="gaussian",
        use_rslora=True,
    )
    assert (
        adapter_problem(str(folder), "llama", LoraSettings(max_lora_rank=8), SMOLLM2_BASE) is None
    )


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda f: (f / "adapter_model.safetensors").write_bytes(b""), "is empty"),
        (lambda f: write_config(f, targets=["q_proj", "v_proj"], use_dora=True), "DoRA"),
        (
            lambda f: write_adapter(f, seed=0, rank=8),  # SmolLM2's shapes on tiny-llama
            "layer 0 q_proj: lora_A takes 576 and lora_B gives 576 features",
        ),
    ],
)
def test_trident_repo_names_adapter_file_and_reason(tmp_path, capsys, damage, expected):
    """Against the base model's own config.json (builtin:tiny-llama, resolved as rendering
    does): one line, exit 2, nothing rendered; the good adapter renders."""
    write_adapter(tmp_path / "good", seed=0, rank=8, config=TINY)
    bad = write_adapter(tmp_path / "bad", seed=1, rank=8, config=TINY)
    damage(bad)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "models": [
                    model(
                        model="builtin:tiny-llama",
                        family=None,
                        adapters={"good": "good", "bad": "bad"},
                    )
                ],
            }
        )
    )
    out = tmp_path / "repo"
    assert trident(["repo", "--spec", str(spec_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {spec_file}: models[0].adapters.bad: ") and "\n" not in err
    assert expected in err and str(bad) in err and "Traceback" not in err
    assert not out.exists()
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "models": [
                    model(model="builtin:tiny-llama", family=None, adapters={"good": "good"})
                ],
            }
        )
    )
    assert trident(["repo", "--spec", str(spec_file), "--out", str(out)]) == 0


def test_rendered_engine_args(tmp_path):
    spec = spec_of(
        model(adapters={"b": "rel/b", "a": "/abs/a"}, lora={"max_loras": 2}),
        model("s", engine="sglang", adapters={"a": "/abs/a"}),
    )
    vllm_args = engine_args("/specs/t.yaml", spec.models[0])
    assert vllm_args == {
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 16,
        "lora_adapters": {"b": "/specs/rel/b", "a": "/abs/a"},
    }
    assert engine_args("/specs/t.yaml", spec.models[1]) == {
        "enable_lora": True,
        "lora_paths": {"a": "/abs/a"},
        "max_loras_per_batch": 4,
        "max_lora_rank": 16,
    }
    assert engine_args("/specs/t.yaml", spec_of(model()).models[0]) == {}


# -- the router ---------------------------------------------------------------------------


def _policy():
    spec = spec_of(
        model("base"),
        model("m1", adapters={"a": "/x"}),
        model("m2", adapters={"a": "/x", "b": "/y"}),
        router={
            "default": ["base", "m1"],
            "fallback": {"base": ["m2"]},
            "rules": [{"name": "only-base", "match": {"hint": "only-base"}, "backends": ["base"]}],
        },
    )
    config = router_config(spec).to_dict()  # as router.json carries it
    assert config["backends"]["m2"]["adapters"] == ["a", "b"]
    return Policy(RouterConfig.from_dict(config))


def test_adapter_requests_go_only_to_holders_in_route_order():
    policy = _policy()
    assert policy.candidates(RequestFeatures())[1] == ["base", "m2", "m1"]
    assert policy.candidates(RequestFeatures(adapter="a"))[1] == ["m2", "m1"]
    assert policy.candidates(RequestFeatures(adapter="b"))[1] == ["m2"]
    down = policy.candidates(RequestFeatures(adapter="a"), lambda n: n != "m2")
    assert down[1] == ["m1"]


def test_unknown_adapter_and_a_route_without_holders_are_errors():
    policy = _policy()
    with pytest.raises(
        UnknownAdapter,
        match=r"unknown adapter 'zz': no backend holds it "
        r"\(adapters: a \(m1\), a \(m2\), b \(m2\)\)",
    ):
        policy.candidates(RequestFeatures(adapter="zz"))
    with pytest.raises(
        UnknownAdapter,
        match=r"route 'm1' has no backend holding adapter "
        r"'b' \(held by: m2\)",
    ):
        policy.candidates(RequestFeatures(hint="m1", adapter="b"))
    # Without a hint, a route that has no holder gives way to the holders.
    assert policy.candidates(RequestFeatures(hint="only-base", adapter="b"))[1] == ["m2"]
    assert policy.candidates(RequestFeatures(hint=None, adapter="b", tenant="x"))[1] == ["m2"]


def test_the_adapter_is_read_where_vllm_backend_clients_put_it():
    assert adapter_name({"sampling_parameters": '{"lora_name": "a"}'}) == "a"
    assert adapter_name({"lora_name": "b"}) == "b"
    assert adapter_name({"sampling_parameters": "{}", "lora_name": "b"}) is None
    assert adapter_name({"sampling_parameters": "{bad"}) is None


def test_backends_parse_lora_name_out_of_sampling():
    def get(values):
        return lambda name: values.get(name)

    request = parse_generate(
        get({"text_input": "hi", "sampling_parameters": '{"lora_name": "a", "temperature": "0"}'})
    )
    assert request.lora_name == "a" and request.sampling == {"temperature": 0.0}
    assert parse_generate(get({"text_input": "hi"}), {"lora_name": "b"}).lora_name == "b"
    assert parse_generate(get({"text_input": "hi"})).lora_name is None
    with pytest.raises(ValueError, match="lora_name: expected a string"):
        parse_generate(get({"text_input": "hi", "sampling_parameters": '{"lora_name": 1}'}))


def test_schema_knows_the_sections():
    from builder.spec.schema import deployment_schema

    props = deployment_schema()["$defs"]["ModelSpec"]["properties"]
    assert props["lora"] == {"$ref": "#/$defs/LoraSettings"}
    assert props["adapters"]["additionalProperties"] == {"type": "string", "minLength": 1}


# -- SGLang (against support/fake_sglang.py: SGLang cannot start on this CPU) -----------


def test_sglang_gets_lora_paths_and_a_lora_path_per_request(tmp_path, monkeypatch):
    from builder.pipeline import build_repository
    from tests.python_backends import test_sglang_model as sgl

    data = sgl.sglang_spec()
    data["models"][0].update(adapters={"support": str(write_adapter(tmp_path / "s", 0))})
    repo = tmp_path / "repo"
    build_repository(parse_spec(data, str(tmp_path / "t.yaml")), repo)
    serving = sgl._serve(repo, monkeypatch)
    served = next(serving)
    try:
        assert served.engine.server_args.extra["lora_paths"] == {"support": str(tmp_path / "s")}
        sender = served.run(text_input="hi", sampling_parameters={"lora_name": "support"})
        assert served.engine.calls[-1]["lora_path"] == "support"
        assert sender.responses()[0].value("served_by") == "qwen:support"
        served.run(text_input="hi")
        assert served.engine.calls[-1]["lora_path"] is None
        bad = served.run(text_input="hi", sampling_parameters={"lora_name": "nope"})
        assert (
            "unknown adapter 'nope' (sampling_parameters.lora_name): model qwen has "
            "adapters: support"
        ) in bad.responses()[0].error().message()
    finally:
        serving.close()
