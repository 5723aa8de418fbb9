"""The rendezvous port: resolved once per attempt, on the host that listens on it (E002).

`resolve_master_port` is the one place a port is chosen: the runner calls it for a single-node
attempt and on node 0 of a gang (which reports it to the others at the start barrier); a Slurm batch
script calls it through `python -m` on the allocation's first node. Host preflight only checks a pinned
port (`port_is_free`) and reports E002; it picks nothing.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class ResolvedPort:
    """The attempt's MASTER_PORT and why it is that one; `code` E002 when a pinned port was replaced."""

    port: int
    reason: str
    code: str | None = None


def port_is_free(port: int, host: str = "") -> bool:
    """Whether a listening socket can bind `port` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = "") -> int:
    """A port the kernel reports free (bind to 0); torchrun binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def resolve_master_port(pinned: str | None) -> ResolvedPort:
    """The port this host's rendezvous listens on: the recipe's pinned one while it is free, else one the
    kernel reports free (a busy pinned port is E002: EADDRINUSE at rendezvous)."""
    if pinned is not None and port_is_free(int(pinned)):
        return ResolvedPort(int(pinned), "the recipe's MASTER_PORT, free on this host")
    port = find_free_port()
    if pinned is not None:
        return ResolvedPort(
            port, f"the recipe's MASTER_PORT {pinned} is in use on this host: a free port instead", "E002"
        )
    return ResolvedPort(port, "a port the kernel reports free on this host")


if __name__ == "__main__":
    # `python -m flightdeck.worker.host_preflight.ports`: a free port of this host (a Slurm batch script's rendezvous).
    print(resolve_master_port(None).port)
