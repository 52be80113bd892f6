"""The doors of ``tfdist ui`` / ``tfdist server``: tried as another local user and as a page in the owner's browser."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tfdist.tracking.server_doors import DoorPolicy, ServerDoors, feature_of

from helpers.intruder import http_status
from helpers.project import tiny_params
from helpers.servers import free_ports, serving, session_commands

ASSISTANT_CONFIG = "/ajax-api/3.0/mlflow/assistant/config"
GATEWAY_SECRET = "/api/3.0/mlflow/gateway/secrets/create"
JOBS = "/ajax-api/3.0/jobs/search"
CREATE_EXPERIMENT = "/api/2.0/mlflow/experiments/create"


def call(policy: DoorPolicy, path: str, headers: dict[str, str], query: str = "") -> tuple[int, dict]:
    """One request through the doors in front of an app that answers 200: (status, response headers)."""
    answered = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        answered.append(message)

    scope = {"type": "http", "path": path, "query_string": query.encode(),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    with ThreadPoolExecutor(1) as thread:  # a loop of its own: Playwright (the session browser) holds this one
        thread.submit(asyncio.run, ServerDoors(app, policy)(scope, None, send)).result()
    start = answered[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


POLICY = DoorPolicy(hosts=frozenset({"127.0.0.1:5000", "localhost:5000"}))


@pytest.mark.parametrize("host", ["10.evil.example:5000", "192.168.1.1:5000", "127.0.0.1:5001", "", "localhost"])
def test_a_host_not_the_servers_own_is_refused(host):
    assert call(POLICY, "/", {"Host": host} if host else {})[0] == 421


@pytest.mark.parametrize("origin", ["http://localhost:8888", "http://127.0.0.1:5001", "null", "http://evil.example"])
def test_a_page_elsewhere_is_refused_even_on_localhost(origin):
    assert call(POLICY, "/api/2.0/mlflow/experiments/search", {"Host": "127.0.0.1:5000", "Origin": origin})[0] == 403


def test_the_servers_own_page_and_named_origins_pass():
    assert call(POLICY, "/", {"Host": "localhost:5000", "Origin": "http://localhost:5000"})[0] == 200
    named = DoorPolicy(hosts=POLICY.hosts, origins=frozenset({"https://board.example"}))
    assert call(named, "/", {"Host": "localhost:5000", "Origin": "https://board.example"})[0] == 200


@pytest.mark.parametrize("path, feature", [
    (ASSISTANT_CONFIG, "assistant"), ("//ajax-api/3.0/mlflow/./assistant/message", "assistant"),
    ("/prefix/ajax-api/3.0/mlflow/assistant/config", "assistant"), (GATEWAY_SECRET, "gateway"),
    ("/ajax-api/3.0/mlflow/gateway/endpoints/list", "gateway"), ("/gateway/chat/mlflow/invocations", "gateway"),
    ("/gateway", "gateway"), (JOBS, "jobs"), ("/api/2.0/mlflow/runs/search", None), ("/static-files/x.js", None),
])
def test_features_are_found_however_the_path_is_spelled(path, feature):
    assert feature_of(path) == feature


def test_closed_features_are_not_found_and_opened_ones_need_the_owners_token():
    host = {"Host": "127.0.0.1:5000"}
    assert call(POLICY, ASSISTANT_CONFIG, host)[0] == 404
    opened = DoorPolicy(hosts=POLICY.hosts, opened=frozenset({"assistant"}), token="s3cret")
    assert call(opened, ASSISTANT_CONFIG, host)[0] == 403
    assert call(opened, ASSISTANT_CONFIG, {**host, "Cookie": "tfdist-token=guess"})[0] == 403
    assert call(opened, ASSISTANT_CONFIG, {**host, "Cookie": "a=b; tfdist-token=s3cret"})[0] == 200
    assert call(opened, ASSISTANT_CONFIG, {**host, "X-Tfdist-Token": "s3cret"})[0] == 200
    assert call(opened, GATEWAY_SECRET, {**host, "X-Tfdist-Token": "s3cret"})[0] == 404, "only what was opened"
    status, headers = call(opened, "/", host, "tfdist_token=s3cret&x=1")
    assert status == 303 and headers["location"] == "/?x=1"
    assert "tfdist-token=s3cret" in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]
    assert "SameSite=Strict" in headers["set-cookie"]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """``tfdist ui --enable assistant`` on a fresh store: the owner's address (with the token) and the server."""
    from tfdist.config.params import load_config
    from tfdist.tracking import experiment

    root = tmp_path_factory.mktemp("doors")
    tiny_params(root)
    experiment.configure(load_config(root / "params.yaml").mlflow)
    (port,) = free_ports()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tfdist_cli", "ui", "--port", str(port), "--enable", "assistant"]
    with serving(command, root, url) as server:
        printed = re.search(r"http://\S+tfdist_token=[\w-]+", server.output())
        assert printed, server.output()
        yield url, printed.group(0), server, root


@pytest.mark.slow
def test_another_local_user_cannot_configure_the_assistant_or_the_gateway(ui):
    url, _, _, _ = ui
    config = json.dumps({"providers": {"claude_code": {"selected": True, "permissions": {"full_access": True}}}})
    assert http_status(url + ASSISTANT_CONFIG, method="PUT", body=config, as_nobody=True) == 403
    assert http_status(url + ASSISTANT_CONFIG, as_nobody=True) == 403
    secret = json.dumps({"secret_name": "k", "secret_value": {"api_key": "x"}, "provider": "openai"})
    assert http_status(url + GATEWAY_SECRET, method="POST", body=secret, as_nobody=True) == 404
    assert http_status(url + JOBS, as_nobody=True) == 404


@pytest.mark.slow
def test_the_owner_opens_the_assistant_with_the_printed_address(ui):
    url, printed, _, _ = ui
    token = printed.split("tfdist_token=")[1]
    assert http_status(url + ASSISTANT_CONFIG, headers={"X-Tfdist-Token": token}) == 200
    assert http_status(url + "/", headers={"Cookie": f"tfdist-token={token}"}) == 200


@pytest.mark.slow
def test_a_page_in_the_owners_browser_and_a_rebound_name_are_refused(ui):
    url, _, _, _ = ui
    body = json.dumps({"name": "planted"})
    assert http_status(url + CREATE_EXPERIMENT, method="POST", body=body, headers={"Origin": "http://localhost:8888"}) == 403
    assert http_status(url + "/api/2.0/mlflow/experiments/search?max_results=5",
                       headers={"Host": "10.evil.example", "Origin": "http://10.evil.example"}) == 421
    assert http_status(url + "/api/2.0/mlflow/experiments/search?max_results=5",
                       headers={"Host": "10.evil.example"}) == 421
    # the owner's own use still works, as the UI's page and as a client
    assert http_status(url + "/api/2.0/mlflow/experiments/search?max_results=5") == 200
    assert http_status(url.replace("127.0.0.1", "localhost") + "/") == 200


@pytest.mark.slow
def test_no_server_process_carries_the_store_on_its_command_line(ui):
    _, _, server, root = ui
    commands = session_commands(server.pid)
    assert commands and not [c for c in commands if "mlflow.db" in c or "sqlite:" in c], commands
