"""A throw-away Docker engine in a network namespace of its own, reached through slirp4netns.

dockerd's bridges, iptables rules and published ports then exist only inside that namespace, never on
the host's network; slirp4netns gives the namespace outbound access so builds reach the package
registries. Everything started here is stopped by PID (dockerd's pidfile, slirp4netns's pid, and any
process left in the namespace), so a failed test leaves nothing running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# `ip netns exec` remounts /sys, and dockerd then fails with "Devices cgroup isn't mounted"; nsenter
# enters the network namespace alone.
NETNS_DIR = Path("/run/netns")
# dockerd stops the containers it runs when it exits; it waits up to this long for them.
DOCKERD_STOP_SECONDS = 40


class EngineUnavailable(RuntimeError):
    """The host lacks what the engine needs (root, dockerd, slirp4netns, compose)."""


def missing_tools() -> list[str]:
    """What scripts/install-docker.sh installs and this module needs, where it is absent."""
    tools = ["dockerd", "docker", "slirp4netns", "nsenter", "ip", "debootstrap"]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if not missing and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode:
        missing.append("docker compose (v2 plugin)")
    return missing


@dataclass
class CommandResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> CommandResult:
        if self.returncode != 0:
            raise AssertionError(
                f"{' '.join(self.args)} exited {self.returncode}\n--- stdout\n{self.stdout[-6000:]}\n"
                f"--- stderr\n{self.stderr[-6000:]}"
            )
        return self


class DockerEngine:
    """dockerd in `netns`, with its socket, data and state under `state_dir`."""

    def __init__(self, state_dir: Path, data_root: Path, netns: str) -> None:
        self.state_dir = state_dir
        self.data_root = data_root
        self.netns = netns
        self.socket = state_dir / "docker.sock"
        self.pidfile = state_dir / "dockerd.pid"
        self.log = state_dir / "dockerd.log"
        self._slirp: subprocess.Popen[bytes] | None = None
        self._dockerd: subprocess.Popen[bytes] | None = None

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    def environment(self) -> dict[str, str]:
        """The host's environment with this engine as the docker CLI's and Compose's daemon."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("DOCKER_", "COMPOSE_"))}
        env["DOCKER_HOST"] = f"unix://{self.socket}"
        env["DOCKER_BUILDKIT"] = "1"
        # Plain progress: build logs that read well in a failure message.
        env["BUILDKIT_PROGRESS"] = "plain"
        return env

    def docker(
        self,
        *args: str,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        input_text: str | None = None,
    ) -> CommandResult:
        command = ["docker", *args]
        completed = subprocess.run(
            command,
            cwd=cwd,
            env={**self.environment(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
        )
        return CommandResult(command, completed.returncode, completed.stdout, completed.stderr)

    def in_netns(self, command: Sequence[str], timeout: float = 60) -> CommandResult:
        """A host command run inside the engine's network namespace (where published ports are)."""
        full = ["nsenter", f"--net={self.netns_path}", *command]
        completed = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
        return CommandResult(full, completed.returncode, completed.stdout, completed.stderr)

    def start(self) -> None:
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        subprocess.run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"], check=True)
        self._slirp = subprocess.Popen(
            [
                "slirp4netns",
                "--configure",
                "--disable-host-loopback",
                "--netns-type=path",
                str(self.netns_path),
                "tap0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_for(self._tap_is_up, 20, "slirp4netns did not configure tap0")
        self.data_root.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self._dockerd = subprocess.Popen(
                [
                    "nsenter",
                    f"--net={self.netns_path}",
                    "dockerd",
                    "--host",
                    f"unix://{self.socket}",
                    "--data-root",
                    str(self.data_root),
                    "--exec-root",
                    str(self.state_dir / "exec"),
                    "--pidfile",
                    str(self.pidfile),
                    "--storage-driver=overlay2",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_for(self._engine_answers, 60, f"dockerd did not answer; see {self.log}")

    def stop(self) -> None:
        """Stop dockerd (it stops its containers), then whatever is left in the namespace, then slirp4netns."""
        dockerd_pid = self._dockerd_pid()
        if dockerd_pid is not None:
            _signal(dockerd_pid, signal.SIGTERM)
            if not self._wait_dockerd_gone(dockerd_pid, DOCKERD_STOP_SECONDS):
                _signal(dockerd_pid, signal.SIGKILL)
                self._wait_dockerd_gone(dockerd_pid, 10)
        for pid in self._pids_in_netns():
            _signal(pid, signal.SIGKILL)
        if self._slirp is not None:
            self._slirp.terminate()
            try:
                self._slirp.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._slirp.kill()
                self._slirp.wait(timeout=10)
        if self.netns_path.exists():
            subprocess.run(["ip", "netns", "delete", self.netns], check=False)
        _unmount_below(self.state_dir)
        _unmount_below(self.data_root)

    def _dockerd_pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(self.pidfile.read_text().strip())
        if self._dockerd is not None and self._dockerd.poll() is None:
            return self._dockerd.pid
        return None

    def _wait_dockerd_gone(self, pid: int, seconds: float) -> bool:
        if self._dockerd is not None and self._dockerd.pid == pid:
            # Our child: reap it, or it lingers as a zombie that signal 0 still finds.
            try:
                self._dockerd.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        return _wait_gone(pid, seconds)

    def _pids_in_netns(self) -> list[int]:
        """Processes whose network namespace is the engine's (containerd and its shims, should they outlive dockerd)."""
        try:
            netns_inode = self.netns_path.stat().st_ino
        except FileNotFoundError:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if (entry / "ns" / "net").stat().st_ino == netns_inode:
                    pids.append(int(entry.name))
        return pids

    def _tap_is_up(self) -> bool:
        result = subprocess.run(
            ["ip", "netns", "exec", self.netns, "ip", "-o", "addr", "show", "tap0"], capture_output=True
        )
        return result.returncode == 0 and b"inet " in result.stdout

    def _engine_answers(self) -> bool:
        if self._dockerd is not None and self._dockerd.poll() is not None:
            raise EngineUnavailable(
                f"dockerd exited {self._dockerd.returncode}:\n{self.log.read_text()[-4000:]}"
            )
        return self.docker("version", timeout=10).returncode == 0

    @staticmethod
    def _wait_for(ready: object, seconds: float, message: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.3)
        raise EngineUnavailable(message)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _unmount_below(directory: Path) -> None:
    """Overlay and shm mounts a killed dockerd can leave under its directories."""
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount_point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], check=False)


@contextlib.contextmanager
def running_engine(data_root: Path | None = None) -> Iterator[DockerEngine]:
    """An engine for the duration of the block; its data root is removed unless the caller gave one."""
    # Short: the socket path must fit a sockaddr_un (108 bytes).
    state_dir = Path(tempfile.mkdtemp(prefix="fd-docker-", dir="/tmp"))
    own_data_root = data_root is None
    engine = DockerEngine(state_dir, data_root or state_dir / "data", netns=f"fd-docker-{os.getpid()}")
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
        if own_data_root:
            shutil.rmtree(engine.data_root, ignore_errors=True)
