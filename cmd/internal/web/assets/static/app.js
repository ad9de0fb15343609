// Stepwise dashboard: the little the server-rendered pages need from a
// script. Pages refresh their [data-live] sections from the server; log in,
// log out and every operation go to the HTTP API (its CSRF token in the
// X-CSRF-Token header), and a refusal is shown in the API's own words.
"use strict";
(function () {
  const body = document.body;
  const api = body.dataset.api || "/api/v1/";

  // Timeline bars: placed from per mille offsets (no inline styles: CSP).
  function placeBars(root) {
    root.querySelectorAll(".bar[data-offset]").forEach(function (b) {
      b.style.left = Number(b.dataset.offset) / 10 + "%";
      b.style.width = Number(b.dataset.width) / 10 + "%";
    });
  }

  // Live sections: fetch the page again and swap each [data-live] section
  // by id, except one the user is in (focus, an open details, a filter).
  let timer = null;
  function schedule(ms) {
    clearTimeout(timer);
    if (ms > 0) timer = setTimeout(refresh, ms);
  }
  async function refresh() {
    const wait = Number(body.dataset.refresh || 0);
    const dialog = document.querySelector("dialog[open]");
    if (document.hidden || dialog) { schedule(wait); return; }
    let doc;
    try {
      const res = await fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html", "X-Stepwise-Refresh": "1" } });
      if (res.redirected && new URL(res.url).pathname === "/login") { location.assign(res.url); return; }
      if (!res.ok) { schedule(wait * 2); return; }
      doc = new DOMParser().parseFromString(await res.text(), "text/html");
    } catch (e) {
      schedule(wait * 2); // the server restarts: try again later
      return;
    }
    doc.querySelectorAll("[data-live][id]").forEach(function (fresh) {
      const old = document.getElementById(fresh.id);
      if (!old || old.contains(document.activeElement) || old.querySelector("details[open]")) return;
      old.replaceWith(fresh);
      placeBars(fresh);
      applyFilters(fresh);
    });
    body.dataset.refresh = doc.body.dataset.refresh || "0";
    schedule(Number(body.dataset.refresh));
  }

  // Filters: an input[data-filter] hides the rows of its table whose
  // data-key does not contain what is typed.
  function filterRows(input) {
    const table = document.querySelector(input.dataset.filter);
    if (!table) return;
    const needle = input.value.trim().toLowerCase();
    table.querySelectorAll("tbody tr[data-key]").forEach(function (tr) {
      tr.hidden = needle !== "" && !tr.dataset.key.toLowerCase().includes(needle);
    });
  }
  function applyFilters(root) {
    document.querySelectorAll("input[data-filter]").forEach(function (input) {
      if (root.querySelector(input.dataset.filter) || root.matches(input.dataset.filter)) filterRows(input);
    });
  }

  async function apiCall(method, path, payload, csrf) {
    const headers = { "Accept": "application/json" };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    if (csrf) headers["X-CSRF-Token"] = csrf;
    const res = await fetch(api + path, { method: method, credentials: "same-origin", headers: headers,
      body: payload === undefined ? undefined : JSON.stringify(payload) });
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    return { ok: res.ok, status: res.status, data: data };
  }
  function message(r) {
    if (r.data && r.data.error) return r.data.error;
    return "the server answered HTTP " + r.status + " with no explanation";
  }

  function runPath(id) {
    return id.split("/").map(encodeURIComponent).join("/");
  }

  // The operations, as the API takes them; "fields" are the form's parts
  // each shows (data-for), "force" what forcing it means.
  const ops = {
    resume: { title: "Resume", what: "Runs the run again from its checkpoints: completed steps and items are skipped, nothing applies twice. It runs in the serving process; this page follows its progress.",
      body: function (f) { return { reason: f.reason.value }; } },
    rerun: { title: "Rerun", what: "Runs the run again. From a step, it first clears that step's checkpoint and those of every step that started after it; effects that applied are not undone, and apply again.",
      force: "Force it (a succeeded or abandoned run, or cleared steps whose effects applied or whose outside calls were made: they apply, or are made, again)",
      body: function (f) { const b = { reason: f.reason.value, force: f.force.checked }; if (f.step.value) b.from_step = f.step.value; return b; } },
    recover: { title: "Recover", what: "Marks a run left running by a runner that is gone failed, so it can be resumed.",
      force: "Recover even though its lease has not expired (only if you know its runner is gone)",
      body: function (f) { return { reason: f.reason.value, force: f.force.checked }; } },
    reset: { title: "Reset a step", what: "Clears one step's checkpoint so it runs again on the next resume.",
      force: "Reset even though the step's effects applied or its outside call was made (neither is undone: they apply, or it is made, again)",
      step: function (f) { return f.step.value; },
      body: function (f) { return { reason: f.reason.value, force: f.force.checked }; } },
    resolve: { title: "Resolve an outside call", what: "Settles an outside call whose outcome is unknown: record it completed with its output, or have the next resume call again.",
      step: function (f) { return f.call.value; },
      body: function (f) { return { reason: f.reason.value, as: f.as.value, output: JSON.parse(f.output.value || "null"), replace: f.replace.checked }; } },
    abandon: { title: "Abandon", what: "Gives up on the run: run and resume refuse it unless forced.",
      body: function (f) { return { reason: f.reason.value }; } },
  };

  function setupOperations() {
    const dialog = document.getElementById("op-dialog");
    const form = document.getElementById("op-form");
    if (!dialog || !form) return;
    const errorBox = document.getElementById("op-error");
    let current = null;
    function showError(text) { errorBox.textContent = text; errorBox.hidden = false; }
    document.querySelectorAll("button[data-op]").forEach(function (btn) {
      btn.addEventListener("click", function () {
        current = btn.dataset.op;
        const op = ops[current];
        document.getElementById("op-title").textContent = op.title + " " + form.dataset.run;
        document.getElementById("op-what").textContent = op.what;
        const submit = document.getElementById("op-submit");
        submit.textContent = op.title;
        submit.classList.toggle("danger", current === "abandon");
        document.getElementById("op-force-what").textContent = op.force || "";
        form.querySelectorAll("[data-for]").forEach(function (el) {
          const show = el.dataset.for.split(" ").includes(current);
          el.hidden = !show;
          if (el.tagName === "OPTION") el.disabled = !show;
        });
        if (current !== "rerun" && form.step.selectedOptions[0] && form.step.selectedOptions[0].disabled) form.step.selectedIndex = 1;
        if (current === "rerun") form.step.value = "";
        form.force.checked = false;
        form.replace.checked = false;
        errorBox.hidden = true;
        dialog.showModal();
        form.reason.focus();
      });
    });
    form.querySelector("[data-cancel]").addEventListener("click", function () { dialog.close(); });
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      if (form.reason.value.trim() === "") { showError("Say why, for the audit trail: the reason is required."); form.reason.focus(); return; }
      const op = ops[current];
      if (op.step && !op.step(form)) {
        showError(current === "resolve" ? "No step of this run awaits a decision on an outside call: there is nothing to resolve." : "Choose the step.");
        return;
      }
      let payload;
      try { payload = ops[current].body(form); } catch (e) { showError("The output is not JSON: " + e.message); return; }
      const submit = document.getElementById("op-submit");
      submit.disabled = true;
      try {
        // The session's CSRF token, fresh: the API checks it on every write.
        const s = await apiCall("GET", "session");
        if (!s.ok) { showError(message(s)); return; }
        // POST runs/{id}/VERB, or runs/{id}/steps/{step}/VERB for a step's.
        let path = "runs/" + runPath(form.dataset.run) + "/";
        if (ops[current].step) path += "steps/" + runPath(ops[current].step(form)) + "/";
        const r = await apiCall("POST", path + current, payload, s.data && s.data.csrf_token);
        if (!r.ok) { showError(message(r)); return; }
        dialog.close();
        form.reason.value = "";
        const done = document.getElementById("op-done");
        done.textContent = ops[current].title + " accepted" + (r.data && r.data.result ? ": " + r.data.result : "") + ".";
        done.hidden = false;
        body.dataset.refresh = "1000";
        refresh();
      } catch (e) {
        showError("The server could not be reached: " + e.message);
      } finally {
        submit.disabled = false;
      }
    });
  }

  // Pausing a schedule: the schedules page's buttons open one dialog that
  // posts schedules/{name}/pause or /unpause with the reason.
  function setupPause() {
    const dialog = document.getElementById("pause-dialog");
    const form = document.getElementById("pause-form");
    if (!dialog || !form) return;
    const errorBox = document.getElementById("pause-error");
    let verb = null, name = null;
    function showError(text) { errorBox.textContent = text; errorBox.hidden = false; }
    document.querySelectorAll("button[data-pause-op]").forEach(function (btn) {
      btn.addEventListener("click", function () {
        verb = btn.dataset.pauseOp;
        name = btn.dataset.schedule;
        const title = verb === "pause" ? "Pause" : "Unpause";
        document.getElementById("pause-title").textContent = title + " schedule " + name;
        document.getElementById("pause-what").textContent = verb === "pause" ?
          "No serve sharing this store fires it until it is unpaused; runs already going are not touched. The fires that come due meanwhile are held." :
          "It fires again from its next fire. The fires the pause held are skipped, unless you ask to catch up.";
        document.getElementById("pause-catchup-field").hidden = verb !== "unpause";
        document.getElementById("pause-submit").textContent = title;
        form.catchup.checked = false;
        errorBox.hidden = true;
        dialog.showModal();
        form.reason.focus();
      });
    });
    form.querySelector("[data-cancel]").addEventListener("click", function () { dialog.close(); });
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      if (form.reason.value.trim() === "") { showError("Say why, for the audit trail: the reason is required."); form.reason.focus(); return; }
      const payload = { reason: form.reason.value };
      if (verb === "unpause" && form.catchup.checked) payload.catch_up = true;
      const submit = document.getElementById("pause-submit");
      submit.disabled = true;
      try {
        const s = await apiCall("GET", "session");
        if (!s.ok) { showError(message(s)); return; }
        const r = await apiCall("POST", "schedules/" + encodeURIComponent(name) + "/" + verb, payload, s.data && s.data.csrf_token);
        if (!r.ok) { showError(message(r)); return; }
        dialog.close();
        location.reload();
      } catch (e) {
        showError("The server could not be reached: " + e.message);
      } finally {
        submit.disabled = false;
      }
    });
  }

  // localPath is next if it is a path on this server, else "/" (as the
  // server's localPath): browsers drop tabs and newlines from a URL and
  // read "\" as "/", so those are refused, and what is left must stay on
  // this origin, starting with exactly one "/".
  function localPath(next) {
    if (typeof next !== "string" || /[\u0000-\u001f\u007f\\]/.test(next) || !next.startsWith("/") || next.startsWith("//")) return "/";
    try {
      if (new URL(next, location.origin).origin !== location.origin) return "/";
    } catch (e) {
      return "/";
    }
    return next;
  }

  function setupLogin() {
    const form = document.getElementById("login");
    if (!form) return;
    const errorBox = document.getElementById("login-error");
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      errorBox.hidden = true;
      try {
        const r = await apiCall("POST", "login", { token: form.token.value });
        if (!r.ok) { errorBox.textContent = message(r); errorBox.hidden = false; return; }
        location.assign(localPath(form.dataset.next));
      } catch (e) {
        errorBox.textContent = "The server could not be reached: " + e.message;
        errorBox.hidden = false;
      }
    });
  }

  function setupLogout() {
    document.querySelectorAll("[data-logout]").forEach(function (btn) {
      btn.addEventListener("click", async function () {
        // A cookie write like the others: it needs the session's CSRF token.
        const s = await apiCall("GET", "session");
        await apiCall("POST", "logout", undefined, s.ok && s.data ? s.data.csrf_token : undefined);
        location.assign("/login");
      });
    });
  }

  placeBars(document);
  document.querySelectorAll("input[data-filter]").forEach(function (input) {
    input.addEventListener("input", function () { filterRows(input); });
    filterRows(input);
  });
  setupOperations();
  setupPause();
  setupLogin();
  setupLogout();
  schedule(Number(body.dataset.refresh || 0));
})();
