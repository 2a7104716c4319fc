"""`trident repo | validate | schema | assets`: render, check and describe repositories."""

from __future__ import annotations

import json
from pathlib import Path

import click

from builder.cli.common import complete_dir, sigterm_as_interrupt, spec_option
from builder.errors import EXIT_FAILURE


@click.command()
@spec_option()
@click.option(
    "--out",
    required=True,
    metavar="DIR",
    shell_complete=complete_dir,
    help="model repository directory to (re)place",
)
def repo(spec: str, out: str) -> int:
    """Render a spec into a Triton model repository.

    Renders into a temporary directory, validates it, then swaps it into place: a failed
    render leaves no directory and no half-written files. Exit 2 on a bad spec.
    """
    from builder import pipeline  # lazy: templates and the planner, for this only
    from builder.spec import load_spec

    deployment = load_spec(spec)
    with sigterm_as_interrupt():  # the render cleans up after itself as on Ctrl-C
        written = pipeline.build_repository(deployment, Path(out))
    replicas = replicas_written(Path(out), deployment.router.name) if deployment.router else {}
    click.echo(
        summary(len(deployment.models), deployment.router is not None, out, written, replicas)
    )
    return 0


def replicas_written(out: Path, router: str) -> dict[str, list[str]]:
    """model → its replicas' names, as the rendered router.json lists them (what was
    written, whatever decided it: engine, router, nodes)."""
    from builder.render.context import VERSION

    config = json.loads((out / router / VERSION / "router.json").read_text())
    return {
        name: list(entry["replicas"])
        for name, entry in config["backends"].items()
        if entry.get("replicas")
    }


def summary(
    models: int, router: bool, out: str, written: int, replicas: dict[str, list[str]]
) -> str:
    """`trident repo`'s line: the spec's models, the router, where, and each model
    rendered as replicas with its replicas' names (the Triton models running its
    engines, which `<model>` and the router call)."""
    line = f"rendered {models} model(s){' + router' if router else ''} into {out} ({written} files)"
    for name, names in replicas.items():
        line += f"; {name} as {len(names)} replicas ({', '.join(names)})"
    return line


@click.command()
@click.argument("repo_dir", metavar="DIR", shell_complete=complete_dir)
def validate(repo_dir: str) -> int:
    """Check the model repository DIR.

    ModelConfig schema, names, explicit inputs and outputs, decoupled transactions, no
    leftover placeholders. Prints each problem and exits 1 when there is any.
    """
    from builder.render.validate import validate_repository

    problems = validate_repository(Path(repo_dir))
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        click.echo(f"{repo_dir}: {len(problems)} problem(s)", err=True)
        return EXIT_FAILURE
    click.echo(f"{repo_dir}: OK")
    return 0


@click.command()
def schema() -> int:
    """Print the JSON Schema of the deployment spec."""
    from builder.spec.schema import deployment_schema

    click.echo(json.dumps(deployment_schema(), indent=2, sort_keys=True))
    return 0


@click.command()
@click.argument("names", nargs=-1, metavar="[NAME]...")
def assets(names: tuple[str, ...]) -> int:
    """Build the builtin models (all, or each NAME).

    `make install` runs this once.
    """
    from builder.engines import assets as builtin

    for name in names or list(builtin.BUILDERS):
        click.echo(f"{name}: {builtin.ensure(name)}")
    return 0


COMMANDS = [repo, validate, schema, assets]
