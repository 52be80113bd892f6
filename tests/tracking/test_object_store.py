"""The team's object store checked in seconds: a real S3 store (SeaweedFS, ``tfdist s3``) and every way to get it wrong.

Each wrong input is one line naming the URL, never the keys, exit 2, before
any server starts or DVC moves a byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tfdist.errors import InputError
from tfdist.tracking import object_store

from helpers.intruder import http_status, readable_by_others
from helpers.s3 import ACCESS_KEY, SECRET_KEY, s3_store
from helpers.servers import free_ports

#: A check that answers in seconds, with room for a loaded machine (about 1-3 s measured here).
CHECK_BOUND = 20


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_store(tmp_path_factory.mktemp("s3")) as store:
        yield store


def run(command: list[str], cwd, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    base = {key: value for key, value in __import__("os").environ.items() if not key.startswith(("AWS_", "MLFLOW_"))}
    result = subprocess.run(command, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - started


def test_the_store_serves_its_bucket_to_its_keys(s3):
    location = object_store.parse_s3_url(f"s3://{s3.bucket}/dvc", s3.endpoint)
    object_store.check_bucket(location, "the remote", access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    s3.client().put_object(Bucket=s3.bucket, Key="probe/one", Body=b"1")
    assert "probe/one" in s3.keys("probe/")


def test_only_the_s3_port_answers_another_local_user_and_only_with_the_keys(s3):
    """SeaweedFS's master, volume server and filer (which served and overwrote objects without keys) are in a
    network of their own; its data folder is the owner's alone."""
    s3.client().put_object(Bucket=s3.bucket, Key="probe/private", Body=b"team data")
    inner = json.loads((s3.folder / "ports.json").read_text())
    for port in inner:
        assert http_status(f"http://127.0.0.1:{port}/", as_nobody=True) == 0, f"SeaweedFS's port {port} answers"
    assert http_status(f"http://127.0.0.1:{inner[4]}/buckets/{s3.bucket}/probe/private", as_nobody=True) == 0
    assert http_status(f"{s3.endpoint}/{s3.bucket}/probe/private", as_nobody=True) == 403
    assert s3.client().get_object(Bucket=s3.bucket, Key="probe/private")["Body"].read() == b"team data"
    assert not readable_by_others(s3.folder) and not readable_by_others(s3.folder / "s3.json")


def test_the_store_stopped_and_started_again_serves_what_it_held(s3):
    """``tfdist s3`` stopped (SIGTERM, killed after a few seconds) and started on the same folder: nothing is lost."""
    s3.client().put_object(Bucket=s3.bucket, Key="probe/kept", Body=b"kept" * 4096)
    s3.stop()
    s3.start()
    assert s3.client().get_object(Bucket=s3.bucket, Key="probe/kept")["Body"].read() == b"kept" * 4096


@pytest.mark.parametrize(("case", "keys", "bucket", "endpoint", "says"), [
    ("no store there", (ACCESS_KEY, SECRET_KEY), "tfdist", "dead", "no S3 store answers there; start it (tfdist s3)"),
    ("a wrong secret", (ACCESS_KEY, "not-the-secret"), "tfdist", "live", "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ("an unknown key", ("nobody", SECRET_KEY), "tfdist", "live", "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ("no such bucket", (ACCESS_KEY, SECRET_KEY), "missing-bucket", "live", "there is no bucket 'missing-bucket'"),
])
def test_a_wrong_server_artifact_store_is_one_line_naming_it_in_seconds(s3, tmp_path, case, keys, bucket, endpoint, says):
    (port,) = free_ports()
    url = s3.endpoint if endpoint == "live" else f"http://127.0.0.1:{free_ports()[0]}"
    result, seconds = run([sys.executable, "-m", "tfdist_cli", "server", "--backend-store-uri", f"sqlite:///{tmp_path}/s.db",
                           "--port", str(port), "--artifacts-destination", f"s3://{bucket}/mlflow",
                           "--s3-endpoint-url", url], tmp_path,
                          {"AWS_ACCESS_KEY_ID": keys[0], "AWS_SECRET_ACCESS_KEY": keys[1]})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: --artifacts-destination s3://{bucket}/mlflow at {url}: "), lines
    assert says in lines[0]
    assert keys[1] not in result.stderr + result.stdout
    assert seconds < CHECK_BOUND, f"{case}: {seconds:.1f} s"


def test_a_dvc_remote_with_the_wrong_keys_stops_before_dvc_naming_the_remote(s3, tmp_path):
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / ".dvc" / "config").write_text(
        f"[core]\n    remote = team\n['remote \"team\"']\n    url = s3://{s3.bucket}/dvc\n    endpointurl = {s3.endpoint}\n")
    (tmp_path / ".dvc" / "config.local").write_text(
        f"['remote \"team\"']\n    access_key_id = {ACCESS_KEY}\n    secret_access_key = wrong-local-secret\n")
    result, seconds = run([sys.executable, "-m", "tfdist_cli", "push"], tmp_path, {})
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: DVC remote team s3://{s3.bucket}/dvc at {s3.endpoint}: "), line
    assert line.endswith("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to keys the store accepts")
    assert "wrong-local-secret" not in result.stderr and seconds < CHECK_BOUND
    (tmp_path / ".dvc" / "config.local").write_text(
        f"['remote \"team\"']\n    access_key_id = {ACCESS_KEY}\n    secret_access_key = {SECRET_KEY}\n")
    result, _ = run([sys.executable, "-m", "tfdist_cli", "status"], tmp_path, {})
    assert result.returncode == 0, result.stderr  # the keys of DVC's local config reach the check and DVC alike


def test_a_remote_that_is_not_configured_or_not_s3_is_named():
    with pytest.raises(InputError, match=r"is not an S3 URL; give s3://BUCKET/PREFIX"):
        object_store.parse_s3_url("gs://bucket/x", None, "DVC remote team")
    with pytest.raises(InputError, match=r"endpoint '\*\*\*' is not an http"):
        object_store.parse_s3_url("s3://bucket/x", "***", "DVC remote team")


def test_a_store_that_answers_500_is_asked_once_not_retried():
    """One attempt means one request: botocore's ``max_attempts`` would have let it retry once (two requests)."""
    import http.server
    import threading

    requests = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            requests.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        location = object_store.parse_s3_url("s3://tfdist/dvc", f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(InputError):
            object_store.check_bucket(location, "the remote", access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    finally:
        server.shutdown()
        server.server_close()
    assert len(requests) == 1, requests
