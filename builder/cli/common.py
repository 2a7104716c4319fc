"""What the command modules share: the group class, common options.

Command modules import this, never builder.cli.main, so main can import them all without
a cycle.
"""

from __future__ import annotations

import signal
from contextlib import AbstractContextManager

import click
from click.shell_completion import CompletionItem

from builder import signals
from builder.spec import ServerSpec


class TridentGroup(click.Group):
    """A command group that treats a missing subcommand as a usage error (exit 2, one
    line) instead of printing its help and exiting, as click's groups do by default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("no_args_is_help", False)
        super().__init__(*args, **kwargs)


def group(name: str | None = None, **kwargs):
    """@click.group with TridentGroup (sub-groups inherit the root's context settings)."""
    return click.group(name, cls=TridentGroup, **kwargs)


# Shell completion of paths without click.Path: its conversion would stat the argument
# and fail on it in its own words, where trident's loaders name the file and the reason.
def complete_file(_ctx, _param, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="file")]


def complete_dir(_ctx, _param, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="dir")]


def spec_option(required: bool = True, help: str = "deployment spec (YAML)"):
    return click.option(
        "--spec", required=required, metavar="FILE", help=help, shell_complete=complete_file
    )


def api_keys_option(help: str):
    """--api-keys-file: the OpenAI frontend requires keys (builder.serve.openai.keys)."""
    return click.option(
        "--api-keys-file", type=click.Path(dir_okay=False), default=None, metavar="FILE", help=help
    )


def drain_timeout_option(help: str):
    """--drain-timeout (into `drain_timeout_s`): how long a drain lets the answers in
    flight finish (builder/serve/drain.py); the spec's default, as Kubernetes renders it."""
    return click.option(
        "--drain-timeout",
        "drain_timeout_s",
        type=click.FloatRange(0, 600),
        default=ServerSpec.drain_timeout_s,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


def otlp_traces_option(help: str):
    """--otlp-traces-endpoint: where OpenTelemetry traces go (builder/serve/tracing.py),
    over the standard OTEL_* environment."""
    return click.option("--otlp-traces-endpoint", default=None, metavar="URL", help=help)


def _model_names(_ctx, _param, values: tuple) -> tuple:
    for value in values:
        if not value or not all(c.isalnum() or c in "_-." for c in value):
            raise click.BadParameter(
                f"{value!r} is not a model name (letters, digits, '_', '-', '.')"
            )
    return values


def expose_option():
    """--expose: the models the OpenAI frontend serves (builder.serve.openai.policy); none
    given: the router only."""
    return click.option(
        "--expose",
        multiple=True,
        metavar="MODEL",
        callback=_model_names,
        help="a model the OpenAI API serves and lists; repeatable "
        "[default: router]. Engine models behind the router skip "
        "its tenant limits: expose them only on a trusted network",
    )


def sigterm_as_interrupt(*more: int) -> AbstractContextManager[None]:
    """SIGTERM (and the signals in `more`) raise KeyboardInterrupt for the duration, so a
    job cleans up after itself as on Ctrl-C (and exits 130)."""
    return signals.handling((signal.SIGTERM, *more), signals.interrupt)
