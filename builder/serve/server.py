"""Start a real tritonserver on a rendered repository, wait until it is ready, stop it cleanly.

Used by `trident serve` and by the tests. The server is our child, in its own process
group (not its own session: a separate session lets Linux autogroup scheduling starve
the clients on a small machine), so one signal stops the server and its backend stubs.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import TridentError
from builder.spec import ServerSpec
from builder.serve import selftest
from builder.serve.watch import (StubWatch, group_processes, runs_in_stub, stub_processes,
                                 unhealthy_engines)

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
WATCH_INTERVAL_S = 1.0       # how often `trident serve` looks at its server's stubs
RESTART_HINT = "exiting so a supervisor can restart the server"


class ServeError(TridentError):
    """The server could not start or did not become ready; the message says why."""


@dataclass(frozen=True)
class Ports:
    http: int = ServerSpec.http_port      # the defaults are the spec's (one place)
    grpc: int = ServerSpec.grpc_port
    metrics: int = ServerSpec.metrics_port


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None   # None: the server's own default (NVIDIA's container)
    bundled: bool


def _bundled_root() -> Path | None:
    # find_spec, not import: the pytriton package itself is not used (installed --no-deps).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def find_tritonserver() -> TritonInstall:
    """tritonserver from PATH (e.g. NVIDIA's container) if present, else the bundled one."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), None, bundled=False)
    root = _bundled_root()
    if root is None:
        raise ServeError("no tritonserver on PATH and the nvidia-pytriton wheel is not "
                         "installed (run `make install`)")
    prepare_python_stub(root)
    return TritonInstall(root / "bin" / "tritonserver", root / "backends", bundled=True)


def prepare_python_stub(root: Path) -> None:
    """The bundled Python backend looks for its stub beside libtriton_python.so."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    target = root / "backends" / "python" / "triton_python_backend_stub"
    if not source.is_file():
        raise ServeError(f"the bundled Triton has no Python backend stub for Python {version}")
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        tmp = target.with_suffix(".tmp")
        shutil.copy2(source, tmp)
        os.replace(tmp, target)


def server_environment() -> dict[str, str]:
    """The stub takes its Python from PATH and needs libpython on the library path."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH"))
                                             if p)
    return env


def needs_trtllm_orchestrator(repository: Path) -> bool:
    """TRT-LLM's orchestrator mode (several TRT-LLM models or multi-GPU engines in one
    server) is rendered as an executor_worker_path parameter and needs this variable."""
    return any("executor_worker_path" in config.read_text()
               for config in repository.glob("*/config.pbtxt"))


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
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


