"""A vLLM replica's CPU cores (python_backends/vllm/cpu_binding.py): replica i of N takes
the i-th contiguous share of the cores its process may use, one core at least, and tells
vLLM through VLLM_CPU_OMP_THREADS_BIND unless the operator set it."""

from __future__ import annotations

import pytest

from python_backends.vllm import cpu_binding as binding


@pytest.mark.parametrize(
    ("allowed", "count", "expected"),
    [
        ([0, 1], 2, [[0], [1]]),  # this machine: one core each, not both on core 0
        ([0, 1], 3, [[0], [1], [0]]),  # more replicas than cores: round robin
        ([0, 1, 2, 3, 4], 2, [[0, 1], [2, 3, 4]]),
        ([7, 3, 5, 9], 2, [[3, 5], [7, 9]]),  # a cpuset: its own cores, in order
        ([0, 1, 2, 3], 1, [[0, 1, 2, 3]]),
    ],
)
def test_each_replica_takes_its_share(allowed, count, expected):
    shares = [binding.share_cores(allowed, f"{i}/{count}") for i in range(count)]
    assert shares == expected


def test_the_share_becomes_vllms_binding_unless_the_operator_set_one():
    environ: dict[str, str] = {}
    assert binding.bind_share({"CPU_SHARE": "1/2"}, environ, [0, 1, 2, 3]) == "2,3"
    assert environ == {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}
    operator = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert binding.bind_share({"CPU_SHARE": "0/2"}, operator, [0, 1]) is None
    assert operator == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    untouched: dict[str, str] = {}  # not a replica: vLLM's own auto binding
    assert binding.bind_share({}, untouched, [0, 1]) is None and untouched == {}


@pytest.mark.parametrize("share", ["2/2", "1", "a/2", "-1/2", "0/0", ""])
def test_a_bad_share_is_refused(share):
    with pytest.raises(ValueError, match="CPU_SHARE"):
        binding.share_cores([0, 1], share)
