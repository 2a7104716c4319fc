"""Memory math, the TP/PP + MIG planner, and the placement it renders into a repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.cli.main import main
from builder.engines.jobs import ServedEngine
from builder.plan import memory, mig, placement
from builder.plan.gpus import GPU_TYPES
from builder.plan.planner import PlacementError, plan_for_spec
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.render.validate import parse_config, validate_repository
from builder.render.write import write_repository
from builder.spec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
H100X8 = ROOT / "deploy" / "examples" / "h100x8.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "topo"
GIB = 1024**3


# ---------------------------------------------------------------------------------------
# Memory math, against figures computed by hand


def test_llama3_8b_by_hand():
    # Llama-3-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128,
    # MLP 14336, vocab 128256, embeddings not tied.
    #   per layer: q,o 2·4096·4096 = 33,554,432; k,v 2·4096·1024 = 8,388,608;
    #              gate/up/down 3·4096·14336 = 176,160,768 → 218,103,808 (× 32 = 6,979,321,856)
    #   embeddings + LM head 2·128256·4096 = 1,050,673,152; norms 32·2·4096 + 4096 = 266,240
    #   total 8,030,261,248 parameters
    #   fp16: 2 bytes each = 16,060,522,496 B = 14.958 GiB
    #   fp8 : decoder layers 1 byte, embeddings/head/norms 2 bytes
    #         = 6,979,321,856 + 2·1,050,939,392 = 9,081,200,640 B = 8.458 GiB
    #   KV per token (fp16): 32 layers · 8 heads · 128 · 2 (K and V) · 2 B = 131,072 B
    shape = memory.load_shape("meta-llama/Meta-Llama-3-8B-Instruct")
    assert shape.parameters == 8_030_261_248
    assert memory.weight_bytes(shape, 2) == 16_060_522_496
    assert memory.weight_bytes(shape, 1) == 9_081_200_640
    assert memory.kv_bytes_per_token(shape, 2) == 131_072
    assert memory.kv_bytes_per_token(shape, 1) == 65_536


def test_llama3_70b_by_hand():
    # Llama-3.3-70B: 80 layers, hidden 8192, 64 heads, 8 KV heads, head dim 128, MLP 28672.
    #   per layer: q,o 2·8192·8192 = 134,217,728; k,v 2·8192·1024 = 16,777,216;
    #              MLP 3·8192·28672 = 704,643,072 → 855,638,016 (× 80 = 68,451,041,280)
    #   embeddings + head 2·128256·8192 = 2,101,346,304; norms 80·2·8192 + 8192 = 1,318,912
    #   total 70,553,706,496 parameters
    #   fp16 = 141,107,412,992 B = 131.42 GiB (does not fit one 80 GB GPU)
    #   fp8  = 68,451,041,280 + 2·2,102,665,216 = 72,656,371,712 B = 67.67 GiB
    #   KV per token (fp16): 80 · 8 · 128 · 2 · 2 = 327,680 B (320 KiB)
    shape = memory.load_shape("meta-llama/Llama-3.3-70B-Instruct")
    assert shape.parameters == 70_553_706_496
    assert memory.weight_bytes(shape, 2) == 141_107_412_992
    assert memory.weight_bytes(shape, 1) == 72_656_371_712
    assert memory.kv_bytes_per_token(shape, 2) == 327_680
    # TP 2, fp8 weights and KV, 64 sequences × 4096 tokens (the h100x8 hot path):
    #   weights 72,656,371,712 / 2 B = 33.83 GiB
    #   KV 80 layers · 4 heads per rank · 128 · 2 · 1 B = 81,920 B/token × 262,144 = 20 GiB
    #   workspace 1 GiB + 8192 tokens · (4·8192 + 2·28672/2) · 2 B = 1 + 0.9375 GiB
    need = memory.per_gpu_need(shape, memory.Workload(1, 1, 64, 4096), tp=2, pp=1)
    assert need.weights_gib == pytest.approx(72_656_371_712 / 2 / GIB)
    assert need.kv_cache_gib == pytest.approx(20.0)
    assert need.workspace_gib == pytest.approx(1.9375)


def test_moe_and_config_json(tmp_path):
    mixtral = memory.load_shape("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert round(mixtral.parameters / 1e9, 2) == 46.70  # the published 46.7B
    qwen = memory.load_shape("Qwen/Qwen3-30B-A3B")
    assert round(qwen.parameters / 1e9, 1) == 30.5  # the published 30.5B
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 1000,
                "tie_word_embeddings": True,
            }
        )
    )
    tiny = memory.load_shape(str(folder))
    # 2 · (2·64·64 + 2·64·64 + 3·64·128) + 1000·64 + (2·2·64 + 64) = 146,240
    assert (tiny.kv_heads, tiny.head_dim, tiny.parameters) == (4, 16, 146_240)
    with pytest.raises(memory.UnknownModelSize, match="size of 'org/unknown' unknown"):
        memory.load_shape("org/unknown")


# ---------------------------------------------------------------------------------------
# The planner


def spec_of(models, gpu="H100-80GB", count=8, topology=None, name="t"):
    hardware = {"gpu": gpu, "count": count}
    if topology:
        hardware["topology"] = str(FIXTURES / topology)
    return parse_spec({"name": name, "hardware": hardware, "models": models}, "t.yaml")


def vllm(name, model, instances=1, **args):
    placement_keys = {
        k: args.pop(k) for k in ("mig", "devices", "dtype", "max_batch", "max_context") if k in args
    }
    entry = {
        "name": name,
        "engine": "vllm",
        "model": model,
        "instances": instances,
        "engine_args": args,
    }
    if placement_keys:
        entry["placement"] = placement_keys
    return entry


LLAMA8B = "meta-llama/Meta-Llama-3-8B-Instruct"
LLAMA70B = "meta-llama/Llama-3.3-70B-Instruct"


def test_h100x8_plan():
    plan = plan_for_spec(load_spec(H100X8))
    trt, moe, small = (plan.model(n) for n in ("llama70b-trtllm", "mixtral-vllm", "llama8b-sglang"))
    assert (trt.tp, trt.pp, trt.kind) == (2, 1, "model")
    assert placement.device_ids(load_spec(H100X8).models[0], plan) == [[0, 1], [2, 3]]
    assert [i.devices for i in moe.instances] == [(4, 5)] and moe.link == "NV18"
    assert [i.visible_devices for i in small.instances] == ["mig:6:3g.40gb:0", "mig:6:3g.40gb:1"]
    assert small.kubernetes_resources == {"nvidia.com/mig-3g.40gb": 1}
    assert trt.kubernetes_resources == {"nvidia.com/gpu": 2}
    assert [s.start for s in plan.mig_layouts[6]] == [0, 4]
    assert plan.used_gpus == {0, 1, 2, 3, 4, 5, 6}
    for m in plan.models.values():
        assert m.need.total_gib <= m.usable_gib


def test_smallest_tp_that_fits_within_a_numa_node_then_pipeline():
    # fp16 70B, 8 × 4096 tokens: TP 2 needs 65.7 + 5 + 1.9 > 72 GiB, TP 4 fits.
    spec = spec_of(
        [vllm("big", LLAMA70B, max_num_seqs=8, max_model_len=4096)],
        gpu="H100-PCIE-80GB",
        topology="pcie-2numa-x8.txt",
    )
    big = plan_for_spec(spec).model("big")
    assert (big.tp, big.pp, big.link) == (4, 1, "NODE")
    assert big.instances[0].devices == (0, 1, 2, 3)  # NUMA node 0, not across
    # 64 × 8192 tokens: TP 4 no longer fits; TP 8 would cross NUMA nodes over SYS, so
    # the planner pipelines two TP-4 groups, one per NUMA node.
    spec = spec_of(
        [vllm("big", LLAMA70B, max_num_seqs=64, max_model_len=8192)],
        gpu="H100-PCIE-80GB",
        topology="pcie-2numa-x8.txt",
    )
    big = plan_for_spec(spec).model("big")
    assert (big.tp, big.pp) == (4, 2)
    assert big.instances[0].devices == (0, 1, 2, 3, 4, 5, 6, 7)
    # ...whereas on NVSwitch TP 8 is fine.
    spec = spec_of(
        [vllm("big", LLAMA70B, max_num_seqs=64, max_model_len=8192)], topology="hgx-h100x8.txt"
    )
    assert (plan_for_spec(spec).model("big").tp, plan_for_spec(spec).model("big").pp) == (8, 1)


def test_tp_groups_take_the_fastest_links():
    # Two TP-2 instances on the PCIe box: the PIX pairs (0,1) and (4,5) come first.
    spec = spec_of(
        [vllm("a", "mistralai/Mixtral-8x7B-v0.1", instances=2, max_num_seqs=8, max_model_len=4096)],
        gpu="H100-PCIE-80GB",
        topology="pcie-2numa-x8.txt",
    )
    a = plan_for_spec(spec).model("a")
    assert [i.devices for i in a.instances] == [(0, 1), (4, 5)]
    assert a.link == "PIX"
    # On the bridged box: the NVLink pairs.
    spec = spec_of(
        [vllm("a", "mistralai/Mixtral-8x7B-v0.1", instances=2, max_num_seqs=8, max_model_len=4096)],
        gpu="A100-80GB",
        count=4,
        topology="nvlink-bridge-x4.txt",
    )
    assert [i.devices for i in plan_for_spec(spec).model("a").instances] == [(0, 1), (2, 3)]


def test_single_gpu_instances_are_kind_gpu():
    spec = spec_of([vllm("s", LLAMA8B, instances=3, max_num_seqs=4, max_model_len=2048)])
    plan = plan_for_spec(spec)
    assert placement.instance_groups(spec.models[0], plan) == [
        {"count": 1, "kind": "KIND_GPU", "gpus": [0, 1, 2]}
    ]
    assert placement.instance_parameters(spec.models[0], plan) == {}
    assert placement.parallel_engine_args(spec.models[0], plan) == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
    }


def test_does_not_fit_says_how_much_is_missing():
    spec = spec_of([vllm("big", LLAMA70B, max_num_seqs=8, max_model_len=4096)], count=1)
    with pytest.raises(
        PlacementError,
        match=r"big: does not fit: with TP×PP 1×1 each "
        r"H100-80GB needs .* GiB .* but 72.0 GiB are usable: .* GiB missing",
    ):
        plan_for_spec(spec)
    fixed = dict(tensor_parallel_size=2, max_num_seqs=8, max_model_len=4096)
    spec = spec_of([vllm("big", LLAMA70B, pipeline_parallel_size=1, **fixed)])
    with pytest.raises(
        PlacementError, match="TP×PP 2×1 .* raise the tensor/pipeline parallel size"
    ):
        plan_for_spec(spec)
    # With only TP fixed the planner adds pipeline stages instead.
    big = plan_for_spec(spec_of([vllm("big", LLAMA70B, **fixed)])).model("big")
    assert (big.tp, big.pp) == (2, 2)


def trtllm(build):
    return {
        "name": "t",
        "engine": "tensorrt_llm",
        "model": LLAMA70B,
        "checkpoint": {"hf_model": "/models/llama70b", "family": "llama"},
        "build": build,
        "profiles": {
            "p": {
                "max_batch_size": 8,
                "max_input_len": 1024,
                "max_seq_len": 2048,
                "max_num_tokens": 2048,
            }
        },
    }


def test_trtllm_keeps_the_tp_its_engine_is_built_for():
    # bf16 70B on one GPU: 131.4 GiB of weights alone.
    with pytest.raises(
        PlacementError,
        match=r"t: does not fit: with TP×PP 1×1 .* raise "
        r"build.tp_size / build.pp_size",
    ):
        plan_for_spec(spec_of([trtllm({"dtype": "bf16"})]))
    # TP 4 as built, 8 × 2048 tokens from the served profile, fp8 weights and KV cache:
    #   weights 67.67/4 = 16.92 GiB; KV 80 layers · 2 heads per rank · 128 · 2 · 1 B
    #   = 40,960 B/token × 16,384 tokens = 0.625 GiB; + workspace.
    t = plan_for_spec(
        spec_of(
            [
                trtllm(
                    {"dtype": "bf16", "quantization": "fp8", "kv_cache_dtype": "fp8", "tp_size": 4}
                )
            ]
        )
    ).model("t")
    assert (t.tp, t.pp, t.kind) == (4, 1, "model")
    assert t.need.weights_gib == pytest.approx(72_656_371_712 / 4 / GIB)
    assert t.need.kv_cache_gib == pytest.approx(0.625)


def test_not_enough_free_gpus():
    spec = spec_of([vllm("a", LLAMA70B, instances=3, max_num_seqs=8, max_model_len=4096)])
    with pytest.raises(PlacementError, match=r"needs 3 instance\(s\) × TP×PP 4×1 = 12 GPUs"):
        plan_for_spec(spec)


def test_8b_fp16_does_not_fit_a_1g_slice():
    spec = spec_of([vllm("s", LLAMA8B, mig="1g.10gb", max_num_seqs=1, max_model_len=1024)])
    with pytest.raises(
        PlacementError,
        match=r"each 1g.10gb slice needs 1[0-9.]+ GiB .* "
        r"but 9.0 GiB are usable: [0-9.]+ GiB missing",
    ):
        plan_for_spec(spec)


def test_eight_1g_slices_do_not_fit_one_h100():
    spec = spec_of(
        [vllm("tiny", "builtin:smollm2-135m-instruct", instances=8, mig="1g.10gb")], count=1
    )
    with pytest.raises(PlacementError, match="MIG: tiny instance .* no room for a 1g.10gb"):
        plan_for_spec(spec)
    spec = spec_of(
        [vllm("tiny", "builtin:smollm2-135m-instruct", instances=8, mig="1g.10gb")], count=2
    )
    assert sorted(plan_for_spec(spec).mig_layouts) == [0, 1]


def test_mig_auto_picks_the_smallest_slice_that_fits():
    spec = spec_of(
        [
            vllm("tiny", "builtin:smollm2-135m-instruct", mig="auto"),
            vllm("mid", LLAMA8B, mig="auto", max_num_seqs=16, max_model_len=8192),
        ]
    )
    plan = plan_for_spec(spec)
    assert plan.model("tiny").mig_profile.name == "1g.10gb"
    assert plan.model("mid").mig_profile.name == "3g.40gb"  # 32.6 GiB > 18 of a 2g
    assert list(plan.mig_layouts) == [0]  # both on one GPU


def test_mig_goes_to_gpus_left_by_whole_gpu_models():
    spec = spec_of(
        [vllm("s", LLAMA8B, mig="3g.40gb", instances=3), vllm("w", LLAMA8B, instances=2)], count=4
    )
    plan = plan_for_spec(spec)
    assert [i.devices for i in plan.model("w").instances] == [(0,), (1,)]
    assert sorted(plan.mig_layouts) == [2, 3]


@pytest.mark.parametrize(
    "entry, path, reason",
    [
        (vllm("s", LLAMA8B, mig="2g.10gb"), "models[0].placement.mig", "no MIG profile '2g.10gb'"),
        (
            vllm("s", LLAMA8B, mig="3g.40gb", tensor_parallel_size=2),
            "models[0].placement.mig",
            "tensor or pipeline parallelism > 1 cannot run on slices",
        ),
        (vllm("s", LLAMA8B, devices=[8]), "models[0].placement.devices", "GPU 8 does not exist"),
        (
            vllm("s", LLAMA8B, devices=[0, 1, 2], instances=2),
            "models[0].placement.devices",
            "3 devices do not split evenly over 2 instances",
        ),
        (vllm("s", "org/unknown"), "models[0].model", "size of 'org/unknown' unknown"),
        (
            {**vllm("s", LLAMA8B, tensor_parallel_size=2), "placement": {"kind": "gpu"}},
            "models[0].placement.kind",
            "KIND_GPU gives an instance one GPU but TP×PP is 2×1",
        ),
    ],
)
def test_spec_defects_name_the_field(entry, path, reason):
    with pytest.raises(SpecError) as info:
        plan_for_spec(spec_of([entry]))
    assert info.value.path == path and reason in info.value.reason


def test_pinned_devices_are_kept_and_checked():
    spec = spec_of(
        [vllm("a", LLAMA8B, devices=[6, 7], instances=2), vllm("b", LLAMA8B, devices=[7])]
    )
    with pytest.raises(SpecError, match="GPU 7 is already used by another model"):
        plan_for_spec(spec)
    spec = spec_of([vllm("a", "org/unknown", devices=[2, 3], tensor_parallel_size=2)])
    a = plan_for_spec(spec).model("a")
    assert [i.devices for i in a.instances] == [(2, 3)] and a.need is None


def test_placement_dtype_override_and_validation():
    # fp8 weights 67.67 GiB + fp8 KV 2 × 2048 × 160 KiB = 0.625 GiB + workspace 1.69 GiB
    spec = spec_of(
        [
            vllm(
                "big",
                LLAMA70B,
                dtype="fp8",
                kv_cache_dtype="fp8",
                max_num_seqs=2,
                max_model_len=2048,
            )
        ]
    )
    assert plan_for_spec(spec).model("big").tp == 1
    with pytest.raises(SpecError, match="placement.dtype: 'fp6' is not one of"):
        spec_of([vllm("big", LLAMA70B, dtype="fp6")])


def test_cpu_plan_is_untouched():
    spec = parse_spec({"models": [vllm("c", "/m")]}, "t.yaml")
    plan = plan_for_spec(spec)
    assert placement.instance_groups(spec.models[0], plan) == [
        {"count": 1, "kind": "KIND_CPU", "gpus": []}
    ]
    assert placement.instance_parameters(spec.models[0], plan) == {}
    assert placement.parallel_engine_args(spec.models[0], plan) == {}
    assert placement.kubernetes_resources(spec.models[0], plan) == {}


# Every layout the planner emits is legal for its GPU, or the request raises.

known = sorted(m for m in memory.KNOWN_MODELS if "Qwen3" not in m)
model_entries = st.builds(
    lambda model, instances, mig, batch, context, dtype: {
        "model": model,
        "instances": instances,
        "mig": mig,
        "max_batch": batch,
        "max_context": context,
        "dtype": dtype,
    },
    st.sampled_from(known),
    st.integers(1, 3),
    st.sampled_from([None, None, "auto", "1g.10gb", "3g.40gb", "2g.20gb"]),
    st.sampled_from([1, 4, 16, 64]),
    st.sampled_from([1024, 4096, 8192]),
    st.sampled_from(["bf16", "fp8"]),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(model_entries, min_size=1, max_size=4),
    st.sampled_from([("hgx-h100x8.txt", 8), ("pcie-2numa-x8.txt", 8), (None, 2)]),
)
def test_every_emitted_plan_is_legal(entries, hardware):
    topology, count = hardware
    models = []
    for k, e in enumerate(entries):
        place = {"max_batch": e["max_batch"], "max_context": e["max_context"], "dtype": e["dtype"]}
        if e["mig"]:
            place["mig"] = e["mig"]
        models.append(
            {
                "name": f"m{k}",
                "engine": "vllm",
                "model": e["model"],
                "instances": e["instances"],
                "placement": place,
            }
        )
    gpu = "H100-80GB" if topology != "pcie-2numa-x8.txt" else "H100-PCIE-80GB"
    spec = spec_of(models, gpu=gpu, count=count, topology=topology)
    try:
        plan = plan_for_spec(spec)
    except (PlacementError, SpecError) as e:
        assert str(e)
        return
    owner: dict[int, str] = {}
    for m in plan.models.values():
        assert len(m.instances) == spec.model(m.name).instances
        assert m.need.total_gib <= m.usable_gib + 1e-9
        for instance in m.instances:
            if m.mig_profile is None:
                assert len(instance.devices) == m.tp * m.pp
                for d in instance.devices:
                    assert d not in owner, f"GPU {d} used by {owner[d]} and {m.name}"
                    owner[d] = m.name
            else:
                assert instance.slice.gpu not in owner or owner[instance.slice.gpu] == "MIG"
                owner[instance.slice.gpu] = "MIG"
                assert instance.slice.slice in plan.mig_layouts[instance.slice.gpu]
    gpu_type = GPU_TYPES[gpu]
    for slices in plan.mig_layouts.values():
        mig.place_on_gpu(gpu_type, [s.profile for s in slices])  # raises if illegal
        used = [m for s in slices for m in s.memory_slices]
        assert len(used) == len(set(used)) and all(s.start in s.profile.starts for s in slices)


# ---------------------------------------------------------------------------------------
# The rendered repository and the CLI


def test_rendered_h100x8_repository_carries_the_placement(tmp_path):
    spec = load_spec(H100X8)
    engines = {"llama70b-trtllm": ServedEngine("/engines/" + "ab" * 32, "ab" * 32)}
    out = tmp_path / "repo"
    files = render_files(RenderContext(spec, {}, engines, plan_for_spec(spec)))
    write_repository(files, out, validate_repository)
    assert main(["validate", str(out)]) == 0
    trt = parse_config(out / "llama70b-trtllm_tensorrt_llm" / "config.pbtxt")
    assert trt.parameters["gpu_device_ids"].string_value == "0,1;2,3"
    moe = parse_config(out / "mixtral-vllm" / "config.pbtxt")
    kind_model = moe.instance_group[0].KIND_MODEL
    assert [(g.count, g.kind) for g in moe.instance_group] == [(1, kind_model)]
    assert moe.parameters["INSTANCE_DEVICES"].string_value == "4,5"
    assert json.loads((out / "mixtral-vllm/1/model.json").read_text())["tensor_parallel_size"] == 2
    # llama8b-sglang's two instances sit behind the router: two replicas, one MIG slice
    # each, in the plan's order (builder/plan/replicas.py).
    for index in (0, 1):
        small = parse_config(out / f"llama8b-sglang__r{index}" / "config.pbtxt")
        assert [(g.count, g.kind) for g in small.instance_group] == [(1, kind_model)]
        assert small.parameters["INSTANCE_DEVICES"].string_value == f"mig:6:3g.40gb:{index}"
        assert (
            json.loads((out / f"llama8b-sglang__r{index}/1/model.json").read_text())["tp_size"] == 1
        )
    # The forwarder of direct calls is no engine model: it owns no devices.
    forwarder = parse_config(out / "llama8b-sglang" / "config.pbtxt")
    assert [(g.count, g.kind) for g in forwarder.instance_group] == [
        (1, forwarder.instance_group[0].KIND_CPU)
    ]


def test_cli_plan_table(capsys):
    assert main(["plan", "--spec", str(H100X8)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["MODEL", "ENGINE", "TP×PP"]
    rows = {line.split()[0]: line for line in out[1:4]}
    assert "2×1" in rows["llama70b-trtllm"] and "GPU0,1; GPU2,3" in rows["llama70b-trtllm"]
    assert "GPU4,5" in rows["mixtral-vllm"] and "NV18" in rows["mixtral-vllm"]
    # Behind the router, each instance of llama8b-sglang is a replica the router names.
    assert (
        "2 replicas  llama8b-sglang__r0 GPU6 3g.40gb@0; llama8b-sglang__r1 GPU6 3g.40gb@4"
    ) in rows["llama8b-sglang"]
    assert "nvidia.com/mig-3g.40gb=1" in rows["llama8b-sglang"]
    assert "idle GPUs: 7" in out[-2]
    assert out[-1] == (
        "router: router, 8 instance(s) KIND_CPU (default: 2 per GPU of 8x H100-80GB, at most 8)"
    )


def test_cli_plan_reports_what_does_not_fit(tmp_path, capsys):
    data = {
        "hardware": {"gpu": "H100-80GB", "count": 1},
        "models": [vllm("big", LLAMA70B, max_num_seqs=8, max_model_len=4096)],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", "--spec", str(path)]) == 1
    assert "GiB missing" in capsys.readouterr().err


def test_cli_mig_plan_writes_mig_parted_config(tmp_path, capsys):
    out = tmp_path / "mig" / "config.yaml"
    assert main(["mig", "plan", "--spec", str(H100X8), "--out", str(out)]) == 0
    config = yaml.safe_load(out.read_text())
    assert config["version"] == "v1"
    assert config["mig-configs"]["trident-h100x8"] == [
        {"devices": [0, 1, 2, 3, 4, 5, 7], "mig-enabled": False},
        {"devices": [6], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
    ]
    assert "wrote" in capsys.readouterr().out
    assert (
        main(
            [
                "mig",
                "plan",
                "--spec",
                str(ROOT / "deploy" / "default.yaml"),
                "--out",
                str(tmp_path / "x.yaml"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "x.yaml").exists()


def test_a_kv_cache_sized_in_bytes_is_what_each_gpu_holds():
    """vLLM's kv_cache_memory_bytes is the KV cache per GPU, whatever the batch and
    context: the planner sums it instead of a full batch at full context."""
    sized = dict(max_num_seqs=256, max_model_len=8192, kv_cache_memory_bytes=10 * GIB)
    need = plan_for_spec(spec_of([vllm("a", LLAMA8B, **sized)])).model("a").need
    assert need.kv_cache_gib == pytest.approx(10.0)
    # 256 × 8192 tokens × 128 KiB = 256 GiB unsized: TP 4 at least, not 1
    unsized = plan_for_spec(spec_of([vllm("a", LLAMA8B, max_num_seqs=256, max_model_len=8192)]))
    assert unsized.model("a").tp > 1
    assert plan_for_spec(spec_of([vllm("a", LLAMA8B, **sized)])).model("a").tp == 1
    too_big = dict(sized, kv_cache_memory_bytes=70 * GIB)
    with pytest.raises(PlacementError, match="a: does not fit"):
        plan_for_spec(spec_of([vllm("a", LLAMA8B, tensor_parallel_size=1, **too_big)], count=1))
