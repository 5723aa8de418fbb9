"""What every benchmark shares: servers on free local ports, idle waits, statistics, JSON results."""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import httpx
import orjson
import psutil
import rich.box
import rich.console
import rich.table
import typer
import urllib3

from bench.postgres_cluster import PostgresCluster
from flightdeck.worker.agent.terminate import terminate

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
T = TypeVar("T")
MLFLOW_VENV = ROOT / "bench" / ".venv-mlflow"
# The version the reference figures were measured with; pip takes the newest 3.17.x.
MLFLOW_SPEC = "mlflow==3.17.*"

# A recipe any CPU worker can claim; the service validates it but nothing here trains.
CPU_RECIPE: dict[str, Any] = {
    "name": "bench",
    "model": {"path": "models/tiny-llama"},
    "data": {"train": [{"path": "data/train.jsonl"}], "num_workers": 0},
    "env": {"TOKENIZERS_PARALLELISM": "false"},
    "resources": {"accelerator": "cpu", "gpus_per_node": 1},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process and every descendant by PID, wait, then SIGKILL what is left."""
    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    terminate(tree, grace, kill_wait=grace)


class CpuMeter:
    """CPU seconds (user + system) that processes spent between `start()` and `stop()`: the service, the
    database server (the PostgreSQL postmaster and its backends; SQLite runs inside the service), and
    this benchmark process (its client threads). Says where a closed loop's time goes on a machine
    whose cores all three share."""

    def __init__(self, service_pid: int, database_pid: int | None) -> None:
        self._pids = {"service": [service_pid], "database": [database_pid] if database_pid else []}
        self._before: dict[str, dict[int, float]] = {}
        self._bench_before = 0.0

    @staticmethod
    def _tree(pid: int) -> dict[int, float]:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        seconds = {}
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                seconds[proc.pid] = times.user + times.system
        return seconds

    def _read(self) -> dict[str, dict[int, float]]:
        return {
            name: {k: v for pid in pids for k, v in self._tree(pid).items()}
            for name, pids in self._pids.items()
        }

    def start(self) -> None:
        self._before = self._read()
        self._bench_before = time.process_time()

    def stop(self) -> dict[str, float]:
        """CPU seconds per part: a process that ended in between is not counted (a backend that closed)."""
        after = self._read()
        spent = {
            name: sum(seconds - self._before[name].get(pid, 0.0) for pid, seconds in after[name].items())
            for name in after
        }
        spent["bench"] = time.process_time() - self._bench_before
        return spent


def wait_http(url: str, timeout: float = 120.0, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; fail early if the server process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before answering {url}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def tree_cpu_percent(pid: int, window: float) -> float:
    """CPU use of a process and its descendants over `window` seconds (100 = one core)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.cpu_percent(None)
    time.sleep(window)
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.cpu_percent(None)
    return total


def wait_idle(pid: int, threshold: float = 5.0, quiet_seconds: float = 3.0, timeout: float = 180.0) -> float:
    """Wait until the process tree stays under `threshold` % CPU for `quiet_seconds`; return the wait."""
    start = time.monotonic()
    quiet_since: float | None = None
    while time.monotonic() - start < timeout:
        if tree_cpu_percent(pid, 0.5) < threshold:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_seconds:
                return time.monotonic() - start
        else:
            quiet_since = None
    raise TimeoutError(f"process {pid} did not go idle within {timeout:.0f} s")


@dataclass
class Server:
    """A server we started: its URL, its process, its log, and how to stop it."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        stop_process(self.pid)
        self.process.wait(timeout=30)


class LeanAnswer:
    """What LeanClient returns: the parts of an httpx.Response the benchmarks use."""

    def __init__(self, status_code: int, content: bytes, what: str):
        self.status_code, self.content, self._what = status_code, content, what

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"{self._what} answered {self.status_code}: {self.text[:500]}")


class _KeepAliveClient:
    """What the benchmarks' own clients share: a base URL and headers, one request form (httpx's
    keywords), answers as LeanAnswer. Subclasses send a prepared request on one kept-alive connection."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None):
        parts = urllib.parse.urlsplit(base_url)
        assert parts.hostname is not None and parts.port is not None, base_url
        self._address = (parts.hostname, parts.port)
        self._host = parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._headers = {k.lower(): v for k, v in (headers or {}).items()}

    def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> LeanAnswer:
        url = self._prefix + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        sent = {**self._headers, **{k.lower(): v for k, v in (headers or {}).items()}}
        if json is not None:
            content = orjson.dumps(json)
            sent.setdefault("content-type", "application/json")
        return self._send(method, url, sent, content or b"")

    def _send(self, method: str, url: str, headers: dict[str, str], body: bytes) -> LeanAnswer:
        raise NotImplementedError

    def use_token(self, token: str) -> None:
        self._headers["authorization"] = f"Bearer {token}"

    def get(self, path: str, **kwargs: Any) -> LeanAnswer:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> LeanAnswer:
        return self.request("POST", path, **kwargs)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class LeanClient(_KeepAliveClient):
    """A keep-alive HTTP/1.1 client on urllib3's connection pool, for the timed requests.

    Client and servers share this machine's two cores, so the client's own CPU is counted in every
    latency. httpx spends about 1 ms of CPU per request, and 4-5 ms reading a 200 KB answer (a
    10,000-step series read measured 12.0 ms p50 with httpx, 7.4 ms with a bare http.client, same
    server, same minute); urllib3's pool costs about what http.client does. Every peer is measured with
    the same client; `--client httpx` measures with httpx instead.
    """

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 300.0):
        super().__init__(base_url, headers)
        # One connection, kept alive; a request the server's idle close cut off is sent once more.
        self._pool = urllib3.HTTPConnectionPool(
            *self._address, maxsize=1, timeout=timeout, retries=urllib3.Retry(total=1, redirect=0)
        )

    def _send(self, method: str, url: str, headers: dict[str, str], body: bytes) -> LeanAnswer:
        answer = self._pool.request(method, url, body=body or None, headers=headers)
        return LeanAnswer(answer.status, answer.data, f"{method} {url}")

    def close(self) -> None:
        self._pool.close()


