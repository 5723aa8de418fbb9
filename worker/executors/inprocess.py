"""The first executor: today's behaviour, the attempt runner on a thread of the agent's process."""

from __future__ import annotations

import threading

from flightdeck.contracts import ClaimedAttempt
from flightdeck.worker.agent.attempt import AttemptRunner
from flightdeck.worker.executors.base import ExecutorSetup


class InProcessExecutor:
    """Runs each attempt on its own thread; its liveness is the thread's `done` event."""

    name = "inprocess"

    def __init__(self, setup: ExecutorSetup):
        self.setup = setup
        self.on_done = setup.on_done

    def submit(self, attempt: ClaimedAttempt) -> AttemptRunner:
        setup = self.setup
        runner = AttemptRunner(
            attempt,
            client=setup.client,
            inventory=setup.inventory,
            stop=setup.stop,
            cancel_grace=setup.cancel_grace,
            allowed_roots=setup.allowed_roots,
            scripts_dir=setup.scripts_dir,
            agent_name=setup.agent_name,
        )

        def body() -> None:
            runner.run()
            self.on_done()

        threading.Thread(target=body, name=f"attempt-{runner.attempt_id}", daemon=True).start()
        return runner
