"""SocketClient, the claim benchmark's agents' client, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from bench.harness import SocketClient


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn answers
    connections: set[int] = set()

    def do_POST(self) -> None:
        _Handler.connections.add(self.client_address[1])
        sent = self.rfile.read(int(self.headers["content-length"]))
        if self.path.startswith("/echo"):
            body = orjson.dumps(
                {"path": self.path, "auth": self.headers["authorization"], "sent": sent.decode()}
            )
            self._answer(200, body)
        elif self.path == "/empty":
            self._answer(204, b"")
        elif self.path == "/refuse":
            self._answer(422, b'{"detail":"no"}')
        elif self.path == "/close":
            self._answer(200, b"{}", close=True)
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"2\r\n{}\r\n0\r\n\r\n")

    def _answer(self, status: int, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        if status != 204:
            self.send_header("content-length", str(len(body)))
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_requests_share_one_connection_and_carry_the_body_query_and_token(server_url: str) -> None:
    _Handler.connections.clear()
    with SocketClient(server_url, {"Authorization": "Bearer a"}) as client:
        first = client.post("/echo", json={"x": 1}, params={"wait": 0})
        client.use_token("b")
        second = client.post("/echo", content=b"raw")
        assert first.status_code == 200
        assert first.json() == {"path": "/echo?wait=0", "auth": "Bearer a", "sent": '{"x":1}'}
        assert second.json()["auth"] == "Bearer b" and second.json()["sent"] == "raw"
        assert (client.post("/empty").status_code, client.post("/empty").content) == (204, b"")
        refused = client.post("/refuse")
        with pytest.raises(RuntimeError, match="POST /refuse answered 422"):
            refused.raise_for_status()
    assert len(_Handler.connections) == 1  # keep-alive: every answer was read to its end


def test_a_closed_connection_is_opened_again_for_the_next_request(server_url: str) -> None:
    _Handler.connections.clear()
    with SocketClient(server_url) as client:
        assert client.post("/close").status_code == 200
        assert client.post("/echo").status_code == 200
    assert len(_Handler.connections) == 2


def test_an_answer_it_cannot_read_is_an_error_not_a_guess(server_url: str) -> None:
    with SocketClient(server_url) as client, pytest.raises(RuntimeError, match="Content-Length"):
        client.post("/chunked")
