"""Start a real tritonserver on a rendered repository, load its models, stop it cleanly.

Used by `trident serve` and by the tests. The server is our child, in its own process
group (not its own session: a separate session lets Linux autogroup scheduling starve
the clients on a small machine), so one signal stops the server and its backend stubs.
Its ports bind to loopback unless told otherwise (they take no API keys), and it runs in
explicit model-control mode: the models are loaded one by one (loading.py), and one that
dies is reloaded alone (keeper.py). Model control, shared memory and the log and trace
settings answer only requests carrying this start's admin key (admin.py).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.serve import admin, keeper, loading, selftest
from builder.serve.drain import STOP_GRACE_S, TRITON_EXIT_TIMEOUT_S
from builder.serve.install import (  # noqa: F401
    ServeError,
    TritonInstall,
    find_tritonserver,
    needs_trtllm_orchestrator,
    server_environment,
)
from builder.serve.output import OutputTail
from builder.serve.watch import HANG_TIMEOUT_S, group_processes, runs_in_stub, stub_processes
from builder.spec import ServerSpec
from trident_common import interface as INTERFACE

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
# Shared memory the server's processes leave behind on an unclean exit: the Python
# backend's regions, and vLLM's (multiprocessing.shared_memory names them psm_*, ~240 MiB
# each on CPU, left after SIGTERM).
LEAKED_SHM_PREFIXES = (SHM_PREFIX, "psm_")
WATCH_INTERVAL_S = 1.0  # how often `trident serve` looks at its server's stubs
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    http: int = ServerSpec.http_port  # the defaults are the spec's (one place)
    grpc: int = ServerSpec.grpc_port
    metrics: int = ServerSpec.metrics_port


def is_loopback(host: str) -> bool:
    """Whether an address to bind reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def connect_host(bind: str) -> str:
    """Where a client on this machine reaches a server bound to `bind`."""
    if bind in ("", "0.0.0.0"):
        return LOOPBACK
    if bind == "::":
        return "[::1]"
    return f"[{bind}]" if ":" in bind else bind


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How often `trident serve` starts a tritonserver that died again, in a row, before it
# exits 1 and leaves the restart to its supervisor (monitor).
RESTART_LIMIT = 3
TRITONSERVER = "tritonserver"  # its key in the restarts' count (keeper.Restarts)


