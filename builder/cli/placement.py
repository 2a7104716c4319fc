"""`trident plan` and `trident mig check|plan`: the placement planner on the command line.

Loaded by builder.cli.main (extension module). Exit codes: 0 success; 1 the layout cannot
exist or the models do not fit; 2 bad input (spec defect, unknown GPU type).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from builder.errors import TridentError
from builder.render import output_dir
from builder.spec import load_spec

EXIT_ILLEGAL = 1
EXIT_USAGE = 2


def add_commands(sub) -> None:
    p = sub.add_parser("plan", help="show where each model runs (TP×PP, GPUs, MIG slices)")
    p.add_argument("--spec", required=True, help="deployment spec (YAML)")
    p.set_defaults(func=cmd_plan)

    mig_parser = sub.add_parser("mig", help="MIG layouts: check one, or plan a spec's")
    mig_sub = mig_parser.add_subparsers(dest="mig_command", required=True, metavar="COMMAND")
    p = mig_sub.add_parser("check", help="is a set of MIG profiles legal on one GPU?")
    p.add_argument("--gpu", required=True, help="GPU type, e.g. H100-80GB")
    p.add_argument("--profiles", required=True, help="PROFILE=COUNT,... e.g. 3g.40gb=2")
    p.set_defaults(func=cmd_mig_check)
    p = mig_sub.add_parser("plan", help="write the mig-parted config a spec needs")
    p.add_argument("--spec", required=True, help="deployment spec (YAML)")
    p.add_argument("--out", required=True, help="mig-parted config file to write")
    p.set_defaults(func=cmd_mig_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from builder.plan.planner import plan_for_spec

    spec = load_spec(args.spec)
    print(format_plan(plan_for_spec(spec)))
    return 0


def format_plan(plan) -> str:
    """The plan as an aligned table plus a one-line summary of the node."""
    header = ("MODEL", "ENGINE", "TP×PP", "INSTANCES", "DEVICES / SLICES", "LINK",
              "NEED/GPU", "USABLE", "FREE", "K8S RESOURCE/INSTANCE")
    rows = [header] + [_row(m) for m in plan.models.values()]
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in rows]
    if plan.gpu is None:
        lines.append("hardware: cpu (every instance KIND_CPU)")
    else:
        idle = sorted(set(range(plan.count)) - plan.used_gpus)
        mig = ", ".join(f"GPU{g}: {'+'.join(s.profile.name for s in slices)}"
                        for g, slices in sorted(plan.mig_layouts.items()))
        lines.append(f"hardware: {plan.count}× {plan.gpu.name}, topology "
                     f"{plan.topology.source}; idle GPUs: "
                     f"{', '.join(map(str, idle)) or 'none'}; MIG: {mig or 'none'}")
    return "\n".join(lines)


def _row(model) -> tuple[str, ...]:
    if model.kind == "cpu":
        return (model.name, model.engine, "-", "-", "cpu", "-", "-", "-", "-", "-")
    devices = "; ".join(_devices(i) for i in model.instances)
    gib = lambda v: "?" if v is None else f"{v:.1f} GiB"
    resources = ", ".join(f"{k}={v}" for k, v in model.kubernetes_resources.items())
    return (model.name, model.engine, f"{model.tp}×{model.pp}", str(len(model.instances)),
            devices, model.link, gib(model.need.total_gib if model.need else None),
            gib(model.usable_gib), gib(model.free_gib), resources)


def _devices(instance) -> str:
    if instance.slice is not None:
        a = instance.slice
        return f"GPU{a.gpu} {a.slice.profile.name}@{a.slice.start}"
    return "GPU" + ",".join(map(str, instance.devices))


def cmd_mig_check(args: argparse.Namespace) -> int:
    from builder.plan import mig
    from builder.plan.gpus import GPU_TYPES

    gpu = GPU_TYPES.get(args.gpu)
    if gpu is None:
        raise TridentError(f"--gpu: {args.gpu!r} is not one of {', '.join(GPU_TYPES)}",
                           EXIT_USAGE)
    try:
        slices = mig.check_layout(gpu, mig.parse_profile_counts(args.profiles))
    except mig.MigError as e:
        print(f"illegal: {e}", file=sys.stderr)
        return EXIT_ILLEGAL
    placed = ", ".join(f"{s.profile.name}@{s.start}" for s in slices)
    print(f"legal on {gpu.name}: {placed} (profile@first memory slice)")
    return 0


def cmd_mig_plan(args: argparse.Namespace) -> int:
    from builder.plan import mig
    from builder.plan.planner import plan_for_spec

    spec = load_spec(args.spec)
    out = output_dir.check_file_target(Path(args.out), [spec.file])
    plan = plan_for_spec(spec)
    if plan.gpu is None:
        raise TridentError(f"{spec.file}: hardware.gpu is cpu: nothing to partition",
                           EXIT_USAGE)
    config = mig.mig_parted_config(f"trident-{spec.name}", plan.count, plan.mig_layouts)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(f"# Rendered by trident from {spec.file}: apply with\n"
                   f"#   nvidia-mig-parted apply -f {out.name} -c trident-{spec.name}\n"
                   + yaml.safe_dump(config, sort_keys=False))
    tmp.replace(out)   # never a half-written config
    print(f"wrote {out}: {len(plan.mig_layouts)} GPU(s) with MIG "
          f"({', '.join(map(str, sorted(plan.mig_layouts))) or 'none'})")
    return 0
