"""Free TCP ports for MASTER_PORT (E002): the agent resolves the port only the host can know."""

from __future__ import annotations

import socket


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


if __name__ == "__main__":
    # `python -m flightdeck.worker.host_preflight.ports`: a free port of this host (a Slurm batch script's rendezvous).
    print(find_free_port())
