"""Serve a rendered vLLM model with the paced AsyncLLM double instead of vLLM, without
changing the model's code: the model's stub runs in a small virtual environment (Triton's
EXECUTION_ENV_PATH) whose `.pth` puts support/engine_doubles first on sys.path, so
`import vllm` gets the double; the real site-packages follow, for everything else.

The Python backend sources `<env>/bin/activate` before it starts the stub, and the stub
takes its Python from PATH (DESIGN.md), so the environment's pyvenv.cfg decides the
stub's sys.path. The environment points at the same base Python as the running one.
"""

from __future__ import annotations

import json
import site
import sys
import venv
from pathlib import Path

from support.pacing import Rate

ROOT = Path(__file__).resolve().parent.parent
DOUBLES = ROOT / "support" / "engine_doubles"


def make_environment(folder: Path) -> Path:
    """A virtual environment (no pip: nothing is installed in it) whose sys.path is the
    doubles, the repository root (for support.pacing), then this Python's site-packages
    with their own .pth files (trident's editable install among them)."""
    folder = Path(folder)
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(folder)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = folder / "lib" / version / "site-packages"
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = [str(DOUBLES), str(ROOT)] + [f"import site; site.addsitedir({p!r})" for p in ours]
    (packages / "zz_trident_engine_doubles.pth").write_text("\n".join(lines) + "\n")
    return folder


def write_rate(control: Path, rate: Rate) -> None:
    """The rate the double reads at its next request (atomically: never half a file)."""
    tmp = Path(f"{control}.tmp")
    tmp.write_text(
        json.dumps(
            {
                "ttft_s": rate.ttft_s,
                "tokens_per_s": rate.tokens_per_s,
                "batch_tokens_per_s": rate.batch_tokens_per_s,
            }
        )
    )
    tmp.replace(control)


def use_double(repo: Path, model: str, environment: Path, control: Path, rate: Rate) -> None:
    """Point a rendered vLLM model at the double: its stub runs in `environment`, its
    engine arguments name the control file (written here with `rate`)."""
    config = Path(repo) / model / "config.pbtxt"
    config.write_text(
        config.read_text()
        + (
            "\n# bench: the stub runs with the paced AsyncLLM double (support/vllm_double.py)\n"
            'parameters: { key: "EXECUTION_ENV_PATH" '
            f'value: {{ string_value: "{environment}" }} }}\n'
        )
    )
    engine = Path(repo) / model / "1" / "model.json"
    engine_args = json.loads(engine.read_text())
    engine_args["rate_control"] = str(control)
    engine.write_text(json.dumps(engine_args, indent=2) + "\n")
    write_rate(control, rate)