@dataclass
class TritonServer:
    """One tritonserver process. Use as a context manager, or call start()/stop()."""

    repository: Path
    ports: Ports = field(default_factory=Ports)
    load_models: tuple[str, ...] | None = None  # only these; None: every model
    log_path: Path | None = None
    host: str = LOOPBACK  # HTTP and gRPC bind address
    metrics_host: str = LOOPBACK  # Prometheus scrapes this one, maybe from elsewhere
    extra_args: tuple[str, ...] = ()
    # One string round trip through a throwaway echo model before the first start in
    # this process (selftest.py): a stub that corrupts strings fails here, not later.
    self_test: bool = True
    process: subprocess.Popen | None = None
    output: OutputTail | None = None
    # The folder through which `trident serve` tells the models it drains (drain.py).
    drain_folder: Path | None = None
    # The folder where engines that keep their own gauges in files (SGLang's) write them,
    # for the OpenAI frontend's pod load (trident_common/engine_gauges.py); made at start.
    gauges_folder: Path | None = None
    # More of tritonserver's environment (its stubs inherit it): tracing's settings.
    extra_env: dict[str, str] = field(default_factory=dict)
    _regions: set[str] = field(default_factory=set, repr=False)  # noted by terminate()
    # Per start (an operator's own from the environment is kept); on Triton's command line.
    admin_key: str = field(default_factory=lambda: admin.key_from(os.environ), repr=False)

    @property
    def admin_headers(self) -> dict[str, str]:
        """The HTTP header the restricted APIs need (gRPC: admin.grpc_headers)."""
        return admin.http_headers(self.admin_key)

    @property
    def http_url(self) -> str:
        return f"http://{connect_host(self.host)}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{connect_host(self.host)}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{connect_host(self.metrics_host)}:{self.ports.metrics}/metrics"

    def command(self, install: TritonInstall) -> list[str]:
        cmd = [
            str(install.binary),
            f"--model-repository={Path(self.repository).absolute()}",
            f"--http-port={self.ports.http}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-port={self.ports.metrics}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.metrics_host}",
            # Models are loaded by wait_ready(), one at a time: see loading.py.
            "--model-control-mode=explicit",
            "--disable-auto-complete-config",
            f"--exit-timeout-secs={TRITON_EXIT_TIMEOUT_S}",
            "--log-verbose=0",
            # Room in each model instance's pool for the router's BLS calls awaiting a first
            # response and for every response sent meanwhile (interface.py says why).
            f"--backend-config=python,thread-pool-size={INTERFACE.PYTHON_THREAD_POOL_SIZE}",
            *admin.server_args(self.admin_key),
        ]
        if install.backend_dir is not None:
            cmd.append(f"--backend-directory={install.backend_dir}")
        if install.bundled:
            # The bundled build runs on CPU machines: no pinned memory, no GPU metrics.
            cmd += ["--pinned-memory-pool-byte-size=0", "--allow-gpu-metrics=false"]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        """The server's environment. The router proves itself to the engine models with
        a secret from it: one the operator set is kept, else each start makes its own
        (the stubs inherit it; it is never printed)."""
        env = server_environment()
        if not env.get(INTERFACE.ROUTER_SECRET_ENV):
            env[INTERFACE.ROUTER_SECRET_ENV] = secrets.token_urlsafe(32)
        env.pop(admin.KEY_ENV, None)  # Triton takes it on its command line; stubs need none
        if self.drain_folder is not None:
            env[INTERFACE.DRAIN_DIR_ENV] = str(self.drain_folder)
        if self.gauges_folder is not None:
            env[INTERFACE.ENGINE_GAUGES_DIR_ENV] = str(self.gauges_folder)
        if needs_trtllm_orchestrator(Path(self.repository)):
            env["TRTLLM_ORCHESTRATOR"] = "1"
        return env | self.extra_env

    def start(self) -> None:
        taken = [
            f"{name} port {port}"
            for name, port, host in (
                ("HTTP", self.ports.http, self.host),
                ("gRPC", self.ports.grpc, self.host),
                ("metrics", self.ports.metrics, self.metrics_host),
            )
            if port_in_use(port, host)
        ]
        if taken:
            raise ServeError(
                f"{', '.join(taken)} already in use; choose others with "
                "--http-port/--grpc-port/--metrics-port"
            )
        install = find_tritonserver()
        if self.gauges_folder is not None:
            self.gauges_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(install),
            env=self.environment(),
            process_group=0,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        # Its output goes where it always went (the log file, else our stderr), and the
        # last lines stay at hand to say where a model's load is stuck.
        pipe = self.process.stdout
        assert pipe is not None  # stdout=PIPE
        if self.log_path:
            self.output = OutputTail(pipe, open(self.log_path, "ab"), close_sink=True)
        else:
            self.output = OutputTail(pipe, sys.stderr.buffer)
        if self.self_test:
            # While this server loads its models, so the check adds little to start-up.
            try:
                selftest.ensure(install.binary, install.bundled, _self_test_server)
            except BaseException:
                self.stop()
                raise

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait for the server, then load the models (all, or load_models) one after
        another, dependencies first; raise ServeError naming the model that failed or
        did not finish loading within timeout_s, and the stage it is stuck in."""
        deadline = time.monotonic() + timeout_s
        while self.http_get("/v2/health/ready") != 200:
            self._check_running()
            if time.monotonic() >= deadline:
                raise ServeError(
                    f"tritonserver did not answer on {self.http_url} within "
                    f"{timeout_s:.0f} s{self._log_hint()}"
                )
            time.sleep(0.2)
        wanted: list[str] | tuple[str, ...] | None = self.load_models
        while wanted is None:  # every model the server finds in its repository
            index = self._repository_index()
            if index is not None:
                wanted = [m["name"] for m in index]
            elif time.monotonic() >= deadline:
                raise ServeError(
                    f"tritonserver did not list its repository within "
                    f"{timeout_s:.0f} s{self._log_hint()}"
                )
            else:
                self._check_running()
                time.sleep(0.2)
        for model in loading.load_order(wanted, loading.dependencies(self.repository)):
            self.load(model, deadline, timeout_s)

    def load(self, model: str, deadline: float, timeout_s: float) -> None:
        """Load one model through the repository API, watching the server meanwhile."""
        assert self.process is not None, "start() first"
        done: list[BaseException | None] = []
        started = time.monotonic()
        worker = threading.Thread(
            target=_load_into,
            name=f"load-{model}",
            daemon=True,
            args=(self.http_url, model, self.admin_headers, done),
        )
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
            if worker.is_alive():
                self._check_running()
            if worker.is_alive() and time.monotonic() >= deadline:
                stubs = [
                    s.pid for s in stub_processes(self.process.pid).values() if s.model == model
                ]
                lines = self.output.lines() if self.output else []
                raise ServeError(
                    f"model '{model}' did not load within the "
                    f"{timeout_s:.0f} s start-up timeout (its own load took "
                    f"{time.monotonic() - started:.0f} s of it): "
                    f"{loading.load_stage(model, lines, stubs)}"
                    f"{self._log_hint()}"
                )
        if done and done[0] is not None:
            if _refused(done[0]):
                # The server stopped listening: it is on its way out (a port another
                # process took first fails the metrics service after the models began
                # to load). Its exit says why, and start_on_free_ports retries a taken port.
                try:
                    self.process.wait(TRITON_EXIT_TIMEOUT_S + STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            self._check_running()
            raise ServeError(f"model '{model}' failed to load: {done[0]}{self._log_hint()}")

    def _check_running(self) -> None:
        assert self.process is not None, "start() first"
        code = self.process.poll()
        if code is not None:
            raise ServeError(
                f"tritonserver exited with status {code} before it was "
                f"ready{self._load_failures()}{self._log_hint()}"
            )

    def _load_failures(self) -> str:
        """The server's own account of models that failed to load, from its output."""
        if self.output is None:
            return ""
        self.output.join(2.0)  # it exited: its last lines are on their way
        lines = [
            line.split("] ", 1)[-1].strip().strip('"')[:300]
            for line in self.output.lines()
            if line.startswith("E")
            and (
                "failed to load" in line
                or "Failed to create instance" in line
                or "already in use" in line
            )
        ]
        return (": " + "; ".join(dict.fromkeys(lines))) if lines else ""

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""

    def http_get(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return None

    def _repository_index(self) -> list[dict] | None:
        """The repository index (every model and its state), or None when the server does
        not answer."""
        request = urllib.request.Request(
            self.http_url + "/v2/repository/index",
            data=b"{}",
            headers=self.admin_headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def model_states(self) -> list[dict]:
        return self._repository_index() or []

    def ready_models(self) -> set[str] | None:
        """Names of the READY models, or None when the server does not answer."""
        states = self._repository_index()
        if states is None:
            return None
        try:
            return {m["name"] for m in states if m.get("state") == "READY"}
        except (KeyError, TypeError):
            return None

    def metrics_text(self) -> str:
        """The Prometheus text of the metrics port ("" when it does not answer)."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                return r.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return ""

    def stub_models(self) -> set[str]:
        """The repository's models that run in Python-backend stubs."""
        models = set()
        for config in Path(self.repository).glob("*/config.pbtxt"):
            try:
                if runs_in_stub(config.read_text(errors="replace")):
                    models.add(config.parent.name)
            except OSError:
                continue  # being replaced (a re-render): the next check sees it
        return models

    def monitor(
        self,
        report,
        interval_s: float = WATCH_INTERVAL_S,
        restart_limit: int = RESTART_LIMIT,
        ready_timeout_s: float = 120.0,
        down: Callable[[], None] = lambda: None,
        up: Callable[[], None] = lambda: None,
        lost: Callable[[str], None] = lambda _model: None,
        hang_s: float = HANG_TIMEOUT_S,
    ) -> None:
        """Serve until tritonserver exits for good, then raise ServeError. A model whose
        stub or engine dies meanwhile is reloaded alone (keeper.py), and so is one whose
        stub hangs (no heartbeat for hang_s; 0: never judged), once it is killed. When
        tritonserver itself dies (Triton 2.51 aborts now and then when a stub dies under
        load: a boost lock_exception), it is started again in place, on the same ports and
        repository with the same admin key, with backoff, at most `restart_limit` times in
        a row (a server that served STABLE_S since its restart starts the count afresh);
        `down` runs before and `up` after each (the frontend refuses new work meanwhile);
        `lost(model)` is told of each model's death (keeper.keep_serving). `report` gets
        one line per event. The caller stops the server."""
        restarts = keeper.Restarts(limit=restart_limit)
        while True:
            code = keeper.keep_serving(self, report, interval_s, lost=lost, hang_s=hang_s)
            delay = restarts.after_death(TRITONSERVER, time.monotonic())
            if delay is None:
                raise ServeError(
                    f"tritonserver exited with status {code}"
                    + (f" (--restart-limit {restart_limit} reached)" if restart_limit else "")
                )
            report(
                f"trident serve: tritonserver exited with status {code}; every model is down: "
                f"restarting it in {delay:.0f} s (restart {restarts.counts[TRITONSERVER]} of "
                f"{restart_limit})"
            )
            down()
            self.stop()  # what is left of its process group, and its shared memory
            time.sleep(delay)
            began = time.monotonic()
            self.start()
            self.wait_ready(ready_timeout_s)
            restarts.came_back(TRITONSERVER, time.monotonic())
            up()
            report(
                f"trident serve: tritonserver is back, every model loaded (restarted in "
                f"{time.monotonic() - began:.1f} s)"
            )

    def terminate(self) -> None:
        """SIGTERM the process group now, without waiting (stop() waits, then kills);
        the shared memory its processes map is noted first, for stop() to remove."""
        if self.process is not None and self.process.poll() is None:
            self._regions = shm_regions_of_group(self.process.pid)
            _signal_group(self.process.pid, signal.SIGTERM)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL it after grace_s; remove the shared-memory
        regions this server's processes had mapped and left behind."""
        if self.process is None:
            return None
        regions = shm_regions_of_group(self.process.pid) | self._regions
        code = self.process.poll()
        if code is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                code = self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                code = self.process.wait()
        # Stubs may outlive the server by a moment; the group is ours, so finish it.
        _signal_group(self.process.pid, signal.SIGKILL)
        if self.output is not None:
            self.output.join(5.0)  # the rest of its output, up to the last line
        for name in regions:
            try:
                (SHM_DIR / name).unlink()
            except OSError:
                pass
        return code

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_on_free_ports(
    repository: Path,
    log_path: Path | None = None,
    load_models: tuple[str, ...] | None = None,
    timeout_s: float = 300.0,
    attempts: int = 3,
    **kwargs,
) -> TritonServer:
    """A ready server on free loopback ports. A free port can be taken by another process
    before the server binds it; then it starts again on new ports."""
    for attempt in range(attempts):
        server = TritonServer(
            Path(repository),
            Ports(free_port(), free_port(), free_port()),
            load_models=load_models,
            log_path=log_path,
            **kwargs,
        )
        try:
            server.start()
            server.wait_ready(timeout_s)
            return server
        except ServeError as e:
            server.stop()
            if "already in use" not in str(e) or attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _self_test_server(repository: Path, log_path: Path) -> TritonServer:
    return start_on_free_ports(repository, log_path, timeout_s=selftest.TIMEOUT_S, self_test=False)


def _refused(error: BaseException) -> bool:
    """A model-control call the server did not even accept: nothing listens any more."""
    return isinstance(getattr(error, "reason", error), ConnectionRefusedError)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _load_into(http_url: str, model: str, headers: dict, done: list) -> None:
    try:
        # No timeout of its own: the caller watches the deadline and names the stage.
        loading.request(http_url, model, "load", None, headers)
    except (loading.LoadFailed, OSError) as e:
        done.append(e)
    else:
        done.append(None)


def shm_regions_of_group(pgid: int) -> set[str]:
    """Shared-memory regions (LEAKED_SHM_PREFIXES) mapped by the processes of one group
    (a server, its stubs, vLLM's engine processes). Only these are ours to remove: other
    servers on the same machine have regions of their own."""
    regions = set()
    markers = [str(SHM_DIR / prefix) for prefix in LEAKED_SHM_PREFIXES]
    for proc in group_processes(pgid):
        try:
            maps = (proc / "maps").read_text()
        except OSError:
            continue  # it exited while we looked
        for line in maps.splitlines():
            for marker in markers:
                at = line.find(marker)
                if at >= 0:
                    # "(deleted)" follows a region already unlinked: nothing to remove.
                    regions.add(Path(line[at:].split(" ")[0]).name)
    return regions
