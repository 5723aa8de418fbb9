"""The dashboard in a real browser: jobs page, live job page, charts, markers, status changes without reload."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cli.live_service import USER_TOKEN, LiveService, minimal_recipe
from tests.dashboard.conftest import screenshot

pytestmark = pytest.mark.browser
expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright").expect

HOSTILE = '<img src=x onerror="window.__pwned=1"><b>bold</b> "quoted" & \'single\''


def open_with_token(page: Any, url: str) -> None:
    page.goto(url + ("&" if "?" in url else "?") + "token=" + USER_TOKEN)


def test_jobs_page_lists_jobs_safely_and_filters(page: Any, service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe("lora-run"), worker="gpu-box-1")
    service.metrics(attempt_id, range(12))
    hostile_id = service.submit(minimal_recipe(HOSTILE))

    open_with_token(page, service.url + "/")
    page.wait_for_selector(f'tr[data-job-id="{hostile_id}"]')

    assert "token=" not in page.url  # taken into localStorage, gone from the address bar
    running = page.locator(f'tr[data-job-id="{job_id}"]')
    cells = running.locator("td").all_inner_texts()
    assert cells[1:6] == ["running", "lora-run", "gpu-box-1", "11", "0.2500"]
    hostile = page.locator(f'tr[data-job-id="{hostile_id}"] td.name')
    assert hostile.inner_text() == HOSTILE
    assert page.locator("#jobs img, #jobs b").count() == 0
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "dashboard-jobs.png")

    # A status change shows up without a reload.
    assert service.user.post(f"/jobs/{hostile_id}/cancel").status_code == 202
    expect(page.locator(f'tr[data-job-id="{hostile_id}"] td').nth(1)).to_have_text("cancelled")

    page.select_option("#status-filter", "running")
    page.wait_for_selector(f'tr[data-job-id="{hostile_id}"]', state="detached")
    assert page.locator("#jobs tr").count() == 1

    page.select_option("#status-filter", "")
    page.fill("#name-filter", "lora")
    expect(page.locator("#jobs tr")).to_have_count(1)


def test_the_token_form_asks_again_when_the_token_is_refused(page: Any, service: LiveService) -> None:
    job_id = service.submit(minimal_recipe("after-login"))
    page.goto(service.url + "/?token=wrong")
    page.wait_for_selector("#token-form:not([hidden])")
    assert "refused the token" in page.inner_text("#token-message")

    page.fill("#token-input", USER_TOKEN)
    page.click("#token-form button")
    page.wait_for_selector(f'tr[data-job-id="{job_id}"]')
    assert page.is_hidden("#token-form")


def chart_points(page: Any, chart: str) -> int:
    return int(page.evaluate(f"window.flightdeck.charts.chart('{chart}').data[0].length"))


def test_job_page_draws_curves_and_follows_the_run_live(page: Any, service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe(HOSTILE))
    service.metrics(attempt_id, range(50))
    service.event(attempt_id, "h1", 20, "H001", "warn", "loss spiked at step 20")
    offset = service.log(attempt_id, 0, "step 0 loss 3.0\n")

    open_with_token(page, f"{service.url}/ui/jobs/{job_id}")
    page.wait_for_selector('[data-chart="loss"][data-points="50"]')

    for chart in ("loss", "learning_rate", "grad_norm", "adapter_grad_norm", "throughput"):
        assert chart_points(page, chart) == 50, chart
    page.wait_for_selector('[data-chart="loss"][data-markers="1"]')  # events come with the live stream
    assert page.locator('[data-chart="memory"] .u-over').count() == 0  # no memory metric: no empty chart
    assert page.inner_text("#job-name") == HOSTILE
    assert page.evaluate("window.__pwned") is None
    expect(page.locator("#log")).to_contain_text("step 0 loss 3.0")
    assert "loss spiked at step 20" in page.inner_text("#events")
    assert "-m flightdeck.worker.train" in page.inner_text("#plan-argv")
    assert page.inner_text("#job-status") == "running"

    # New points, a log line, a fatal event and status changes arrive without a reload.
    service.metrics(attempt_id, range(50, 60))
    service.log(attempt_id, offset, "step 59 loss 0.05\n")
    service.event(attempt_id, "g2", 55, "G002", "fatal", "adapter gradients are zero")
    page.wait_for_selector('[data-chart="loss"][data-points="60"]')
    assert chart_points(page, "loss") == 60
    page.wait_for_selector('[data-chart="loss"][data-markers="2"]')
    expect(page.locator("#log")).to_contain_text("step 59 loss 0.05")
    # data.eval's loss is drawn beside the training loss, as points joined across the steps between.
    service.metrics(attempt_id, range(60, 61), eval_loss=0.5)
    evals = "window.flightdeck.charts.chart('loss').data[2].filter((v) => v !== null).length"
    deadline = time.monotonic() + 10  # the page's CSP forbids wait_for_function's string evaluation
    while page.evaluate(evals) != 1 and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert page.evaluate(evals) == 1

    assert service.user.post(f"/jobs/{job_id}/cancel").status_code == 202
    expect(page.locator("#job-status")).to_have_text("cancelling")
    service.finish(attempt_id, status="cancelled", failure_class="cancelled", message="stopped by the user")
    expect(page.locator("#job-status")).to_have_text("cancelled")
    page.wait_for_selector("#failure:not([hidden])")
    assert "cancelled" in page.inner_text("#failure-facts")
    expect(page.locator("#live")).to_have_text("ended")
    screenshot(page, "dashboard-job.png")


def test_a_long_run_opens_downsampled(page: Any, service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe("long"))
    points = [{"step": s, "values": {"loss": 5.0 - s / 10_000}} for s in range(20_000)]
    assert service.worker.post(f"/attempts/{attempt_id}/metrics", json={"points": points}).status_code == 200

    open_with_token(page, f"{service.url}/ui/jobs/{job_id}")
    page.wait_for_selector('[data-chart="loss"]:not([data-points="0"])')
    drawn = chart_points(page, "loss")
    assert 500 <= drawn <= 1000  # one point per server-side bucket, not 20 000
    assert page.evaluate("window.flightdeck.charts.chart('loss').data[0].at(-1)") == 19_999
    assert "20000 steps, drawn as 1000 buckets" in page.inner_text("#points-note")


def test_a_queued_job_page_says_why_it_waits_and_names_the_attempts_worker(
    page: Any, service: LiveService
) -> None:
    waiting = service.submit(minimal_recipe("big", resources={"gpus_per_node": 8, "accelerator": "gpu"}))
    open_with_token(page, f"{service.url}/ui/jobs/{waiting}")
    page.wait_for_selector("#waiting:not([hidden])")
    assert "no live worker" in page.inner_text("#waiting") and "gpu x 8" in page.inner_text("#waiting")

    running, _ = service.start_job(minimal_recipe("small"), worker="named-box")
    open_with_token(page, f"{service.url}/ui/jobs/{running}")
    expect(page.locator("#attempts")).to_contain_text("named-box")
    assert page.is_hidden("#waiting")


def test_a_multi_node_job_page_lists_its_nodes(page: Any, service: LiveService) -> None:
    recipe = minimal_recipe("gang", resources={"nodes": 2, "gpus_per_node": 1, "accelerator": "cpu"})
    job_id, _, _ = service.start_gang(recipe, ("rank0-box", "rank1-box"))
    open_with_token(page, f"{service.url}/ui/jobs/{job_id}")
    page.wait_for_selector("#nodes-section:not([hidden])")
    rows = page.locator("#nodes tr")
    expect(rows).to_have_count(2)
    assert "rank0-box" in rows.nth(0).inner_text() and "rank1-box" in rows.nth(1).inner_text()
    assert "running" in rows.nth(1).inner_text()


@pytest.mark.slow  # it watches the page back off for 6.5 s
def test_a_stream_that_keeps_ending_is_retried_with_a_growing_delay(page: Any, tmp_path: Any) -> None:
    from tests.cli.live_service import live_service

    # Streams that end after 0.3 s without `end` look broken to the page: it must back off, not spin.
    with live_service(tmp_path / "short", stream_seconds=0.3) as service:
        job_id, _ = service.start_job(minimal_recipe("flaky"))
        open_with_token(page, f"{service.url}/ui/jobs/{job_id}")
        page.wait_for_selector("#job-status")
        page.wait_for_timeout(6500)
        delays = page.evaluate("window.flightdeck.followDelays")
    # Two streams (log, metrics) each: 2 s, then 4 s; without the backoff about 20 reconnects a second.
    assert 2 <= len(delays) <= 8, delays
    assert sorted(set(delays)) in ([2000], [2000, 4000]), delays


def test_a_job_ended_at_preflight_shows_its_failure_not_empty_charts_and_a_cpu_run_no_gpu_memory(
    page: Any, service: LiveService
) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe("bad-fields"))
    service.finish(
        attempt_id,
        status="failed",
        failure_class="preflight",
        failure_code="D001",
        message="preflight: D001 data.train[0].fields: fields missing from the data: question",
        fix="set the source's 'preset' or its 'fields' map",
    )
    open_with_token(page, f"{service.url}/ui/jobs/{job_id}")
    page.wait_for_selector("#charts-note:not([hidden])")
    assert "failed at host preflight" in page.inner_text("#charts-note")
    assert page.is_hidden("#charts")
    assert not any(e.is_visible() for e in page.get_by_text("no data yet").all())
    assert "D001" in page.inner_text("#failure-facts")

    # A job with curves keeps them, and a running one with none yet says "no data yet" per chart.
    running, _ = service.start_job(minimal_recipe("starting"), worker="cpu-2")
    open_with_token(page, f"{service.url}/ui/jobs/{running}")
    expect(page.locator('[data-chart="loss"]')).to_contain_text("no data yet")
    assert page.is_hidden("#charts-note")

    # The GPU memory chart shows only once a GPU held memory: a CPU run reports 0 MB, no flat zero line.
    cpu_job, cpu_attempt = service.start_job(minimal_recipe("cpu"), worker="cpu-3")
    service.metrics(cpu_attempt, range(10), gpu_memory_allocated_mb=0.0, gpu_memory_peak_mb=0.0)
    open_with_token(page, f"{service.url}/ui/jobs/{cpu_job}")
    page.wait_for_selector('[data-chart="loss"][data-points="10"]')
    assert page.is_hidden('[data-chart="memory"]')

    gpu_job, gpu_attempt = service.start_job(minimal_recipe("gpu"), worker="gpu-1")
    service.metrics(gpu_attempt, range(10), gpu_memory_allocated_mb=1200.0, gpu_memory_peak_mb=1500.0)
    open_with_token(page, f"{service.url}/ui/jobs/{gpu_job}")
    page.wait_for_selector('[data-chart="memory"][data-points="10"]')
    assert page.is_visible('[data-chart="memory"]')
