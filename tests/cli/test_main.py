"""The `trident` command line on click: help everywhere, exit codes, one-line errors,
shell completion, and the entry points (main(), python -m builder.cli[.main])."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from builder.cli import main as cli_main
from builder.cli.common import sigterm_as_interrupt
from builder.cli.main import cli, main
from builder.errors import TridentError
from engine_cache.errors import CacheError

ROOT = Path(__file__).resolve().parents[2]


def _command_paths(command: click.Command, path: tuple[str, ...] = ()):
    yield path
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _command_paths(sub, path + (name,))


COMMAND_PATHS = list(_command_paths(cli))


def test_every_documented_command_exists():
    paths = {" ".join(p) for p in COMMAND_PATHS}
    for expected in (
        "repo",
        "validate",
        "serve",
        "infer",
        "plan",
        "mig check",
        "mig plan",
        "engines plan",
        "engines build",
        "engines prebuild",
        "cache ls",
        "cache stats",
        "cache verify",
        "cache gc",
        "assets",
        "schema",
        "completion",
    ):
        assert expected in paths


def test_every_module_command_is_registered():
    for module in cli_main.COMMAND_MODULES:
        for command in module.COMMANDS:
            assert cli.commands[command.name] is command


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(p) or "trident")
def test_help_exits_0_on_every_command_and_group(path, capsys):
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: {' '.join(('trident',) + path)}")
    command = cli
    for name in path:
        command = command.commands[name]
    assert command.help, f"trident {' '.join(path)} has no help text"


def test_dash_h_is_help_too(capsys):
    assert main(["cache", "gc", "-h"]) == 0
    assert "--keep-last" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "Missing command"),
        (["bogus"], "No such command 'bogus'"),
        (["mig"], "trident mig: Missing command"),
        (["repo", "--out", "x"], "Missing option '--spec'"),
        (["repo", "--spec"], "'--spec' requires an argument"),
        (["repo", "--spec", "a", "--out", "b", "--frobnicate"], "--frobnicate"),
        (["serve", "--http-port", "eighty"], "'eighty' is not a valid integer"),
        (["infer"], "Missing argument 'PROMPT"),
        (["completion", "tcsh"], "'tcsh' is not one of"),
        (["validate", "a", "b"], "unexpected extra argument"),
    ],
)
def test_usage_error_exits_2_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert words in lines[0]


def test_bad_spec_exits_2_naming_the_field(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\nmodels:\n  - {name: a, engine: vlm, model: /m}\n")
    assert main(["plan", "--spec", str(spec)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "models[0].engine" in lines[0] and "Traceback" not in lines[0]


def test_infer_on_a_closed_port_says_it_cannot_reach_triton(capsys):
    """Issue 34: it said "The stream is no longer in valid state" (the reason went to
    the stream's callback)."""
    from builder.serve.server import free_port

    port = free_port()
    assert main(["infer", "--url", f"127.0.0.1:{port}", "hi"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: router at 127.0.0.1:{port}: cannot reach Triton's gRPC")
    assert "no longer in valid state" not in line


def test_missing_spec_exits_2(tmp_path, capsys):
    assert (
        main(["repo", "--spec", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out")]) == 2
    )
    assert "nope.yaml" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "error, code",
    [
        (TridentError("the job failed"), 1),
        (TridentError("bad input", 2), 2),
        (CacheError("cache broke"), 1),
        (PermissionError(13, "Permission denied", "/x/y"), 1),
    ],
)
def test_errors_map_to_exit_codes_and_one_line(monkeypatch, capsys, error, code):
    def failing() -> None:
        raise error

    monkeypatch.setitem(cli.commands, "boom", click.Command("boom", callback=failing))
    assert main(["boom"]) == code
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    if isinstance(error, OSError):
        assert lines[0] == "error: /x/y: Permission denied"


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.commands, "boom", click.Command("boom", callback=interrupted))
    assert main(["boom"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_commands_return_their_exit_code(capsys):
    assert main(["mig", "check", "--gpu", "H100-80GB", "--profiles", "7g.80gb=2"]) == 1
    assert main(["schema"]) == 0


@pytest.mark.parametrize(
    "shell, marker", [("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --no-files")]
)
def test_completion_prints_the_script(shell, marker, capsys):
    assert main(["completion", shell]) == 0
    out = capsys.readouterr().out
    assert "_TRIDENT_COMPLETE" in out and marker in out


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_completion_answers_through_the_environment_variable():
    result = _run(
        "-m",
        "builder.cli.main",
        env={"_TRIDENT_COMPLETE": "bash_complete", "COMP_WORDS": "trident ca", "COMP_CWORD": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["plain,cache"]


def test_completion_of_paths_and_gpu_types():
    result = _run(
        "-m",
        "builder.cli",
        env={
            "_TRIDENT_COMPLETE": "bash_complete",
            "COMP_WORDS": "trident mig check --gpu H200",
            "COMP_CWORD": "4",
        },
    )
    assert result.stdout.split() == ["plain,H200-141GB"]
    result = _run(
        "-m",
        "builder.cli",
        env={
            "_TRIDENT_COMPLETE": "bash_complete",
            "COMP_WORDS": "trident repo --spec dep",
            "COMP_CWORD": "3",
        },
    )
    assert result.stdout.split() == ["file,dep"]


@pytest.mark.parametrize("module", ["builder.cli", "builder.cli.main"])
def test_python_dash_m_runs_the_cli(module):
    result = _run("-m", module, "--help")
    assert result.returncode == 0 and "Usage: trident" in result.stdout
    result = _run("-m", module, "repo", "--zzz")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: trident repo: No such option") and "--zzz" in line
    assert line.endswith("(see `trident repo --help`)")


def test_help_does_not_import_the_heavy_clients():
    code = (
        "import sys; from builder.cli.main import main; main(['--help']); "
        "print(sorted(m for m in ('tritonclient', 'boto3', 'grpc', 'jinja2') "
        "if m in sys.modules))"
    )
    result = _run("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_job_takes_sigterm_as_ctrl_c_and_gives_the_handler_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at once, in this thread
    assert signal.getsignal(signal.SIGTERM) is before
