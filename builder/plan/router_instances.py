"""How many instances (stub processes) the router model runs: the spec's
`router.instances`, else a default derived from the host the plan targets.

Pure: a function of the spec. What the spec knows of the target is its GPUs
(`hardware.gpu`, `hardware.count` per node); it does not know the host's cores, so the
default goes by GPUs:

- on the CPU (`hardware.gpu: cpu`), 1: the engines run on the same cores, and there the
  relay is bound by CPU, not by one process (issue 16: on 2 cores the router's hop costs
  tritonserver, the router stub and the engine stub CPU in about equal parts; a second
  relay process only competes for the same cores);
- on GPUs, 2 per GPU of the node, at most 8. One router instance is one Python process
  holding a GIL: it relayed about 2,000-3,000 chunks/s on a 16-core GPU host, while one
  H100 serving an 8B model makes 10,000-20,000 tokens/s (issue 22). Coalescing turns
  several tokens into one chunk, so the need is less than a chunk per token, but one
  instance per GPU would still cap there. Each instance at its ceiling takes about one
  core, and tritonserver and the engine stub spend as much again per relayed chunk:
  2 per GPU is at most ~4-6 cores per GPU, which GPU hosts have (a DGX H100: 112 cores
  for 8 GPUs; 8-GPU cloud machines 24-26 vCPUs per GPU; the smallest 1-GPU machines
  4-8). The cap: past 8 the relays of one tritonserver share its frontend threads and
  the Python backend's BLS pools, and each stub costs its own memory and start-up;
- with `tenants:` and no `tenants.redis`, 1: each instance would keep its own tenant
  counters, so a limit would hold per instance (the parser refuses an explicit count
  above 1 there).
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.spec import DeploymentSpec

PER_GPU = 2
MAX_DEFAULT = 8


@dataclass(frozen=True)
class RouterInstances:
    count: int
    why: str  # for `trident plan`: where the count came from


def router_instances(spec: DeploymentSpec) -> RouterInstances | None:
    """The router's instance count, or None for a spec without a router."""
    router = spec.router
    if router is None:
        return None
    if router.instances is not None:
        return RouterInstances(router.instances, "router.instances")
    if spec.tenants is not None and spec.tenants.redis is None:
        return RouterInstances(1, "default: tenants without tenants.redis count per instance")
    hardware = spec.hardware
    if hardware.gpu == "cpu":
        return RouterInstances(1, "default on the CPU: the engines share its cores")
    count = min(PER_GPU * hardware.count, MAX_DEFAULT)
    return RouterInstances(
        count,
        f"default: {PER_GPU} per GPU of {hardware.count}x {hardware.gpu}, at most {MAX_DEFAULT}",
    )
