"""One tritonserver per configuration for the whole run (the server tests' pool), and
as few tritonserver processes as the configurations allow.

A configuration is what makes one server differ from another: the spec it renders, the
edits made to the rendered repository, the models it loads and the server's arguments.
tests/server/conftest.py defines each configuration once and gives it a session fixture;
the pool serves it on first use and lets it go after the last test that asks for it
(tests are ordered by configuration, so each one is served once). Its key is the
configuration's content, so two names for the same server cannot both exist.

A configuration let go does not stop its tritonserver: the process goes idle and serves
the next configuration, its repository swapped by model control. Each process is started
on a symbolic link (`live`) to the repository it serves; a swap unloads every model,
points the link at the next repository and loads that one's models, as `trident serve`
would have at start-up. Triton reads the repository through the link at each load, so
the stubs of the new models run the new files. What a test gets is a TritonServer with
the process's ports, keys and log but its own repository (`server.repository` is the
configuration's folder, where its spec's files are). What a swap cannot change is the
process's command line and environment: a repository that needs others (extra
arguments, TRT-LLM's orchestrator variable) gets a process of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from builder.serve import loading
from builder.serve.install import needs_trtllm_orchestrator
from builder.serve.server import TritonServer
from builder.serve.watch import runs_in_stub, stub_processes
from tests.helpers.ledger import LEDGER
from tests.helpers.servers import render, start_server

CONTROL_TIMEOUT_S = 120.0  # a model-control call's own answer (a dead stub's model reloads)
# A model still loaded this long after its unload (Triton waits for its requests in
# flight: a stream some test left open holds it) costs its process: a new one serves.
UNLOAD_GRACE_S = 60.0


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


@dataclass
class _Process:
    server: TritonServer  # started on `live`
    live: Path  # the link to the repository it serves
    shared: bool = True  # serves other repositories after this one (see Pool.serve)

    @property
    def shape(self) -> tuple:
        """What a swap cannot change: the command line's extras and the environment's."""
        return _shape(self.live.resolve(), self.server.extra_args)

    def alive(self) -> bool:
        return self.server.process is not None and self.server.process.poll() is None

    def reusable(self) -> bool:
        return self.shared and self.alive()


def _shape(repository: Path, extra_args: tuple[str, ...]) -> tuple:
    return (tuple(extra_args), needs_trtllm_orchestrator(repository))


class Pool:
    def __init__(self, make_dir: Callable[[str], Path]):
        self._make_dir = make_dir  # a fresh folder per name (tmp_path_factory.mktemp)
        self._live: dict[str, tuple[TritonServer, _Process]] = {}  # name -> (its view, process)
        self._stopped: set[str] = set()
        self._idle: list[_Process] = []
        self._dead: set[str] = set()  # names whose dead process was reported (deaths)

    def get(self, config: ServerConfig) -> TritonServer:
        """The server of a configuration (tests/server/configs.py), served on first use."""
        if config.name in self._stopped:
            raise RuntimeError(
                f"{config.name} was let go after its last test: a test that needs it "
                "ran out of order (tests/server/conftest.py orders them)"
            )
        if config.name not in self._live:
            folder = self._make_dir(config.name.removesuffix("_server"))
            for _, write in config.before:
                write(folder)
            repo = render(config.spec(folder), folder / "repo")
            for _, edit in config.prepare:
                edit(repo)
            self.serve(
                config.name,
                repo,
                config.load_models,
                config.timeout_s,
                config.extra_args,
                own_process=config.real_vllm,
            )
        return self._live[config.name][0]

    def serve(
        self,
        name: str,
        repo: Path,
        load_models: tuple[str, ...] | list[str] | None = None,
        timeout_s: float = 300.0,
        extra_args: tuple[str, ...] = (),
        own_process: bool = False,
    ) -> TritonServer:
        """A repository a test module rendered itself, served under `name` until
        release(name): by an idle process when one fits, else by a new one.
        `own_process`: a new process, stopped at release. The real vLLM configurations
        take one each: swapped in after another vLLM repository, fallback's `backup`
        loaded (its engine ready) but Triton never reported the load within the test's
        300 s, in one full run of 2026-12-04 (it swapped in 87 s alone)."""
        if name in self._live or name in self._stopped:
            raise RuntimeError(f"{name} is served once per run (tests/helpers/pool.py)")
        repo = Path(repo).absolute()
        load = None if load_models is None else tuple(load_models)
        fits = [p for p in self._idle if p.reusable() and p.shape == _shape(repo, extra_args)]
        process = None
        if fits and not own_process:
            process = fits[0]
            self._idle.remove(process)
            try:
                _swap(process, repo, load, timeout_s)
            except _Stuck:
                # A new process instead, counted as the start it is (the ledger's budget
                # shows it, and its list says why beside the swap).
                process.server.stop()
                process = None
            except BaseException:
                self._let_go(process)  # the next swap unloads whatever half loaded
                raise
        if process is None:
            folder = self._make_dir("tritonserver")
            live = folder / "live"
            live.symlink_to(repo)
            server = start_server(live, folder, load, timeout_s, extra_args)
            process = _Process(server, live, shared=not own_process)
        view = dataclasses.replace(process.server, repository=repo, load_models=load)
        self._live[name] = (view, process)
        return view

    @contextlib.contextmanager
    def serving(self, name: str, repo: Path, **options) -> Iterator[TritonServer]:
        """serve() for a module fixture: released when the fixture ends."""
        try:
            yield self.serve(name, repo, **options)
        finally:
            self.release(name)

    def release(self, name: str) -> None:
        """After a name's last test: its process goes idle (or away, if the test stopped it)."""
        entry = self._live.pop(name, None)
        if entry is not None:
            self._stopped.add(name)
            self._let_go(entry[1])

    def _let_go(self, process: _Process) -> None:
        if process.reusable():
            self._idle.append(process)
        else:
            process.server.stop()  # its shared memory, and what is left of its group

    def deaths(self) -> list[tuple[str, int, Path | None]]:
        """The served names whose process has died since last asked, each once: (name,
        exit code, its log). A dead server fails every later test of its lane, and the
        CI log keeps no files: the first failure's report carries the cause."""
        dead = []
        for name, (view, process) in self._live.items():
            if process.server.process is not None and not process.alive():
                if name not in self._dead:
                    self._dead.add(name)
                    dead.append((name, process.server.process.returncode, view.log_path))
        return dead

    def close(self) -> None:
        for name in list(self._live):
            self.release(name)
        for process in self._idle:
            process.server.stop()
        self._idle.clear()


