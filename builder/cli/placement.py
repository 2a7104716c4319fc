"""`trident plan` and `trident mig check|plan`: the placement planner on the command line.

Exit codes: 0 success; 1 the layout cannot exist or the models do not fit; 2 bad input
(spec defect, unknown GPU type).
"""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from builder.cli.common import complete_file, group, spec_option
from builder.errors import EXIT_FAILURE, EXIT_USAGE, TridentError
from builder.plan.topology import topology_candidates
from builder.render import output_dir
from builder.spec import load_spec

# The first line of every mig-parted file trident writes: what `mig plan --out` may replace.
MIG_PLAN_HEADER = "# Rendered by trident"


@click.command("plan")
@spec_option()
def plan(spec: str) -> int:
    """Show where each model runs (TP×PP, GPUs, MIG slices).

    One row per model: devices or MIG slices per instance, the link between them, the
    memory each GPU needs, has and keeps free, and the Kubernetes resource to request.
    """
    from builder.plan.planner import plan_for_spec
    from builder.plan.replicas import routed_replicas
    from builder.plan.router_instances import router_instances

    loaded = load_spec(spec)
    planned = plan_for_spec(loaded)
    click.echo(format_plan(planned, routed_replicas(loaded, planned)))
    router = router_instances(loaded)
    if router is not None and loaded.router is not None:  # the same condition, for mypy
        click.echo(
            f"router: {loaded.router.name}, {router.count} instance(s) KIND_CPU ({router.why})"
        )
    return 0


def format_plan(plan, replicas=None) -> str:
    """The plan as an aligned table plus a one-line summary of the node. `replicas`:
    model → its replicas' names (builder.plan.replicas), shown beside its instances."""
    header = (
        "MODEL",
        "ENGINE",
        "TP×PP",
        "INSTANCES",
        "DEVICES / SLICES",
        "LINK",
        "NEED/GPU",
        "USABLE",
        "FREE",
        "K8S RESOURCE/INSTANCE",
    )
    rows = [header] + [_row(m, (replicas or {}).get(m.name, ())) for m in plan.models.values()]
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if plan.gpu is None:
        lines.append("hardware: cpu (every instance KIND_CPU)")
    else:
        idle = sorted(set(range(plan.count)) - plan.used_gpus)
        mig = ", ".join(
            f"GPU{g}: {'+'.join(s.profile.name for s in slices)}"
            for g, slices in sorted(plan.mig_layouts.items())
        )
        lines.append(
            f"hardware: {plan.count}× {plan.gpu.name}, topology "
            f"{plan.topology.source}; idle GPUs: "
            f"{', '.join(map(str, idle)) or 'none'}; MIG: {mig or 'none'}"
        )
    return "\n".join(lines)


def _gib(value):
    return "?" if value is None else f"{value:.1f} GiB"


def _row(model, replicas=()) -> tuple[str, ...]:
    if model.kind == "cpu":
        return (
            model.name,
            model.engine,
            "-",
            f"{len(replicas)} replicas" if replicas else "-",
            f"cpu: {', '.join(replicas)}" if replicas else "cpu",
            "-",
            "-",
            "-",
            "-",
            "-",
        )
    # Replica i runs on instance i (builder.plan.replicas.replica).
    devices = "; ".join(
        f"{replicas[n]} {_devices(i)}" if replicas else _devices(i)
        for n, i in enumerate(model.instances)
    )
    resources = ", ".join(f"{k}={v}" for k, v in model.kubernetes_resources.items())
    count = f"{len(model.instances)}{' replicas' if replicas else ''}"
    return (
        model.name,
        model.engine,
        f"{model.tp}×{model.pp}",
        count,
        devices,
        model.link,
        _gib(model.need.total_gib if model.need else None),
        _gib(model.usable_gib),
        _gib(model.free_gib),
        resources,
    )


def _devices(instance) -> str:
    if instance.slice is not None:
        a = instance.slice
        return f"GPU{a.gpu} {a.slice.profile.name}@{a.slice.start}"
    return "GPU" + ",".join(map(str, instance.devices))


@group()
def mig() -> None:
    """MIG layouts: check one, or plan the one a spec needs."""


def _gpu_types(incomplete: str) -> list[str]:
    from builder.plan.gpus import GPU_TYPES

    return [name for name in GPU_TYPES if name.lower().startswith(incomplete.lower())]


@mig.command()
@click.option(
    "--gpu",
    required=True,
    help="GPU type, e.g. H100-80GB",
    shell_complete=lambda _ctx, _param, incomplete: _gpu_types(incomplete),
)
@click.option(
    "--profiles", required=True, metavar="PROFILE=COUNT,...", help="e.g. 4g.40gb=1,3g.40gb=1"
)
def check(gpu: str, profiles: str) -> int:
    """Is a set of MIG profiles legal on one GPU? Exit 1 when it is not."""
    from builder.plan import mig as migs
    from builder.plan.gpus import GPU_TYPES

    gpu_type = GPU_TYPES.get(gpu)
    if gpu_type is None:
        raise TridentError(f"--gpu: {gpu!r} is not one of {', '.join(GPU_TYPES)}", EXIT_USAGE)
    try:
        counts = migs.parse_profile_counts(profiles)
    except migs.MigError as e:  # malformed, or a count no GPU can hold: bad input
        raise TridentError(f"--profiles: {e}", EXIT_USAGE) from None
    try:
        slices = migs.check_layout(gpu_type, counts)
    except migs.MigError as e:
        click.echo(f"illegal: {e}", err=True)
        return EXIT_FAILURE
    placed = ", ".join(f"{s.profile.name}@{s.start}" for s in slices)
    click.echo(f"legal on {gpu_type.name}: {placed} (profile@first memory slice)")
    return 0


@mig.command("plan")
@spec_option()
@click.option(
    "--out",
    required=True,
    metavar="FILE",
    shell_complete=complete_file,
    help="mig-parted config file to write",
)
def mig_plan(spec: str, out: str) -> int:
    """Write the NVIDIA mig-parted config a spec needs."""
    from builder.plan import mig as migs
    from builder.plan.planner import plan_for_spec

    deployment = load_spec(spec)
    # Never over the spec, its topology file, or any file trident did not write.
    topology = topology_candidates(deployment.hardware.topology, deployment.file)
    protect: list[str | Path] = [deployment.file, *topology]
    target = output_dir.check_file_target(Path(out), protect, MIG_PLAN_HEADER)
    placement = plan_for_spec(deployment)
    if placement.gpu is None:
        raise TridentError(
            f"{deployment.file}: hardware.gpu is cpu: nothing to partition", EXIT_USAGE
        )
    name = f"trident-{deployment.name}"
    config = migs.mig_parted_config(name, placement.count, dict(placement.mig_layouts))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(
        f"{MIG_PLAN_HEADER} from {deployment.file}: apply with\n"
        f"#   nvidia-mig-parted apply -f {target.name} -c {name}\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
    tmp.replace(target)  # never a half-written config
    gpus = ", ".join(map(str, sorted(placement.mig_layouts))) or "none"
    click.echo(f"wrote {target}: {len(placement.mig_layouts)} GPU(s) with MIG ({gpus})")
    return 0


COMMANDS = [plan, mig]
