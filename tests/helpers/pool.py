"""One tritonserver per configuration for the whole run (the server tests' pool).

A configuration is what makes one server differ from another: the spec it renders, the
edits made to the rendered repository, the models it loads and the server's arguments.
tests/server/conftest.py defines each configuration once and gives it a session fixture;
the pool starts its server on first use and stops it after the last test that asks for
it (tests are ordered by configuration, so each one starts once). Its key is the
configuration's content, so two names for the same server cannot both exist.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.serve.server import TritonServer
from tests.helpers.servers import render, start_server


@dataclass(frozen=True)
class ServerConfig:
    name: str  # the fixture that hands out its server
    # The spec data rendered into the server's repository, given the server's folder
    # (where files the spec names, such as LoRA adapters, are written first).
    spec: Callable[[Path], dict] = field(repr=False)
    # Files written into the server's folder before rendering, and edits to the rendered
    # repository before the server starts (engine doubles, extra config parameters):
    # (what it does, in words, for the key) and the function doing it.
    before: tuple[tuple[str, Callable[[Path], None]], ...] = ()
    prepare: tuple[tuple[str, Callable[[Path], None]], ...] = ()
    load_models: tuple[str, ...] | None = None  # None: every model of the repository
    extra_args: tuple[str, ...] = ()
    timeout_s: float = 300.0
    # A real vLLM engine serves in it: its tests share the vLLM lane (tests/server/conftest.py).
    real_vllm: bool = False

    @property
    def key(self) -> str:
        content = {
            "spec": self.spec(Path("{folder}")),
            "before": [what for what, _ in self.before],
            "prepare": [what for what, _ in self.prepare],
            "load_models": self.load_models,
            "extra_args": self.extra_args,
        }
        text = json.dumps(content, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def check_distinct(configs: list[ServerConfig]) -> None:
    """Each configuration once: a second name for the same server is a mistake."""
    seen: dict[str, str] = {}
    for config in configs:
        if config.key in seen:
            raise ValueError(f"server configs {seen[config.key]} and {config.name} are the same")
        seen[config.key] = config.name


class Pool:
    def __init__(self, make_dir: Callable[[str], Path]):
        self._make_dir = make_dir  # a fresh folder per server (tmp_path_factory.mktemp)
        self._live: dict[str, TritonServer] = {}
        self._stopped: set[str] = set()

    def get(self, config: ServerConfig) -> TritonServer:
        if config.name in self._stopped:
            raise RuntimeError(
                f"{config.name} was stopped after its last test: a test that needs it "
                "ran out of order (tests/server/conftest.py orders them)"
            )
        if config.name not in self._live:
            folder = self._make_dir(config.name)
            for _, write in config.before:
                write(folder)
            repo = render(config.spec(folder), folder / "repo")
            for _, edit in config.prepare:
                edit(repo)
            self._live[config.name] = start_server(
                repo,
                folder,
                load_models=config.load_models,
                timeout_s=config.timeout_s,
                extra_args=config.extra_args,
            )
        return self._live[config.name]

    def release(self, name: str) -> None:
        server = self._live.pop(name, None)
        if server is not None:
            self._stopped.add(name)
            server.stop()

    def close(self) -> None:
        for name in list(self._live):
            self.release(name)
