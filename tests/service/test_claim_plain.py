"""The plain claim path (settings.claim_path = "plain"), on both databases: one transaction per claim,
no batcher, each job taken once however many claims arrive together."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import flightdeck.service.claims as claims
from flightdeck.service.api.app import create_app
from flightdeck.service.api.claim_plain import PlainClaims
from flightdeck.service.claims import ClaimOrder
from flightdeck.service.core.db import Database
from tests.service.conftest import make_settings
from tests.service.factories import WORKER, cpu_inventory, enrolled
from tests.service.test_claims import _jobs, _workers
from tests.service.test_worker_api import claim, submit


def test_concurrent_plain_claims_each_write_alone_and_take_each_job_once(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _jobs(database, 30)
    workers = _workers(database, 10)
    sizes: list[int] = []
    real = claims.claim_jobs

    def counted(db: Database, orders: list[ClaimOrder], lease_seconds: float, gang_wait: float) -> list[Any]:
        sizes.append(len(orders))
        return real(db, orders, lease_seconds, gang_wait)

    monkeypatch.setattr(claims, "claim_jobs", counted)  # a spy: the real claim runs

    async def claim_all() -> list[Any]:
        plain = PlainClaims(database, lease_seconds=60)
        return await asyncio.gather(*(plain.claim(ClaimOrder(workers[i % 10])) for i in range(40)))

    results = asyncio.run(claim_all())
    assert Counter(r.job_id for r in results if r is not None) == Counter(jobs)  # every job exactly once
    assert results.count(None) == 10
    assert sizes == [1] * 40  # one transaction per claim: nothing batched


def test_the_setting_puts_the_plain_path_behind_the_claim_route(tmp_path: Path, database_url: str) -> None:
    settings = make_settings(tmp_path / "data", database_url_override=database_url, claim_path="plain")
    with TestClient(create_app(settings)) as client:
        assert isinstance(client.app.state.flightdeck.claims, PlainClaims)  # type: ignore[attr-defined]
        answer = client.post("/workers", json={"name": "cpu-1", "inventory": cpu_inventory()}, headers=WORKER)
        worker_id = enrolled(answer)
        job_id = submit(client)
        attempt = claim(client, worker_id)
        assert attempt is not None and attempt["job_id"] == job_id
        assert claim(client, worker_id) is None