class SocketClient(_KeepAliveClient):
    """HTTP/1.1 keep-alive on one bare socket, for load generators that must leave the cores to the server.

    The claim benchmark runs 50 agents on the two cores the service runs on. Through LeanClient they
    spent 0.37-0.45 ms of CPU per claim, as much as half the service's own, and every core-second they
    take is one the service waits for; real agents run on their own hosts. This client writes the
    request in one send and reads the status line, Content-Length and body itself: same server, same
    requests, 10,000 claims measured 1,549-1,564 claims/s through LeanClient and 1,872-1,909 through
    this one (bench/README.md). It reads only what our service answers (a Content-Length body, or
    none); anything else is an error, not a guess.
    """

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 300.0):
        super().__init__(base_url, headers)
        self._timeout = timeout
        self._socket: socket.socket | None = None
        self._buffer = b""

    def _send(self, method: str, url: str, headers: dict[str, str], body: bytes) -> LeanAnswer:
        head = f"{method} {url} HTTP/1.1\r\nhost: {self._host}\r\ncontent-length: {len(body)}\r\n"
        message = (head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body
        what = f"{method} {url}"
        if self._socket is not None:
            try:
                self._socket.sendall(message)
                return self._answer(what)
            except _ConnectionClosed:  # the server closed the idle connection: send once more
                self.close()
        self._socket = socket.create_connection(self._address, timeout=self._timeout)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.sendall(message)
        return self._answer(what)

    def _answer(self, what: str) -> LeanAnswer:
        while b"\r\n\r\n" not in self._buffer:
            self._receive()
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        fields = {}
        for line in lines:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        if b"transfer-encoding" in fields:
            raise RuntimeError(
                f"{what}: a {fields[b'transfer-encoding']!r} answer; SocketClient reads Content-Length"
            )
        length = int(fields.get(b"content-length", b"0"))
        while len(self._buffer) < length:
            self._receive()
        content, self._buffer = self._buffer[:length], self._buffer[length:]
        if fields.get(b"connection") == b"close":
            self.close()
        return LeanAnswer(int(status_line.split(b" ", 2)[1]), content, what)

    def _receive(self) -> None:
        assert self._socket is not None
        data = self._socket.recv(65536)
        if not data:
            raise _ConnectionClosed()
        self._buffer += data

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._socket, self._buffer = None, b""


class _ConnectionClosed(ConnectionError):
    pass


HttpClient = httpx.Client | _KeepAliveClient


def http_client(base_url: str, kind: str, headers: dict[str, str] | None = None) -> HttpClient:
    """The client the timed requests go through: 'lean' (LeanClient), 'socket' (SocketClient) or 'httpx'."""
    if kind == "httpx":
        return httpx.Client(base_url=base_url, headers=headers, timeout=300.0)
    if kind == "socket":
        return SocketClient(base_url, headers)
    return LeanClient(base_url, headers)


@dataclass
class Flightdeck(Server):
    user_token: str = ""
    worker_token: str = ""

    def client(self, token: str, timeout: float = 60.0) -> httpx.Client:
        """An httpx client, for setting up (the agents and the CLI use httpx)."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    def timed_client(self, token: str, kind: str) -> HttpClient:
        """The client for the measured requests (see LeanClient)."""
        return http_client(self.url, kind, {"Authorization": f"Bearer {token}"})


def start_flightdeck(
    data_dir: Path, env: dict[str, str] | None = None, host: str = "127.0.0.1"
) -> Flightdeck:
    """`flightdeck serve` on a free port of `host` (127.0.0.1) with fresh tokens, once /healthz answers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    user, worker = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    child_env = {
        **os.environ,
        "FLIGHTDECK_USER_TOKENS": user,
        "FLIGHTDECK_WORKER_TOKENS": worker,
        **(env or {}),
    }
    log_path = data_dir / "service.log"
    argv = [
        sys.executable,
        "-c",
        "from flightdeck.cli.main import main; main()",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--log-level",
        "warning",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT)
    server = Flightdeck(f"http://{host}:{port}", process, log_path, user, worker)
    try:
        wait_http(f"{server.url}/healthz", process=process)
    except BaseException:
        server.stop()
        raise
    return server


def mlflow_bin() -> Path:
    """The mlflow command from bench/.venv-mlflow, creating that virtualenv on first use."""
    binary = MLFLOW_VENV / "bin" / "mlflow"
    if binary.exists():
        return binary
    print(f"creating {MLFLOW_VENV} with {MLFLOW_SPEC} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(MLFLOW_VENV)], check=True)
    subprocess.run([str(MLFLOW_VENV / "bin" / "pip"), "install", "-q", MLFLOW_SPEC], check=True)
    return binary


def start_mlflow(work_dir: Path) -> Server:
    """An MLflow tracking server (SQLite backend, one worker), returned only once it has gone idle."""
    binary = mlflow_bin()
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = work_dir / "mlflow.log"
    argv = [
        str(binary),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{work_dir / 'mlflow.db'}",
        "--default-artifact-root",
        str(work_dir / "artifacts"),
    ]
    env = {
        **os.environ,
        "MLFLOW_ENABLE_TELEMETRY": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work_dir)
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_http(f"{server.url}/health", timeout=180, process=process)
        # Its background job workers keep the CPU busy for a while after /health answers.
        waited = wait_idle(server.pid)
        print(f"mlflow idle after {waited:.1f} s", flush=True)
    except BaseException:
        server.stop()
        raise
    return server


class MlflowRest:
    """The MLflow tracking REST API (2.0), called with the same HTTP client as our service."""

    def __init__(self, url: str, kind: str = "lean"):
        self.http = http_client(f"{url}/api/2.0/mlflow", kind)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.http.post(
            path, content=orjson.dumps(body), headers={"content-type": "application/json"}
        )
        answer.raise_for_status()
        return dict(orjson.loads(answer.content))

    def new_run(self, name: str) -> str:
        experiment = self.post("/experiments/create", {"name": f"{name}-{secrets.token_hex(4)}"})[
            "experiment_id"
        ]
        run = self.post("/runs/create", {"experiment_id": experiment, "start_time": int(time.time() * 1000)})
        return str(run["run"]["info"]["run_id"])

    def close(self) -> None:
        self.http.close()


def mlflow_batch_body(run_id: str, first_step: int, steps: int, keys: list[str]) -> bytes:
    """A log-batch body: `steps` steps of every key (MLflow takes at most 1,000 metrics per call)."""
    stamp = int(time.time() * 1000)
    metrics = [
        {"key": key, "value": synthetic_value(step, i), "timestamp": stamp, "step": step}
        for step in range(first_step, first_step + steps)
        for i, key in enumerate(keys)
    ]
    return orjson.dumps({"run_id": run_id, "metrics": metrics})


@dataclass
class Attempt:
    """A job claimed by a registered worker: where metrics can be posted."""

    job_id: int
    attempt_id: int
    worker_id: int
    token: str  # the claiming worker's own token: only it may report on the attempt


def metric_keys(count: int) -> list[str]:
    base = [
        "loss",
        "learning_rate",
        "grad_norm",
        "adapter_grad_norm",
        "tokens_per_second",
        "samples_per_second",
        "step_time",
        "epoch",
        "gpu_memory_allocated_mb",
        "gpu_memory_peak_mb",
    ]
    return base[:count] + [f"extra_{i}" for i in range(count - len(base))]


def synthetic_value(step: int, index: int) -> float:
    """A decaying, slightly noisy curve: realistic enough that values differ step to step."""
    return (index + 1) * 2.0 / (1.0 + step * 1e-3) + ((step * 7919 + index) % 97) * 1e-4


def metrics_body(first_step: int, steps: int, keys: list[str]) -> bytes:
    """A POST /attempts/{id}/metrics body: `steps` steps, each with every key."""
    stamp = time.time()
    points = [
        {"step": step, "values": {key: synthetic_value(step, i) for i, key in enumerate(keys)}, "time": stamp}
        for step in range(first_step, first_step + steps)
    ]
    return orjson.dumps({"points": points})


def register_worker(worker: HttpClient, name: str, slots: int = 1) -> int:
    """Register with the enrolment token the client holds; the client then acts as this worker."""
    inventory = {"gpus": [], "cpu_slots": slots, "cores": os.cpu_count() or 1, "hostname": name}
    answer = worker.post("/workers", json={"name": name, "inventory": inventory})
    answer.raise_for_status()
    token = answer.json()["token"]
    if isinstance(worker, _KeepAliveClient):
        worker.use_token(token)
    else:
        worker.headers["Authorization"] = f"Bearer {token}"
    return int(answer.json()["id"])


def submit_job(user: httpx.Client, name: str = "bench") -> int:
    answer = user.post("/jobs", json={**CPU_RECIPE, "name": name})
    if answer.status_code != 201:
        raise RuntimeError(f"POST /jobs answered {answer.status_code}: {answer.text[:500]}")
    return int(answer.json()["id"])


def claimed_attempt(server: Flightdeck, name: str = "bench") -> Attempt:
    """Register a worker, submit a job and claim it through the API, as an agent would."""
    with server.client(server.user_token) as user, server.client(server.worker_token) as worker:
        worker_id = register_worker(worker, f"{name}-worker")
        job_id = submit_job(user, name)
        answer = worker.post(f"/workers/{worker_id}/claim", json={})
        if answer.status_code != 200:
            raise RuntimeError(f"claim answered {answer.status_code}: {answer.text[:500]}")
        attempt = answer.json()["attempt"]
        token = str(worker.headers["Authorization"]).removeprefix("Bearer ")
    assert attempt["job_id"] == job_id, "the claim took another job"
    return Attempt(job_id=job_id, attempt_id=int(attempt["id"]), worker_id=worker_id, token=token)


def post_metrics(worker: HttpClient, attempt_id: int, body: bytes) -> dict[str, Any]:
    answer = worker.post(
        f"/attempts/{attempt_id}/metrics", content=body, headers={"content-type": "application/json"}
    )
    answer.raise_for_status()
    return dict(answer.json())


class RssSampler:
    """Samples a process's resident memory in a thread; `peak_mb` is the largest seen."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.process = psutil.Process(pid)
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.NoSuchProcess):
                self.samples.append(self.process.memory_info().rss / 2**20)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return max(self.samples, default=0.0)


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (1-99), linear between the closest ranks (statistics.quantiles, inclusive)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and p99 of repetitions or of per-request latencies."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "p99": percentile(values, 99),
        "n": len(values),
    }


def median_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free 95 % interval (z 1.96) for the median of independent samples: the order
    statistics n/2 -+ z*sqrt(n)/2 (the binomial's normal approximation; what noisy, skewed timings need,
    where a mean's interval would assume a shape they do not have). Needs 2 values or more."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 2:
        raise ValueError(f"an interval for the median needs 2 values or more, not {n}")
    half = z * math.sqrt(n) / 2
    # Ranks n/2 - half and 1 + n/2 + half, counted from 1.
    low = max(math.floor(n / 2 - half) - 1, 0)
    high = min(math.ceil(n / 2 + half), n - 1)
    return ordered[low], ordered[high]


def ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else float("inf")


def interleaved(rounds: int, variants: Sequence[str], measure: Callable[[str], T]) -> dict[str, list[T]]:
    """`measure(variant)` for every variant once per round, `rounds` rounds; the results per variant in
    round order.

    Alternating spreads drift in a shared machine's load over every variant alike, and each round
    starts one variant later than the last, so none always runs right after the same neighbour (whose
    warm caches or leftover garbage it would inherit).
    """
    results: dict[str, list[T]] = {variant: [] for variant in variants}
    for round_index in range(rounds):
        shift = round_index % len(variants) if variants else 0
        for variant in [*variants[shift:], *variants[:shift]]:
            results[variant].append(measure(variant))
    return results


def machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


def write_results(name: str, payload: dict[str, Any], results_dir: Path) -> Path:
    """bench/results/<name>-<UTC time>.json with the machine and the command line alongside."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results_dir / f"{name}-{stamp}.json"
    document = {"benchmark": name, "date": stamp, "machine": machine(), "argv": sys.argv, **payload}
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    print(f"results: {path}", flush=True)
    return path


# The options every benchmark takes (typer), each defined once.
Reps = Annotated[int, typer.Option(help="repetitions; median, min and max are reported")]
NoMlflow = Annotated[bool, typer.Option("--no-mlflow", help="skip the MLflow comparison (the smoke test)")]
ResultsDir = Annotated[Path, typer.Option(help="where the results JSON is written")]
ClientKind = Annotated[
    Literal["lean", "socket", "httpx"],
    typer.Option(
        help="HTTP client of the timed requests, the same for every peer (see LeanClient, SocketClient)"
    ),
]
WorkDir = Annotated[Path | None, typer.Option(help="scratch space (default: a temporary one)")]
DatabasesOption = Annotated[
    str,
    typer.Option(
        "--databases",
        help="the databases the service runs on, measured in this one command: sqlite, postgres or both "
        "(a throw-away PostgreSQL cluster, bench/postgres_cluster.py)",
    ),
]
DATABASE_KINDS = ("sqlite", "postgres")


class Databases:
    """The databases a benchmark runs the service on; PostgreSQL is one throw-away cluster per command
    (fsync off, as the tests' cluster: the figures compare the service's work, not the disk's)."""

    def __init__(self, kinds: str):
        self.kinds = [k.strip() for k in kinds.split(",") if k.strip()]
        unknown = [k for k in self.kinds if k not in DATABASE_KINDS]
        if unknown or not self.kinds:
            raise typer.BadParameter(
                f"--databases: {unknown or kinds!r}; use sqlite, postgres or sqlite,postgres"
            )
        self._cluster: PostgresCluster | None = None
        self._count = 0

    def env(self, kind: str) -> dict[str, str]:
        """The service's environment for a fresh database of this kind (SQLite: its data dir's file)."""
        if kind == "sqlite":
            return {}
        if self._cluster is None:
            self._cluster = PostgresCluster().start()
        self._count += 1
        return {"DATABASE_URL": self._cluster.create_database(f"bench_{self._count}")}

    def server_pid(self, kind: str) -> int | None:
        """The PostgreSQL postmaster's pid (None for SQLite, which runs inside the service)."""
        if kind == "sqlite" or self._cluster is None:
            return None
        return int((self._cluster.data / "postmaster.pid").read_text().split()[0])

    def __enter__(self) -> Databases:
        return self

    def __exit__(self, *_: object) -> None:
        if self._cluster is not None:
            self._cluster.stop()


def run_cli(command: Callable[..., T], argv: list[str] | None, description: str | None) -> T:
    """Run one benchmark's typer command on `argv` (default: the process's) and return its result."""
    app = typer.Typer(add_completion=False, help=(description or "").splitlines()[0])
    app.command()(command)
    args = sys.argv[1:] if argv is None else argv
    return typer.main.get_command(app).main(args=args, standalone_mode=False)  # type: ignore[no-any-return]


@contextlib.contextmanager
def scratch_dir(given: Path | None, name: str) -> Iterator[Path]:
    """The scratch directory for databases and logs; a temporary one is removed afterwards."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=f"flightdeck-bench-{name}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Table:
    """Rows printed as a table at the end of a benchmark (rich)."""

    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append(tuple(c if isinstance(c, str) else f"{c:,.1f}" for c in cells))

    def print(self, header: tuple[str, ...]) -> None:
        table = rich.table.Table(*header, box=rich.box.SIMPLE)
        for column in table.columns[1:]:
            column.justify = "right"
        for row in self.rows:
            table.add_row(*row)
        rich.console.Console(width=160).print(table)
