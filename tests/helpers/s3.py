"""A real S3 store for a test: ``tfdist s3`` (SeaweedFS) on a free loopback port, stopped after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.servers import free_ports

#: The keys the test store accepts: made up for the test, passed only through the environment.
ACCESS_KEY, SECRET_KEY = "tfdist-test-access", "tfdist-test-secret-0123456789"
#: Seconds SeaweedFS gets to serve (about 4 s here; a loaded machine gets room).
START_TIMEOUT = 90


@dataclass
class S3Store:
    """A running store: its endpoint, bucket, data folder and the environment a client of it needs."""

    endpoint: str
    bucket: str
    folder: Path
    process: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def start(self) -> None:
        """Start (or start again, on the same port and data) and wait until it serves."""
        port = int(self.endpoint.rsplit(":", 1)[1])
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfdist_cli", "s3", "--port", str(port), "--dir", str(self.folder), "--bucket", self.bucket],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        lines = []
        for line in self.process.stdout:  # the stage prints its address once the bucket exists
            lines.append(line)
            if "Ctrl-C stops it" in line:
                return
            if time.monotonic() > deadline:
                break
        self.stop()
        pytest.fail("the S3 store did not start:\n" + "".join(lines[-20:]))

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C would: the stage stops SeaweedFS and exits."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process.stdout.close()
        self.process = None


@contextlib.contextmanager
def s3_store(folder: Path, bucket: str = "tfdist") -> Iterator[S3Store]:
    """A store serving ``bucket`` from ``folder`` while the block runs."""
    (port,) = free_ports()
    store = S3Store(f"http://127.0.0.1:{port}", bucket, folder)
    store.start()
    try:
        yield store
    finally:
        store.stop()