class _Stuck(Exception):
    """A model of the repository served before would not unload: the process is replaced."""


def _swap(process: _Process, repo: Path, load: tuple[str, ...] | None, timeout_s: float) -> None:
    """Serve `repo` on a running process: unload what it serves (callers first, so no
    request waits on a model already gone), point its link at `repo`, load (every model,
    or `load`) dependencies first. Raises _Stuck if a model would not unload."""
    server = process.server
    assert server.log_path is not None  # start_server gives every server a log
    entry = LEDGER.record("repository swap", f"{repo.parent.name}/{repo.name}", server.log_path, 0)
    try:
        _empty(server, process.live.resolve())
    except _Stuck as e:
        entry.label += f" (not here: {e}, so a new process serves it)"
        raise
    entry.since = server.log_path.stat().st_size  # the unloads' lines are the last repository's
    link = process.live.with_name("live.next")
    link.unlink(missing_ok=True)
    link.symlink_to(repo)
    os.replace(link, process.live)  # atomic: Triton never reads a missing repository
    wanted = load or [m["name"] for m in server.model_states()]
    deadline = time.monotonic() + timeout_s
    for model in loading.load_order(wanted, loading.dependencies(repo)):
        server.load(model, deadline, timeout_s)
    entry.ready()


def _empty(server: TritonServer, served: Path) -> None:
    """Unload every model, the router before the engines it calls, each waited for. A
    READY model whose stub a test killed is loaded again first: Triton 2.51 keeps such a
    model READY, and its unload then waits for the dead stub for ever (UNLOADING)."""
    assert server.process is not None
    states = {m["name"]: m.get("state") for m in server.model_states()}
    alive = stub_processes(server.process.pid).values()
    for stub in alive:
        if states.get(stub.model) != "READY":  # a load that never finished: no unload ends it
            os.kill(stub.pid, signal.SIGKILL)
    ready = [model for model, state in states.items() if state == "READY"]
    with_stub = {stub.model for stub in alive}
    for model in ready:
        config = served / model / "config.pbtxt"
        if model not in with_stub and config.is_file() and runs_in_stub(config.read_text()):
            loading.request(server.http_url, model, "load", CONTROL_TIMEOUT_S, server.admin_headers)
    for model in reversed(loading.load_order(ready, loading.dependencies(served))):
        loading.request(server.http_url, model, "unload", CONTROL_TIMEOUT_S, server.admin_headers)
        deadline = time.monotonic() + UNLOAD_GRACE_S
        while _still_there(server, model):
            if time.monotonic() > deadline:
                raise _Stuck(f"{model} did not unload within {UNLOAD_GRACE_S:.0f} s")
            time.sleep(0.1)


def _still_there(server: TritonServer, model: str) -> bool:
    assert server.process is not None
    if any(s.model == model for s in stub_processes(server.process.pid).values()):
        return True
    state = {m["name"]: m.get("state") for m in server.model_states()}.get(model)
    return state in ("READY", "UNLOADING")
