// The jobs page: a filtered table of jobs, refreshed every two seconds.
"use strict";

(() => {
  const { api, el, number, age, badge, tokenGate, showError, AuthError } = Flightdeck;
  const REFRESH_MS = 2000;
  const statusFilter = document.getElementById("status-filter");
  const nameFilter = document.getElementById("name-filter");
  let showTokenForm = null;
  let timer = null;
  let latest = [];

  function row(job) {
    const failure = [job.failure_class, job.failure_code].filter(Boolean).join(" / ");
    return el(
      "tr",
      { dataset: { jobId: String(job.id), status: job.status } },
      el("td", {}, el("a", { href: "/ui/jobs/" + job.id }, "#" + job.id)),
      el("td", {}, badge(job.status)),
      el("td", { className: "name" }, el("a", { href: "/ui/jobs/" + job.id }, job.name)),
      el("td", {}, job.worker_name || "-"),
      el("td", { className: "num" }, number(job.last_step)),
      el("td", { className: "num" }, number(job.last_loss)),
      el("td", { className: "failure" }, failure || "-"),
      el("td", { title: new Date(job.created_at * 1000).toISOString() }, age(job.created_at)),
    );
  }

  function render() {
    const needle = nameFilter.value.trim().toLowerCase();
    const shown = latest.filter((job) => !needle || job.name.toLowerCase().includes(needle));
    document.getElementById("jobs").replaceChildren(...shown.map(row));
    document.getElementById("jobs-count").textContent = shown.length + " job(s)";
  }

  async function refresh() {
    clearTimeout(timer);
    const status = statusFilter.value;
    try {
      const page = await api("/jobs?limit=200" + (status ? "&status=" + encodeURIComponent(status) : ""));
      latest = page.data;
      showError(null);
      render();
    } catch (error) {
      if (error instanceof AuthError) {
        showTokenForm("The service refused the token (" + error.message + "); paste a user token.");
        return;
      }
      showError(error);
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  statusFilter.addEventListener("change", refresh);
  nameFilter.addEventListener("input", render);
  showTokenForm = tokenGate(refresh);
})();
