"""The agent's edge (worker/agent/client.py): against a real service, every answer arrives as the
contract's model; an answer that is not the contract's (another version of the service) is refused
there, naming the model, instead of failing somewhere deeper in the agent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from flightdeck.contracts import ClaimedAttempt, HeartbeatAnswer, NodeStart, Registered
from flightdeck.inventory import WorkerInventory
from flightdeck.worker.agent.client import BadAnswer, ServiceRefused, WorkerClient
from tests.reliability.conftest import served
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER_TOKEN, cpu_inventory, recipe


def test_a_real_services_answers_arrive_as_the_contracts_models(tmp_path: Path) -> None:
    with served(make_settings(tmp_path / "data")) as url:
        client = WorkerClient(url, WORKER_TOKEN)
        try:
            registered = client.register("edge-1", WorkerInventory.model_validate(cpu_inventory()))
            assert isinstance(registered, Registered) and registered.name == "edge-1"
            client.use_token(registered.token)
            submitted = httpx.post(f"{url}/jobs", json=recipe(), headers=USER)
            assert submitted.status_code == 201, submitted.text
            claimed = client.claim(str(registered.id), [0, 1], wait=0)
            assert isinstance(claimed, ClaimedAttempt)
            assert (claimed.job_id, claimed.node) == (submitted.json()["id"], None)
            assert claimed.plan["devices"] == [0, 1]
            beat = client.heartbeat(str(registered.id), [str(claimed.id)])
            assert isinstance(beat, HeartbeatAnswer) and beat.cancel == []
        finally:
            client.close()


class _OtherVersion(BaseHTTPRequestHandler):
    """A service that answers in another shape than the contract's."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/workers":
            status, body = 409, {"detail": {"status": "alive"}}
        elif self.path.endswith("/claim?wait=0"):
            status, body = 200, {"attempt": {"id": "seven", "job_id": 1, "recipe": {}, "plan": {}}}
        else:
            status, body = 200, {"start": "yes"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_version() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherVersion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_that_is_not_the_contracts_is_refused_at_the_edge_naming_the_model(
    other_version: str,
) -> None:
    client = WorkerClient(other_version, "t")
    try:
        with pytest.raises(BadAnswer, match=r"(?s)not a Claimed .*attempt\.id"):
            client.claim("1", [0], wait=0)
        with pytest.raises(BadAnswer, match=f"not a {NodeStart.__name__}"):
            client.node_ready("7", 1, None)
        # A taken name is its own refusal (409), not an attempt that stopped running.
        with pytest.raises(ServiceRefused, match="'edge-1' is taken") as refused:
            client.register("edge-1", WorkerInventory.model_validate(cpu_inventory()))
        assert refused.value.status_code == 409
    finally:
        client.close()
