"""The `trident` command line: deployment spec → Triton model repository → tritonserver.

Exit codes: 0 success; 1 a failure of the job (invalid repository, server did not come
up, build failed); 2 bad input (a spec defect, a bad argument, a usage error); 130
interrupted (Ctrl-C, or SIGTERM during a render). Errors are one line `error: ...` on
stderr, never a traceback.

Adding a command: write a module in builder/cli/ whose COMMANDS lists its click commands
or groups, and add it to COMMAND_MODULES below.
"""

from __future__ import annotations

import re
import sys

import click

from builder.cli import completion, engines, k8s, logs, openai, placement, repository, serve
from builder.cli.common import TridentGroup
from builder.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, TridentError, printable
from engine_cache.errors import CacheError
from engine_cache.redact import redact

COMMAND_MODULES = [
    repository,  # repo, validate, schema, assets
    serve,  # serve, infer, drain
    openai,  # openai (the OpenAI-compatible HTTP frontend)
    placement,  # plan, mig check|plan
    engines,  # engines plan|build|prebuild, cache ls|stats|verify|gc
    k8s,  # k8s, monitoring
    completion,  # completion bash|zsh|fish
]

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=TridentGroup, context_settings=CONTEXT_SETTINGS)
@click.option(
    "-v", "--verbose", is_flag=True, help="debug logging (trident's own loggers) on stderr"
)
def cli(verbose: bool) -> None:
    """Render a deployment spec into a validated Triton model repository and serve it.

    Exit codes: 0 success, 1 the job failed, 2 bad input, 130 interrupted.
    """
    logs.configure(verbose)


for _module in COMMAND_MODULES:
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Run trident with argv (default: sys.argv[1:]) and return the exit code."""
    try:
        # standalone_mode=False: click hands every exception to us, so the exit code and
        # the one-line message are decided here, the same for all commands.
        result = cli.main(args=argv, prog_name="trident", standalone_mode=False)
    except click.UsageError as e:
        return _error(_usage_line(e), EXIT_USAGE)
    except click.ClickException as e:
        return _error(e.format_message(), e.exit_code)
    except (click.Abort, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    except (TridentError, CacheError) as e:
        return _error(str(e), e.exit_code)
    except OSError as e:
        # A file the job needed could not be read or written (permissions, a full disk):
        # one line naming it, as for trident's own errors.
        where = f"{printable(e.filename)}: " if e.filename else ""
        return _error(f"{where}{e.strerror or e}", EXIT_FAILURE)
    except SystemExit as e:  # shell completion, or a closed stdout pipe, exit this way
        return e.code if isinstance(e.code, int) else EXIT_FAILURE
    return result if isinstance(result, int) else 0


def _usage_line(e: click.UsageError) -> str:
    message = re.sub(r"\s+", " ", e.format_message()).strip()
    path = e.ctx.command_path if e.ctx is not None else "trident"
    return f"{path}: {message} (see `{path} --help`)"


def _error(message: str, code: int) -> int:
    # Every error line goes through the one redaction rule: a value quoted back from a
    # spec or option (a URL with a password or a presigned query) is masked here too.
    click.echo(f"error: {redact(message)}", err=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
