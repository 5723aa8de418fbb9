// A job's live page: detail from GET /jobs/{id}, curves from the downsampled view, then live streams.
"use strict";

(() => {
  const { api, stream, el, number, age, badge, tokenGate, showError, AuthError } = Flightdeck;
  const jobId = Number(window.location.pathname.split("/").filter(Boolean).pop());
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const LIVE_POINT_LIMIT = 20000; // past this many points in the browser, fetch the downsampled view again
  const LOG_KEEP_CHARS = 200000;
  const RETRY_MS = 2000;
  const MAX_RETRY_MS = 30000;
  const HEALTHY_STREAM_MS = 5000;
  // The delays taken before each reconnect, for the browser test (and a curious reader).
  const followDelays = [];

  const charts = new JobCharts(document.getElementById("charts"));
  window.flightdeck = { charts, followDelays }; // the browser tests (and curious users) read these

  let controller = null;
  let attemptId = null;
  let lastStep = -1;
  let lastEventId = 0;
  let ended = false;
  let logText = "";
  let logOffset = 0;
  let logAttempt = null;
  let logEnded = false;
  let showTokenForm = null;
  let detailTimer = null;

  document.getElementById("job-id").textContent = "#" + jobId;

  function facts(target, pairs) {
    const list = document.getElementById(target);
    list.replaceChildren(...pairs.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
  }

  // A finding without a catalog code is a schema problem (static) or a host/run finding.
  function codeLabel(f) {
    return f.code || (f.where === "host" ? "host" : f.where === "run" ? "run" : "schema");
  }

  function renderStatus(job) {
    const status = document.getElementById("job-status");
    status.textContent = job.status;
    status.className = "badge status-" + job.status;
    document.getElementById("job-name").textContent = job.name;
    document.title = "Flightdeck: " + job.name;
    facts("job-facts", [
      ["worker", job.worker_name || "-"],
      ["steps", number(job.last_step)],
      ["latest loss", number(job.last_loss)],
      ["attempts", job.attempt_count + " / " + job.max_attempts],
      ["age", age(job.created_at)],
    ]);
    document.getElementById("cancel").hidden = TERMINAL.has(job.status) || job.status === "cancelling";
    // Why a queued job has not started (no live worker fits, or all are busy); only the detail has it.
    const waiting = document.getElementById("waiting");
    if (job.status !== "queued") waiting.hidden = true;
    else if ("waiting" in job) {
      waiting.textContent = "Waiting: " + (job.waiting || "for a worker");
      waiting.hidden = false;
    }
    charts.setEnded(TERMINAL.has(job.status) ? job : null);
    const failed = job.failure_class || job.failure_code;
    document.getElementById("failure").hidden = !failed;
    if (failed) {
      facts("failure-facts", [
        ["class", job.failure_class || "-"],
        ["code", job.failure_code || "-"],
        ["message", job.failure_message || "-"],
        ["fix", job.failure_fix || "-"],
      ]);
    }
  }

  function renderDetail(job) {
    renderStatus(job);
    document.getElementById("findings").replaceChildren(
      ...job.findings.map((f) =>
        el("tr", { className: "severity-" + f.severity },
          el("td", {}, codeLabel(f)), el("td", {}, f.severity), el("td", {}, f.path || "-"),
          el("td", {}, f.message), el("td", {}, f.fix || "-")),
      ),
    );
    document.getElementById("attempts").replaceChildren(
      ...job.attempts.map((a) =>
        el("tr", {},
          el("td", {}, a.number), el("td", {}, badge(a.status)), el("td", {}, a.worker_name || a.worker_id || "-"),
          el("td", {}, age(a.started_at) + " ago"),
          // First and last step: a retry that resumed from a checkpoint starts after it.
          el("td", {}, a.first_step == null ? "-" : a.first_step + "-" + a.last_step),
          el("td", {}, a.exit_code ?? "-"),
          el("td", {}, [a.failure_class, a.failure_code].filter(Boolean).join(" / ") || "-"),
          el("td", {}, a.message || "-")),
      ),
    );
    // A multi-node attempt: which worker runs which node rank, where, and how each node ended (a
    // single-node attempt's one node would repeat its own row).
    const nodes = job.attempts.length ? job.attempts[job.attempts.length - 1].nodes || [] : [];
    document.getElementById("nodes-section").hidden = nodes.length < 2;
    document.getElementById("nodes").replaceChildren(
      ...nodes.map((n) =>
        el("tr", {},
          el("td", {}, n.node_rank), el("td", {}, n.worker_name || n.worker_id), el("td", {}, n.address || "-"),
          el("td", {}, (n.devices || []).join(",") || "-"), el("td", {}, badge(n.status)), el("td", {}, n.message || "-")),
      ),
    );
    const plan = job.attempts.length ? job.attempts[job.attempts.length - 1].plan : null;
    document.getElementById("plan-argv").textContent = plan ? plan.argv.join(" ") : "no attempt yet";
    document.getElementById("plan-env").replaceChildren(
      ...(plan ? plan.env : []).map((v) =>
        el("tr", {}, el("td", {}, v.name), el("td", {}, v.value ?? "(chosen by the agent)"), el("td", {}, v.reason)),
      ),
    );
  }

  async function loadDetail() {
    renderDetail(await api("/jobs/" + jobId));
  }

  // Status events arrive in bursts (claim, cancel, finish): one detail read covers a burst.
  function refreshDetailSoon() {
    clearTimeout(detailTimer);
    detailTimer = setTimeout(() => loadDetail().catch(showError), 200);
  }

  function addEvents(events) {
    const body = document.getElementById("events");
    for (const event of events) {
      lastEventId = Math.max(lastEventId, event.id);
      if (event.kind === "status") {
        refreshDetailSoon();
        continue;
      }
      if (event.step !== null && event.step !== undefined) charts.addMarker(event);
      body.appendChild(
        el("tr", { className: "severity-" + event.severity, dataset: { eventId: String(event.id) } },
          el("td", {}, event.step ?? "-"), el("td", {}, event.kind), el("td", {}, event.code || "-"),
          el("td", {}, event.severity), el("td", {}, event.message), el("td", {}, event.fix || "-")),
      );
    }
  }

  function onMetricsEvent(name, data) {
    if (name === "attempt") {
      if (data.attempt_id !== attemptId) restart(); // a requeue: the new attempt's curves start over
    } else if (name === "metrics") {
      for (const point of data.points) {
        charts.addPoint(point.step, point.values);
        lastStep = Math.max(lastStep, point.step);
      }
      if (charts.size() > LIVE_POINT_LIMIT) restart();
    } else if (name === "events") {
      addEvents(data.events);
    } else if (name === "status") {
      renderStatus(data);
      refreshDetailSoon();
    } else if (name === "end") {
      ended = true;
      document.getElementById("live").textContent = "ended";
    }
  }

  function onLogEvent(name, data) {
    if (name === "log") {
      logOffset = data.next_offset;
      logText = (logText + data.text).slice(-LOG_KEEP_CHARS);
      const pre = document.getElementById("log");
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = logText;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    } else if (name === "attempt" && data.attempt_id !== logAttempt) {
      if (logText) logText += "\n--- attempt " + data.attempt_id + " ---\n";
      logAttempt = data.attempt_id;
      logOffset = 0;
    } else if (name === "end") {
      logEnded = true;
    }
  }

  // Reads a stream until done() says so; reconnects (after network errors too) with the cursors kept.
  // A stream that lived a while (the service rotates them) is reopened at once; one that failed or
  // ended at once is retried after a delay that doubles up to MAX_RETRY_MS, so a broken stream costs
  // a request every half minute, not fifty a second.
  async function follow(pathFor, onEvent, signal, done) {
    let delay = 0;
    while (!signal.aborted && !done()) {
      const opened = Date.now();
      try {
        await stream(pathFor(), onEvent, signal);
        delay = Date.now() - opened > HEALTHY_STREAM_MS ? 0 : backoff(delay);
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof AuthError) {
          showTokenForm("The service refused the token (" + error.message + "); paste a user token.");
          return;
        }
        showError(error);
        delay = backoff(delay);
      }
      followDelays.push(delay);
      if (delay) await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }

  function backoff(delay) {
    return Math.min(Math.max(delay * 2, RETRY_MS), MAX_RETRY_MS);
  }

  function restart() {
    start().catch(showError);
  }

  async function start() {
    if (controller) controller.abort();
    controller = new AbortController();
    const signal = controller.signal;
    ended = false;
    lastEventId = 0;
    logText = "";
    logOffset = 0;
    logAttempt = null;
    logEnded = false;
    document.getElementById("events").replaceChildren();
    charts.reset();
    try {
      await loadDetail();
      const curves = await api("/jobs/" + jobId + "/metrics/downsampled?buckets=1000");
      attemptId = curves.attempt_id;
      lastStep = charts.loadDownsampled(curves);
      const series = Object.values(curves.series || {});
      const total = series.reduce((n, s) => Math.max(n, s.points), 0);
      const downsampled = series.some((s) => s.bucket_width > 1);
      document.getElementById("points-note").textContent = downsampled
        ? "(" + total + " steps, drawn as " + curves.buckets + " buckets of min/max/last; newer steps live)"
        : "";
      showError(null);
    } catch (error) {
      if (error instanceof AuthError) {
        showTokenForm("The service refused the token (" + error.message + "); paste a user token.");
        return;
      }
      throw error;
    }
    document.getElementById("live").textContent = "live";
    const cursor = (id) => (id === null ? "" : "&attempt_id=" + id);
    follow(
      () => "/jobs/" + jobId + "/metrics/stream?after=" + lastStep + "&events_after=" + lastEventId + cursor(attemptId),
      onMetricsEvent,
      signal,
      () => ended,
    );
    follow(
      () => "/jobs/" + jobId + "/logs/stream?offset=" + logOffset + cursor(logAttempt),
      onLogEvent,
      signal,
      () => logEnded,
    );
  }

  document.getElementById("cancel").addEventListener("click", async () => {
    if (!window.confirm("Cancel job #" + jobId + "?")) return;
    try {
      renderStatus(await api("/jobs/" + jobId + "/cancel", { method: "POST" }));
    } catch (error) {
      showError(error);
    }
  });

  showTokenForm = tokenGate(restart);
})();
