"""A real two-node Slurm cluster on this machine, from Debian's packages, for the tests.

Three network namespaces joined by a bridge: `slurmctld` in one (10.236.0.10), a `slurmd` per node in
the others (n1 10.236.0.11, n2 10.236.0.12); this host keeps 10.236.0.1 on the bridge, where the
tests' service listens so that runners on the nodes reach it. Traffic stays on addresses of these
namespaces. A third node, n3 (10.236.0.13), alone in partition `gpu`, has two FAKE GPUs: GRES
`gpu:fake:2` backed by character device files made with mknod under the temporary directory (Slurm
22.05 accepts GPU GRES only with `File=`); no GPU exists behind them, so a job there is allocated
GPUs and told their numbers (CUDA_VISIBLE_DEVICES) but cannot use one. Daemons start with `nsenter --net=` (not `ip netns exec`, which remounts /sys and makes
slurmd 22.05 fail on cgroups). Every path lives under one temporary directory; `stop()` kills every
process left in the namespaces and removes them, the bridge and its links.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

# The cluster's /24 (a second checkout's tests on the same host pick another, e.g. 10.237.0). Each
# pytest-xdist worker (gw0, gw1: scripts/test.sh runs two) starts a cluster of its own and takes the
# next /24 up, since two bridges holding one address would route each other's nodes.
_BASE = os.environ.get("FLIGHTDECK_TEST_SLURM_NET", "10.236.0").rsplit(".", 1)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
NET = f"{_BASE[0]}.{int(_BASE[1]) + _WORKER}"
HOST_ADDRESS = f"{NET}.1"
CONTROLLER_ADDRESS = f"{NET}.10"
NODES = {"n1": f"{NET}.11", "n2": f"{NET}.12"}
# The node with fake GPUs, in a partition of its own: the CPU partition's tests never see a GPU.
GPU_NODES = {"n3": f"{NET}.13"}
ALL_NODES = {**NODES, **GPU_NODES}
CPUS_PER_NODE = 2
PARTITION = "debug"
GPU_PARTITION = "gpu"
FAKE_GPUS_PER_NODE = 2
FAKE_GPU_TYPE = "fake"
BINARIES = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scontrol",
    "sinfo",
    "nsenter",
    "ip",
)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"fdsb{tag}"
        self.namespaces = {"ctl": f"fds{tag}-ctl", **{n: f"fds{tag}-{n}" for n in ALL_NODES}}
        self.links = {key: f"fds{tag}{key[-1]}" for key in self.namespaces}
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.sock"
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.slurmds: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """What every Slurm client command needs."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30) -> None:
        try:
            self._network()
            self._munge()
            self._write_conf()
            self._daemon("ctl", ["slurmctld", "-D", "-f", str(self.conf)])
            for node in ALL_NODES:
                self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{HOST_ADDRESS}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        addresses = {"ctl": CONTROLLER_ADDRESS, **ALL_NODES}
        for key, namespace in self.namespaces.items():
            _run("ip", "netns", "add", namespace)
            link = self.links[key]
            _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _run("ip", "link", "set", link, "master", self.bridge, "up")
            for argv in (
                ("ip", "addr", "add", f"{addresses[key]}/24", "dev", "eth0"),
                ("ip", "link", "set", "eth0", "up"),
                ("ip", "link", "set", "lo", "up"),
            ):
                _run("ip", "netns", "exec", namespace, *argv)

    def _munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        _run("mungekey", "-c", "-k", str(key))
        proc = subprocess.Popen(
            [
                "munged",
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(munge / "munged.err", "wb"),  # noqa: SIM115 - lives as long as the daemon
        )
        self.daemons.append(proc)
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(munge / 'munged.err').read_text()}")
            time.sleep(0.05)

    def _write_conf(self) -> None:
        r = self.root
        for sub in ("state", *(f"spool/{name}" for name in ALL_NODES)):
            (r / sub).mkdir(parents=True)
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={address} CPUs={CPUS_PER_NODE} RealMemory=1000 State=UNKNOWN"
            + (f" Gres=gpu:{FAKE_GPU_TYPE}:{FAKE_GPUS_PER_NODE}" if name in GPU_NODES else "")
            for name, address in ALL_NODES.items()
        )
        # The fake GPUs' device files: NVIDIA's character device numbers (major 195, minor = index).
        (r / "dev").mkdir()
        for index in range(FAKE_GPUS_PER_NODE):
            _run("mknod", str(r / "dev" / f"nvidia{index}"), "c", "195", str(index))
        (r / "gres.conf").write_text(
            f"NodeName={','.join(GPU_NODES)} Name=gpu Type={FAKE_GPU_TYPE} "
            f"File={r / 'dev'}/nvidia[0-{FAKE_GPUS_PER_NODE - 1}]\n"
        )
        self.conf.write_text(
            f"""ClusterName=flightdeck-test
SlurmctldHost={socket.gethostname().split(".")[0]}({CONTROLLER_ADDRESS})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=0
SlurmdTimeout=20
MinJobAge=600
KillWait=5
MpiDefault=none
GresTypes=gpu
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
PartitionName={GPU_PARTITION} Nodes={",".join(GPU_NODES)} MaxTime=INFINITE State=UP
"""
        )

    def fail_node(self, node: str) -> None:
        """A node failure (power, kernel): every process on it dies at once, its slurmd first."""
        proc = self.slurmds.pop(node)
        proc.kill()
        proc.wait(10)
        for pid in self.node_pids(node):
            _kill(pid, signal.SIGKILL)

    def restart_slurmd(self, node: str, timeout: float = 60) -> None:
        """The node back (ReturnToService=2 makes it usable again), its stray job processes killed."""
        for pid in self.job_pids(node):
            _kill(pid, signal.SIGKILL)
        self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self.wait_in_service(node, timeout)

    def wait_in_service(self, node: str, timeout: float) -> None:
        """Until `node` responds and takes jobs again. Not until it is idle: a job that waited for it
        (a failed job's retry) is given it within a second of its return, often before a poll sees it
        idle (seen under load: 'n2 alloc' for the whole minute)."""
        self.wait_nodes(("idle", "alloc", "mix", "comp"), [node], timeout)

    def _daemon(self, key: str, argv: list[str]) -> None:
        log = open(self.root / f"{key}.out", "wb")  # noqa: SIM115 - lives as long as the daemon
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.namespaces[key]}", *argv],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.daemons.append(proc)
        if key in NODES:
            self.slurmds[key] = proc

    def wait_idle(self, timeout: float) -> None:
        self.wait_nodes(("idle",), list(ALL_NODES), timeout)

    def wait_nodes(self, states: tuple[str, ...], nodes: list[str], timeout: float) -> None:
        """Until each of `nodes` is in one of `states` (sinfo's short names: down, drain and fail take
        no jobs, and a trailing `*` marks a node that does not respond, so 'idle*' is not idle); at once
        with the logs if munged, slurmctld or a slurmd exited."""
        deadline = time.monotonic() + timeout
        listed = ""
        while time.monotonic() < deadline:
            for proc in (*self.daemons[:2], *self.slurmds.values()):  # munged, slurmctld, the slurmds
                if proc.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited: {proc.args}\n{self.logs()}")
            done = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True, timeout=10
            )
            listed = done.stdout
            state_of = dict(line.split(maxsplit=1) for line in listed.splitlines() if " " in line)
            if done.returncode == 0 and all(state_of.get(node) in states for node in nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"Slurm nodes {', '.join(nodes)} are not {' or '.join(states)} after {timeout} s: {listed!r}\n"
            f"{self.logs()}"
        )

    def state(self) -> str:
        """What the controller says of its nodes and queue (for a failed test's output)."""
        parts = []
        for argv in (["sinfo", "-N", "-o", "%N %T %E"], ["squeue", "-o", "%i %j %T %r %N"]):
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=10)
            parts.append(f"--- {' '.join(argv)}\n{done.stdout}{done.stderr}")
        return "\n".join(parts)

    def node_pids(self, node: str) -> list[int]:
        """Every process in a node's namespace (its slurmd among them)."""
        done = subprocess.run(
            ["ip", "netns", "pids", self.namespaces[node]], capture_output=True, text=True, timeout=10
        )
        return [int(pid) for pid in done.stdout.split()]

    def job_pids(self, node: str) -> list[int]:
        """The processes of jobs on a node: everything in its namespace except its slurmd."""
        daemons = {p.pid for p in self.daemons}
        pids = []
        for pid in self.node_pids(node):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if pid in daemons or (cmdline and cmdline[0].endswith((b"slurmd", b"nsenter"))):
                continue
            pids.append(pid)
        return pids

    def logs(self) -> str:
        parts = []
        for name in (
            "slurmctld.log",
            *(f"slurmd-{n}.log" for n in ALL_NODES),
            "ctl.out",
            *(f"{n}.out" for n in ALL_NODES),
        ):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for namespace in self.namespaces.values():
            if Path(f"/run/netns/{namespace}").exists():
                for pid in self._pids(namespace):
                    _kill(pid, signal.SIGKILL)
        for proc in self.daemons:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        for namespace in self.namespaces.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)

    @staticmethod
    def _pids(namespace: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=10)
        return [int(pid) for pid in done.stdout.split()]


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
