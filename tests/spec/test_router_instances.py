"""`router.instances`: an integer >= 1 or absent; more than one instance with tenants
needs their shared store. Bad values: one line naming the field, exit 2."""

from __future__ import annotations

import pytest
import yaml

from builder.cli.main import main
from builder.spec import SpecError, parse_spec

BASE = {
    "name": "x",
    "models": [
        {"name": "m", "engine": "vllm", "model": "/m", "engine_args": {"max_model_len": 512}}
    ],
}


def parsed(router, tenants=None):
    data = {**BASE, "router": {"default": ["m"], **router}}
    if tenants is not None:
        data["tenants"] = tenants
    return parse_spec(data, "s.yaml")


def test_absent_means_derived():
    assert parsed({}).router.instances is None
    assert parsed({"instances": None}).router.instances is None


def test_an_integer_is_kept():
    assert parsed({"instances": 1}).router.instances == 1
    assert parsed({"instances": 64}).router.instances == 64


@pytest.mark.parametrize(
    "value, reason",
    [
        (0, "must be >= 1, got 0"),
        (-2, "must be >= 1"),
        (65, "must be <= 64"),
        ("4", "expected an integer"),
        (True, "expected an integer"),
        (2.5, "expected an integer"),
    ],
)
def test_bad_values_name_the_field(value, reason):
    with pytest.raises(SpecError) as e:
        parsed({"instances": value})
    assert "router.instances" in str(e.value) and reason in str(e.value)


def test_several_instances_with_local_tenant_counters_are_refused():
    with pytest.raises(SpecError) as e:
        parsed({"instances": 2}, {"default": {"requests_per_minute": 3}})
    assert "router.instances" in str(e.value) and "tenants.redis" in str(e.value)
    # One instance keeps local counters exact; Redis makes them shared.
    assert parsed({"instances": 1}, {"default": {}}).router.instances == 1
    assert parsed({"instances": 2}, {"redis": "redis://h"}).router.instances == 2


def test_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**BASE, "router": {"default": ["m"], "instances": 0}}))
    before = path.read_bytes()
    assert main(["plan", "--spec", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "router.instances" in err[0]
    assert "Traceback" not in err[0] and path.read_bytes() == before