@dataclass
class TritonServer:
    """One tritonserver process. Use as a context manager, or call start()/stop()."""

    repository: Path
    ports: Ports = field(default_factory=Ports)
    load_models: tuple[str, ...] | None = None   # explicit model control when given
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    # One string round trip through a throwaway echo model before the first start in
    # this process (selftest.py): a stub that corrupts strings fails here, not later.
    self_test: bool = True
    process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def command(self, install: TritonInstall) -> list[str]:
        cmd = [str(install.binary), f"--model-repository={Path(self.repository).absolute()}",
               f"--http-port={self.ports.http}", f"--grpc-port={self.ports.grpc}",
               f"--metrics-port={self.ports.metrics}",
               "--disable-auto-complete-config", "--exit-timeout-secs=5",
               "--log-verbose=0"]
        if install.backend_dir is not None:
            cmd.append(f"--backend-directory={install.backend_dir}")
        if install.bundled:
            # The bundled build runs on CPU machines: no pinned memory, no GPU metrics.
            cmd += ["--pinned-memory-pool-byte-size=0", "--allow-gpu-metrics=false"]
        if self.load_models is not None:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={name}" for name in self.load_models]
        return cmd + list(self.extra_args)

    def start(self) -> None:
        taken = [f"{name} port {port}" for name, port in
                 (("HTTP", self.ports.http), ("gRPC", self.ports.grpc),
                  ("metrics", self.ports.metrics)) if port_in_use(port)]
        if taken:
            raise ServeError(f"{', '.join(taken)} already in use; choose others with "
                             "--http-port/--grpc-port/--metrics-port")
        install = find_tritonserver()
        log = open(self.log_path, "ab") if self.log_path else None
        env = server_environment()
        if needs_trtllm_orchestrator(Path(self.repository)):
            env["TRTLLM_ORCHESTRATOR"] = "1"
        self.process = subprocess.Popen(
            self.command(install), env=env, process_group=0,
            stdout=log or None, stderr=subprocess.STDOUT if log else None,
            stdin=subprocess.DEVNULL)
        if log:
            log.close()
        if self.self_test:
            # While this server loads its models, so the check adds little to start-up.
            try:
                selftest.ensure(install.binary, install.bundled, _self_test_server)
            except BaseException:
                self.stop()
                raise

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServeError(f"tritonserver exited with status {code} before it was "
                                 f"ready{self._load_failures()}{self._log_hint()}")
            if self.http_get("/v2/health/ready") == 200:
                return
            time.sleep(0.2)
        raise ServeError(f"not ready after {timeout_s:.0f} s: {self.describe_models()}"
                         f"{self._log_hint()}")

    def _load_failures(self) -> str:
        """The server's own account of models that failed to load, from its log."""
        if not self.log_path or not Path(self.log_path).is_file():
            return ""
        lines = [line.split("] ", 1)[-1].strip().strip('"')[:300]
                 for line in Path(self.log_path).read_text(errors="replace").splitlines()
                 if line.startswith("E") and ("failed to load" in line
                                              or "Failed to create instance" in line
                                              or "already in use" in line)]
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
        request = urllib.request.Request(self.http_url + "/v2/repository/index",
                                         data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=2) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def model_states(self) -> list[dict]:
        return self._repository_index() or []

    def describe_models(self) -> str:
        states = self.model_states()
        if not states:
            return "the server does not answer on its HTTP port"
        waiting = [f"{m['name']} is {m.get('state', 'UNKNOWN')}"
                   + (f" ({m['reason']})" if m.get("reason") else "")
                   for m in states if m.get("state") != "READY"]
        return "; ".join(waiting) or "all models READY but the server is not"

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
                continue   # being replaced (a re-render): the next check sees it
        return models

    def monitor(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Serve until something is wrong, then raise ServeError saying what: the server
        exited, a model's stub died (2.51 never restarts it, and the model still reports
        READY), or a model's engine reports itself dead. The caller stops the server."""
        watch = StubWatch(stub_processes(self.process.pid))
        while True:
            try:
                code = self.process.wait(interval_s)
            except subprocess.TimeoutExpired:
                pass
            else:
                raise ServeError(f"tritonserver exited with status {code}")
            # Stubs first, then the index: a stub that exits between the two looks
            # READY at most once, and a death is only believed when seen twice.
            alive = stub_processes(self.process.pid)
            ready = self.ready_models()
            if ready is None:
                continue   # busy or shutting down: look again next time
            problem = watch.check(alive, ready & self.stub_models(),
                                  unhealthy_engines(self.metrics_text()))
            if problem and self.process.poll() is None:
                raise ServeError(f"tritonserver: {problem}; {RESTART_HINT}")

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after grace_s; remove the shared-memory
        regions this server's processes had mapped and left behind."""
        if self.process is None:
            return None
        regions = shm_regions_of_group(self.process.pid)
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
        for name in regions:
            try:
                (SHM_DIR / name).unlink()
            except OSError:
                pass
        return code

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_on_free_ports(repository: Path, log_path: Path | None = None,
                        load_models: tuple[str, ...] | None = None, timeout_s: float = 300.0,
                        attempts: int = 3, **kwargs) -> TritonServer:
    """A ready server on free loopback ports. A free port can be taken by another process
    before the server binds it; then it starts again on new ports."""
    for attempt in range(attempts):
        server = TritonServer(Path(repository), Ports(free_port(), free_port(), free_port()),
                              load_models=load_models, log_path=log_path, **kwargs)
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
    return start_on_free_ports(repository, log_path, timeout_s=selftest.TIMEOUT_S,
                               self_test=False)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def shm_regions_of_group(pgid: int) -> set[str]:
    """Python-backend shared-memory regions mapped by the processes of one group (a
    server and its stubs). Only these are ours to remove: other servers on the same
    machine have regions of their own."""
    regions = set()
    for proc in group_processes(pgid):
        try:
            maps = (proc / "maps").read_text()
        except OSError:
            continue   # it exited while we looked
        for line in maps.splitlines():
            marker = line.find(str(SHM_DIR / SHM_PREFIX))
            if marker >= 0:
                regions.add(Path(line[marker:].split(" ")[0]).name)
    return regions
