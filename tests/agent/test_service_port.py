"""The tests' served service (tests/agent/processes.py): a port taken between being picked and being
bound moves a first start to another port, so a busy machine does not fail an unrelated test."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from .processes import Service, free_tcp_port

pytestmark = pytest.mark.slow  # two service starts, ~10 s


def test_a_first_start_on_a_port_taken_meanwhile_moves_to_a_free_one(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_tcp_port()))
        holder.listen()
        taken = holder.getsockname()[1]
        service = Service(tmp_path / "data", taken)
        try:
            service.start()
            assert not service.url.endswith(f":{taken}")
            assert httpx.get(f"{service.url}/healthz", timeout=5).status_code == 200
            assert "address already in use" in service.log()
        finally:
            service.stop()
