"""`trident repo` says what it rendered, replicas included: a model with `instances: 2`
behind the router is three Triton models (`m__r0`, `m__r1` and `m`), and the line names
the replicas, as the rendered router.json lists them."""

from __future__ import annotations

import yaml

from builder.cli.main import main
from builder.cli.repository import summary


def model(name, **fields):
    return {
        "name": name,
        "engine": "vllm",
        "model": "/m",
        "engine_args": {"max_model_len": 512},
        **fields,
    }


def write_spec(tmp_path, instances, router=True):
    data = {
        "name": "x",
        "models": [
            model("m", instances=instances, placement={"kind": "cpu"}),
            model("solo"),
        ],
    }
    if router:
        data["router"] = {"default": ["m"]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def rendered(tmp_path, capsys, instances, router=True):
    out = tmp_path / "repo"
    assert (
        main(["repo", "--spec", str(write_spec(tmp_path, instances, router)), "--out", str(out)])
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    return lines[0], out


def test_replicas_are_named(tmp_path, capsys):
    line, out = rendered(tmp_path, capsys, 2)
    assert line.startswith(f"rendered 2 model(s) + router into {out} (")
    assert line.endswith("; m as 2 replicas (m__r0, m__r1)")
    assert (out / "m__r1" / "config.pbtxt").is_file()  # what the line names was written


def test_without_replicas_the_line_is_as_before(tmp_path, capsys):
    line, out = rendered(tmp_path, capsys, 1)
    assert line.startswith("rendered 2 model(s) + router into ") and " as 2 replicas" not in line
    line, out = rendered(tmp_path, capsys, 2, router=False)  # no router: one model, 2 instances
    assert line.startswith("rendered 2 model(s) into ") and " as 2 replicas" not in line


def test_summary_lists_each_model_with_replicas():
    line = summary(3, True, "out", 40, {"a": ["a__r0", "a__r1"], "b": ["b__r0", "b__r1", "b__r2"]})
    assert line == (
        "rendered 3 model(s) + router into out (40 files); "
        "a as 2 replicas (a__r0, a__r1); b as 3 replicas (b__r0, b__r1, b__r2)"
    )
