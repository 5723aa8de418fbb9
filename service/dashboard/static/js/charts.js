// The job page's curves: one uPlot chart per group of metrics, against step, with event markers.
"use strict";

const JobCharts = (() => {
  const { el } = Flightdeck;

  const GROUPS = [
    { id: "loss", title: "loss", keys: ["loss", "eval_loss"] },
    { id: "learning_rate", title: "learning rate", keys: ["learning_rate"] },
    { id: "grad_norm", title: "grad norm", keys: ["grad_norm"] },
    { id: "adapter_grad_norm", title: "adapter grad norm", keys: ["adapter_grad_norm"] },
    // samples/s is ~100x smaller than tokens/s: it gets its own axis on the right.
    { id: "throughput", title: "throughput", keys: ["tokens_per_second", "samples_per_second"], scales: ["y", "y2"] },
    // A CPU run reports 0 MB: the chart shows only once a GPU held memory, never as a flat zero line.
    { id: "memory", title: "GPU memory (MB)", keys: ["gpu_memory_allocated_mb", "gpu_memory_peak_mb"], onlyNonZero: true },
  ];
  const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea"];
  const MARKER_COLORS = { fatal: "#b91c1c", error: "#dc2626", warn: "#d97706", fix: "#0891b2", info: "#64748b" };
  const REDRAW_MS = 250;

  // JSON has no NaN: the API sends "NaN"/"Infinity"; those become gaps in the line.
  function finite(value) {
    return typeof value === "number" && Number.isFinite(value) ? value : null;
  }

  function tick(value) {
    const size = Math.abs(value);
    if (value === 0) return "0";
    if (size < 1e-3 || size >= 1e6) return value.toExponential(1);
    return String(Number(value.toPrecision(4)));
  }

  class Chart {
    constructor(group, parent, markers) {
      this.group = group;
      this.markers = markers;
      this.rows = new Map();
      this.plot = null;
      this.body = el("div", { className: "chart-body" }, el("p", { className: "muted" }, "no data yet"));
      this.box = el(
        "figure",
        { className: "chart", dataset: { chart: group.id, points: "0", markers: "0" } },
        el("figcaption", {}, group.title),
        this.body,
      );
      this.box.hidden = Boolean(group.onlyNonZero);
      parent.appendChild(this.box);
    }

    hasNonZero() {
      for (const row of this.rows.values()) if (row.some((v) => v !== null && v !== 0)) return true;
      return false;
    }

    set(step, key, value) {
      const index = this.group.keys.indexOf(key);
      if (index < 0) return;
      let row = this.rows.get(step);
      if (!row) {
        row = new Array(this.group.keys.length).fill(null);
        this.rows.set(step, row);
      }
      row[index] = finite(value);
    }

    data() {
      const steps = [...this.rows.keys()].sort((a, b) => a - b);
      return [steps, ...this.group.keys.map((_, i) => steps.map((s) => this.rows.get(s)[i]))];
    }

    options(width) {
      const scales = this.group.scales || [];
      // Learning rates live around 1e-5: default ticks would all read "0".
      const values = (u, splits) => splits.map((v) => (v === null ? "" : tick(v)));
      // Wide enough for the longest tick label ("1.2e+6", "-0.000123"): a fixed width cut them off.
      const size = (u, labels) => 16 + 7 * Math.max(3, ...(labels || []).map((l) => String(l).length));
      const axes = [{ label: "step" }, { scale: "y", values, size }];
      if (scales.includes("y2")) axes.push({ scale: "y2", side: 1, grid: { show: false }, values, size });
      return {
        width,
        height: 220,
        scales: { x: { time: false } },
        series: [
          { label: "step" },
          ...this.group.keys.map((key, i) => ({
            label: key,
            stroke: COLORS[i % COLORS.length],
            width: 1.5,
            scale: scales[i] || "y",
            spanGaps: true, // eval_loss comes every eval_steps: join its points across the steps between
            points: { show: key === "eval_loss" },
          })),
        ],
        axes,
        plugins: [this.markerPlugin()],
      };
    }

    markerPlugin() {
      const markers = this.markers;
      return {
        hooks: {
          draw: [
            (u) => {
              const { left, top, width, height } = u.bbox;
              const ctx = u.ctx;
              for (const marker of markers) {
                const x = Math.round(u.valToPos(marker.step, "x", true));
                if (x < left || x > left + width) continue;
                ctx.save();
                ctx.strokeStyle = MARKER_COLORS[marker.severity] || MARKER_COLORS.info;
                ctx.lineWidth = 2;
                ctx.setLineDash([5, 4]);
                ctx.beginPath();
                ctx.moveTo(x, top);
                ctx.lineTo(x, top + height);
                ctx.stroke();
                ctx.restore();
              }
            },
          ],
        },
      };
    }

    draw() {
      this.box.dataset.markers = String(this.markers.length);
      if (this.group.onlyNonZero) this.box.hidden = !this.hasNonZero();
      if (!this.rows.size || this.box.hidden) return;
      const data = this.data();
      if (!this.plot) {
        this.body.replaceChildren();
        this.plot = new uPlot(this.options(Math.max(300, this.body.clientWidth || 480)), data, this.body);
      } else {
        this.plot.setData(data);
      }
      this.box.dataset.points = String(data[0].length);
    }

    resize() {
      if (this.plot) this.plot.setSize({ width: Math.max(300, this.body.clientWidth), height: 220 });
    }

    destroy() {
      if (this.plot) this.plot.destroy();
      this.box.remove();
    }
  }

  class JobCharts {
    constructor(parent) {
      this.parent = parent;
      this.markers = [];
      this.charts = [];
      this.timer = null;
      this.reset();
      window.addEventListener("resize", () => this.charts.forEach((c) => c.resize()));
    }

    reset() {
      this.charts.forEach((c) => c.destroy());
      this.markers.length = 0;
      this.endedWithout = null;
      this.charts = GROUPS.map((g) => new Chart(g, this.parent, this.markers));
      this.byId = Object.fromEntries(this.charts.map((c) => [c.group.id, c]));
      if (!this.note) {
        this.note = el("p", { className: "muted", id: "charts-note" });
        this.parent.before(this.note);
      }
      this.note.hidden = true;
    }

    // A job that ended before its first step (a preflight failure, a cancel while queued) has no
    // curves: one message in their place, not a row of empty charts saying "no data yet".
    setEnded(job) {
      if (!job) {
        this.endedWithout = null;
      } else if (job.failure_class === "preflight") {
        this.endedWithout = "No curves: the job failed at host preflight, before any step ran. The failure above says what to change.";
      } else {
        this.endedWithout = "No curves: the job " + job.status + " before its first step.";
      }
      this.schedule();
    }

    // GET /jobs/{id}/metrics/downsampled: per key, the last value of each step bucket.
    loadDownsampled(answer) {
      let last = -1;
      for (const [key, series] of Object.entries(answer.series || {})) {
        series.steps.forEach((step, i) => {
          this.charts.forEach((c) => c.set(step, key, series.last[i]));
          last = Math.max(last, step);
        });
      }
      this.schedule();
      return last;
    }

    addPoint(step, values) {
      for (const [key, value] of Object.entries(values)) this.charts.forEach((c) => c.set(step, key, value));
      this.schedule();
    }

    addMarker(event) {
      this.markers.push({ step: event.step, severity: event.severity, code: event.code });
      this.schedule();
    }

    size() {
      return Math.max(0, ...this.charts.map((c) => c.rows.size));
    }

    schedule() {
      if (this.timer) return;
      this.timer = setTimeout(() => {
        this.timer = null;
        const empty = Boolean(this.endedWithout) && this.size() === 0;
        this.note.textContent = empty ? this.endedWithout : "";
        this.note.hidden = !empty;
        this.parent.hidden = empty;
        this.charts.forEach((c) => c.draw());
      }, REDRAW_MS);
    }

    chart(id) {
      return this.byId[id] ? this.byId[id].plot : null;
    }
  }

  return JobCharts;
})();
