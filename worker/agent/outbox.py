"""Run files carried by the executor, for compute nodes with no route to the service.

Many clusters let compute nodes reach only the cluster itself. There the runner on each node talks
to no one: what it would send goes into its run directory, on the filesystem the login node shares,
and the executor (on the login node, which reaches the service) carries it while the job runs:

- metrics and logs are the run directory's own files, shipped by the executor with the same
  `RunShipper` (and the same cursor, so nothing goes twice) a runner uses;
- events (host check, launch, H008) are appended to `outbox-events.jsonl`, one batch per line;
- the finish report is written to `finish-report.json` (atomically), and the executor sends it.

The attempt's lease is the executor's heartbeat (the runner renews nothing), so an attempt lives only
while its executor does; the token never reaches the nodes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from flightdeck.contracts import AttemptNotRunning, NodeStart
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.client import AttemptGone, EndReports, ServiceRefused, ServiceUnavailable
from flightdeck.worker.agent.shipping import RunShipper, ShippingRefused

EVENTS_FILE = rundir.OUTBOX_EVENTS_FILE
FINISH_FILE = rundir.OUTBOX_FINISH_FILE
_RELAYED = rundir.OUTBOX_RELAYED_FILE  # the executor's progress through one node's outbox

log = logging.getLogger("flightdeck.outbox")


class OutboxClient:
    """A runner's client on a node that cannot reach the service: writes into its run directory."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None:
        line = json.dumps({"attempt_id": attempt_id, "events": events}) + "\n"
        with open(self.run_dir / EVENTS_FILE, "a", encoding="utf-8") as out:
            out.write(line)  # one write of one line: a reader sees whole lines or none of this one

    def finish(self, attempt_id: str, report: dict[str, Any]) -> dict[str, Any]:
        rundir.write_json(self.run_dir / FINISH_FILE, {"attempt_id": attempt_id, "report": report})
        return {"job_status": "left for the executor to report"}

    def node_ready(self, attempt_id: str, node_rank: int, port: int | None) -> NodeStart:
        # Only a gang of own agents meets at the service; a scheduler's allocation starts its nodes.
        raise ServiceRefused("a runner without a route to the service joins no gang", 400)

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
        raise ServiceRefused("the executor ships this run's metrics", 400)

    def send_log(self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None) -> None:
        raise ServiceRefused("the executor ships this run's log", 400)

    def close(self) -> None:
        pass


class OutboxRelay:
    """The executor's side: carries every node's run files and outbox to the service.

    `run_dirs`: each node's run directory, node 0's first (it holds rank 0's metrics). Progress is
    kept in each run directory, so an executor restarted mid-run goes on where it stopped.
    """

    def __init__(self, run_dirs: list[Path], attempt_id: str, client: EndReports):
        self.run_dirs = run_dirs
        self.attempt_id = attempt_id
        self.client = client

    def relay(self, final: bool = False) -> None:
        """One pass: each node's new log and metrics (all, with `final`), events, and its finish."""
        for rank, run_dir in enumerate(self.run_dirs):
            if not run_dir.is_dir():
                continue  # the node's runner has not started yet
            try:
                self._relay_node(rank, run_dir, final)
            except (AttemptGone, ServiceUnavailable, ServiceRefused, ShippingRefused, OSError) as exc:
                log.warning("attempt %s: node %d's run files not relayed: %s", self.attempt_id, rank, exc)

    def reported(self) -> bool:
        """Whether a finish report was sent (by this relay, in this life or an earlier one)."""
        return any(self._progress(d).get("finished") for d in self.run_dirs if d.is_dir())

    def _relay_node(self, rank: int, run_dir: Path, final: bool) -> None:
        # As the runners ship online: node 0 everything, as the attempt's; another node its log, as its own.
        shipper = RunShipper(run_dir, self.attempt_id, self.client, node=rank or None, metrics=rank == 0)
        if final:
            shipper.drain()
        else:
            shipper.ship()
        progress = self._progress(run_dir)
        try:
            self._relay_events(run_dir, progress)
        finally:
            self._save(run_dir, progress)  # the batches sent so far are never sent again
        if not progress.get("finished") and not self.reported():
            finish = rundir.read_json(run_dir / FINISH_FILE)
            # Node 0 reports the run's end; another node only its own failure (as runners do online).
            # Another attempt's report (a run directory used again) is not this one's end.
            ours = finish is not None and str(finish.get("attempt_id")) == self.attempt_id
            if finish and ours and (rank == 0 or finish["report"].get("status") != "succeeded"):
                if rank == 0:
                    shipper.drain()  # every step before the end, as a runner ships before its finish
                try:
                    self.client.finish(self.attempt_id, finish["report"])
                except (AttemptNotRunning, ServiceRefused) as exc:  # it ended otherwise, or never will
                    log.info("attempt %s: finish not taken: %s", self.attempt_id, exc)
                progress["finished"] = True
                self._save(run_dir, progress)

    def _relay_events(self, run_dir: Path, progress: dict[str, Any]) -> None:
        """Send the outbox's whole lines past `progress["events_offset"]`, advancing it line by line."""
        offset = int(progress.get("events_offset", 0))
        try:
            with open(run_dir / EVENTS_FILE, "rb") as src:
                src.seek(offset)
                data = src.read()
        except FileNotFoundError:
            return
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                return  # still being written
            try:
                batch = json.loads(line)
            except ValueError:
                batch = None
            events = batch.get("events") if isinstance(batch, dict) else None
            if events and str(batch.get("attempt_id")) == self.attempt_id:
                self.client.send_events(self.attempt_id, events)
            offset += len(line)
            progress["events_offset"] = offset

    def _progress(self, run_dir: Path) -> dict[str, Any]:
        progress = rundir.read_json(run_dir / _RELAYED) or {}
        return progress if progress.get("attempt_id") == self.attempt_id else {"attempt_id": self.attempt_id}

    @staticmethod
    def _save(run_dir: Path, progress: dict[str, Any]) -> None:
        rundir.write_json(run_dir / _RELAYED, progress)
