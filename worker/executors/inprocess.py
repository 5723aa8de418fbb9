"""The first executor: today's behaviour, the attempt runner on a thread of the agent's process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.inventory import WorkerInventory
from worker.agent.attempt import AttemptRunner
from worker.agent.client import WorkerClient


class InProcessExecutor:
    """Runs each attempt on its own thread; its liveness is the thread's `done` event."""

    name = "inprocess"

    def __init__(
        self,
        *,
        client: WorkerClient,
        inventory: WorkerInventory,
        stop: threading.Event,
        cancel_grace: float,
        allowed_roots: tuple[Path, ...],
        scripts_dir: Path | None,
        agent_name: str,
        on_done: Callable[[], None],
    ):
        self.client, self.inventory, self.stop = client, inventory, stop
        self.cancel_grace, self.allowed_roots, self.scripts_dir = cancel_grace, allowed_roots, scripts_dir
        self.agent_name = agent_name
        self.on_done = on_done

    def submit(self, attempt: dict[str, Any]) -> AttemptRunner:
        runner = AttemptRunner(
            attempt,
            client=self.client,
            inventory=self.inventory,
            stop=self.stop,
            cancel_grace=self.cancel_grace,
            allowed_roots=self.allowed_roots,
            scripts_dir=self.scripts_dir,
            agent_name=self.agent_name,
        )

        def body() -> None:
            runner.run()
            self.on_done()

        threading.Thread(target=body, name=f"attempt-{runner.attempt_id}", daemon=True).start()
        return runner
