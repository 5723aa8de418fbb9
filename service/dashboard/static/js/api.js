// Shared by both pages: the user token, JSON calls, server-sent events read with fetch(), safe DOM building.
"use strict";

const Flightdeck = (() => {
  const TOKEN_KEY = "flightdeck.token";

  class AuthError extends Error {}

  // ?token=... is taken once into localStorage and removed from the address bar and history.
  function takeTokenFromUrl() {
    const url = new URL(window.location.href);
    const given = url.searchParams.get("token");
    if (given) {
      localStorage.setItem(TOKEN_KEY, given);
      url.searchParams.delete("token");
      history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  function token() {
    return localStorage.getItem(TOKEN_KEY) || "";
  }

  function headers(extra) {
    return Object.assign({ Authorization: "Bearer " + token() }, extra || {});
  }

  async function failure(response) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail ?? body);
    } catch (_) {
      // not JSON: keep the status text
    }
    if (response.status === 401) return new AuthError(detail);
    return new Error(response.status + ": " + detail);
  }

  async function api(path, options) {
    const opts = options || {};
    const response = await fetch(path, {
      method: opts.method || "GET",
      headers: headers(opts.body ? { "Content-Type": "application/json" } : {}),
      body: opts.body ? JSON.stringify(opts.body) : undefined,
    });
    if (!response.ok) throw await failure(response);
    return response.status === 204 ? null : response.json();
  }

  // EventSource cannot send an Authorization header, so the stream is read and parsed here.
  async function stream(path, onEvent, signal) {
    const response = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
    if (!response.ok) throw await failure(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") name = text;
          else if (field === "data") data.push(text);
        }
        if (data.length) onEvent(name, JSON.parse(data.join("\n")));
      }
    }
  }

  // Every string from the API goes in as a text node: markup in a recipe name stays text.
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "dataset") Object.assign(node.dataset, value);
      else node[key] = value;
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function number(value) {
    if (value === null || value === undefined) return "-";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return String(value);
    return Math.abs(value) >= 1e4 || Math.abs(value) < 1e-3 ? value.toExponential(3) : value.toPrecision(4);
  }

  function age(since) {
    if (!since) return "-";
    const seconds = Math.max(0, Date.now() / 1000 - since);
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (seconds >= size) return Math.floor(seconds / size) + unit;
    }
    return Math.floor(seconds) + "s";
  }

  function badge(status) {
    return el("span", { className: "badge status-" + String(status).replace(/[^a-z]/g, "") }, status);
  }

  // Shows the token form when there is no token or the service refused it; calls start() once one is set.
  function tokenGate(start, message) {
    const form = document.getElementById("token-form");
    const note = document.getElementById("token-message");
    const show = (text) => {
      note.textContent = text;
      form.hidden = false;
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const input = document.getElementById("token-input");
      localStorage.setItem(TOKEN_KEY, input.value.trim());
      input.value = "";
      form.hidden = true;
      start();
    });
    takeTokenFromUrl();
    if (!token()) show(message || "Paste a user token (FLIGHTDECK_USER_TOKENS, or <data-dir>/tokens.env).");
    else start();
    return show;
  }

  function showError(error) {
    const box = document.getElementById("error");
    box.textContent = error ? String(error.message || error) : "";
    box.hidden = !error;
  }

  return { AuthError, api, stream, el, number, age, badge, tokenGate, showError };
})();
