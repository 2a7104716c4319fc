"""The planner's minimal multi-node support (hardware.nodes) that trident k8s renders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from builder.plan.planner import PlacementError, plan_for_spec
from builder.spec import SpecError, parse_spec

MULTINODE = Path(__file__).resolve().parents[2] / "deploy/examples/multinode.yaml"


def _spec(**hardware):
    data = yaml.safe_load(MULTINODE.read_text())
    data["hardware"].update(hardware)
    return parse_spec(data, "multi.yaml")


def test_spans_two_nodes_with_whole_node_resources():
    plan = plan_for_spec(_spec())
    model = plan.model("llama405b")
    assert (model.tp, model.pp, model.nodes, len(model.instances)) == (8, 2, 2, 1)
    assert model.kubernetes_resources == {"nvidia.com/gpu": 8}


def test_one_node_is_not_enough():
    with pytest.raises(PlacementError, match="set hardware.nodes"):
        plan_for_spec(_spec(nodes=1))


def test_nodes_must_be_positive_and_need_a_gpu():
    with pytest.raises(SpecError, match="hardware.nodes"):
        _spec(nodes=0)
    with pytest.raises(SpecError, match="hardware.nodes"):
        _spec(gpu="cpu", count=0)


def test_tp_group_must_stay_inside_a_node():
    data = yaml.safe_load(MULTINODE.read_text())
    data["models"][0]["engine_args"].update(tensor_parallel_size=16, pipeline_parallel_size=1)
    with pytest.raises(SpecError, match="inside one node"):
        plan_for_spec(parse_spec(data, "multi.yaml"))
