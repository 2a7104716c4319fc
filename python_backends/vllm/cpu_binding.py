"""Which CPU cores one vLLM replica's compute binds to (issue 23).

vLLM's CPU build binds each engine's OpenMP threads itself. Left to its `auto` mode, every
engine on a NUMA node takes the same cores: on two cores each reserves core 1 for its
scheduler and binds its compute to core 0, so two replicas of a model run on one core and
the other mostly idles. A replica rendered on the CPU carries `CPU_SHARE` ("i/N", from the
plan: replica i of N); at load it takes the i-th of N contiguous shares of the cores its
process may use and tells vLLM so through VLLM_CPU_OMP_THREADS_BIND (read by vLLM 0.32's
vllm/utils/ompmultiprocessing.py when it starts the worker). The split is made here, at
load, because the plan does not know the serving machine's cores.

More replicas than cores: replica i takes core i mod cores, so replicas share cores
round robin (three on two cores: 0, 1, 0) instead of all sharing one. An operator's own
VLLM_CPU_OMP_THREADS_BIND in the server's environment wins for every replica.

Pure: the allowed cores and the environment come in.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

CPU_SHARE = "CPU_SHARE"  # config.pbtxt parameter (builder/plan/replicas.py renders it)
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def parse_share(share: str) -> tuple[int, int]:
    """'i/N' → (i, N), 0 <= i < N."""
    index, sep, count = share.partition("/")
    if not (sep and index.isdigit() and count.isdigit()) or not 0 <= int(index) < int(count):
        raise ValueError(f"{CPU_SHARE} {share!r}: expected 'i/N' with 0 <= i < N")
    return int(index), int(count)


def share_cores(allowed: Sequence[int], share: str) -> list[int]:
    """The cores replica i of N takes among `allowed`: a contiguous i-th of N shares,
    each at least one core."""
    index, count = parse_share(share)
    cores = sorted(set(allowed))
    if not cores:
        raise ValueError("no CPU core is allowed to this process")
    if count >= len(cores):
        return [cores[index % len(cores)]]
    return cores[index * len(cores) // count : (index + 1) * len(cores) // count]


def bind_share(
    params: dict[str, str], environ: MutableMapping[str, str], allowed: Sequence[int]
) -> str | None:
    """Set the replica's cores for vLLM when it has a share and the operator set none;
    the value set (or None)."""
    share = params.get(CPU_SHARE)
    if not share or BIND_ENV in environ:
        return None
    environ[BIND_ENV] = ",".join(map(str, share_cores(allowed, share)))
    return environ[BIND_ENV]
