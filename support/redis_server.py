"""A real redis-server on a free loopback port, for the tenants' tests and bench/tenant_check.py.

Debian's `redis-server` (.ci/run installs it when missing). No persistence, nothing
written outside a temporary directory; `kill` and `start` again on the same port play
"Redis died and came back", `pause`/`resume` (SIGSTOP/SIGCONT) play "Redis is slow".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """`password`: the default user's (requirepass); `users`: ACL rules, one user each
    (Redis's `user` directive: "name on >password ~keys +commands")."""

    def __init__(self, password: str | None = None, users: tuple[str, ...] = ()):
        self.binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
        )
        if self.binary is None:
            raise RuntimeError(
                "redis-server is not installed (apt-get install -y redis-server; .ci/run does it)"
            )
        self.port, self.password, self.users = free_port(), password, users
        self.dir = tempfile.mkdtemp(prefix="trident-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--logfile",
            os.path.join(self.dir, "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        for rule in self.users:
            args += ["--user", *rule.split()]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if self.command("PING") in (b"+PONG\r\n", b"-NOAUTH Authentication required.\r\n"):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"redis-server not answering on port {self.port}")

    def command(self, *args: str) -> bytes:
        """One raw command (RESP) and its raw reply; b'' if nothing answered."""
        payload = b"*%d\r\n" % len(args) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
        )
        if self.password and args[0] != "PING":
            payload = (
                b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(self.password), self.password.encode())
            ) + payload
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(payload)
                return s.recv(65536)
        except OSError:
            return b""

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
