// The sm4c inspector: one page, no build step, no library. It reads the HTTP API of `sm4c serve`
// (and /ui/api/*, /ui/events) with the bearer token kept in sessionStorage, and routes on the hash:
// #/instances?status=&definition=&state=, #/instance/ID, #/definitions, #/definition/ID[/VERSION],
// #/schedules, #/schedule/ID, #/batches[?definition=&version=&status=&state=&startedAfter=&startedBefore=&jq=],
// #/batch/ID, #/start[?definition=], #/send[?type=&source=&ext=].
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const view = $("#view");
const TOKEN_KEY = "sm4c.token";
const STATUSES = ["created", "running", "waiting", "paused", "completed", "failed", "cancelled", "timedOut"];
const FINAL = new Set(["completed", "failed", "cancelled", "timedOut"]);

// ---------------------------------------------------------------------------------------------
// Helpers

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function json(v) { return esc(JSON.stringify(v, null, 2)); }
function badge(status) { return `<span class="badge ${esc(status)}" data-status="${esc(status)}">${esc(status)}</span>`; }
function instLink(id) { return `<a href="#/instance/${encodeURIComponent(id)}">${esc(id)}</a>`; }
function when(t) { return t ? `<time datetime="${esc(t)}" title="${esc(t)}">${esc(new Date(t).toLocaleString())}</time>` : ""; }
function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
function headers(extra = {}) {
  const h = { ...extra };
  if (token()) h["Authorization"] = "Bearer " + token();
  return h;
}

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error;
    this.details = body && body.details;
  }
}

async function api(path, opts = {}) {
  let res;
  try {
    // A server without authentication takes a POST without a JSON body (cancel, resume, step)
    // only with this header, which a page of another site cannot send without asking first.
    const extra = opts.method && opts.method !== "GET" ? { "X-Sm4c-Request": "1", ...opts.headers } : opts.headers;
    res = await fetch(path, { ...opts, headers: headers(extra) });
  } catch (e) {
    throw new ApiError(0, { message: "the server does not answer (is sm4c serve running?)" });
  }
  const text = await res.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = { message: text }; }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

function banner(message, kind = "error") {
  const b = $("#banner");
  if (!message) { b.hidden = true; return; }
  b.className = "banner" + (kind === "info" ? " info" : "");
  b.textContent = message;
  b.hidden = false;
}

function explainError(e) {
  if (e.status === 401) return `${e.message}. Enter a token with the read role (operate to start, send and cancel) in the Token field above.`;
  if (e.status === 403) return `${e.message}. This token's role does not allow it.`;
  let m = e.message;
  if (e.details) m += "\n" + JSON.stringify(e.details, null, 2);
  return m;
}

function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const q = h.indexOf("?");
  const path = q < 0 ? h : h.slice(0, q);
  const params = new URLSearchParams(q < 0 ? "" : h.slice(q + 1));
  const slash = path.indexOf("/");
  const name = slash < 0 ? path : path.slice(0, slash);
  const rest = slash < 0 ? "" : decodeURIComponent(path.slice(slash + 1));
  return { name: name || "instances", rest, params };
}

// ---------------------------------------------------------------------------------------------
// Routing

let current = null; // { name, refresh(), onChanges(list) }
let renderSeq = 0;

async function route() {
  const r = parseHash();
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === r.name) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  stopTicking();
  const pages = { instances: instancesPage, instance: instancePage, definitions: definitionsPage, definition: definitionPage,
    schedules: schedulesPage, schedule: schedulePage, batches: batchesPage, batch: batchPage, start: startPage, send: sendPage };
  const page = pages[r.name] || notFoundPage;
  const seq = ++renderSeq;
  current = { name: r.name, seq };
  banner(null);
  try {
    await page(r, seq);
  } catch (e) {
    if (seq !== renderSeq) return;
    view.innerHTML = `<div class="empty">Could not show this page.</div>`;
    banner(explainError(e));
    // A page the server did not answer for (or answered 5xx, say 503 while a Kafka worker
    // restores) is drawn again when it is back (the live stream's hello on reconnecting, the
    // periodic re-read), not left broken until the user navigates.
    if (e.status === 0 || e.status >= 500) current.refresh = () => route();
  }
}

function notFoundPage() {
  view.innerHTML = `<div class="empty">No such page. <a href="#/instances">See the instances</a>.</div>`;
}

// ---------------------------------------------------------------------------------------------
// Instances

const FILTERS = ["status", "definition", "version", "state", "startedAfter", "startedBefore", "condition"];

async function instancesPage(r, seq) {
  const f = Object.fromEntries(FILTERS.map(k => [k, r.params.get(k) || ""]));
  // /ui/api/instances lists the newest first with the filters GET /instances has (status,
  // definition); the others go through /ui/api/search, which scans the list (a bounded number of
  // instances per request).
  const scan = ["version", "state", "startedAfter", "startedBefore", "condition"].some(k => f[k]);
  let defs = [];
  try { defs = (await api("/definitions")).definitions; } catch (e) { if (e.status === 401 || e.status === 0) throw e; }
  const ids = [...new Set(defs.map(d => d.id))];
  const local = t => t ? new Date(t).toISOString().slice(0, 16) : "";
  view.innerHTML = `
    <h1>Instances</h1>
    <form class="filters" id="filters" role="search">
      <div><label for="f-status">Status</label><select id="f-status">
        <option value="">any</option>${STATUSES.map(s => `<option ${s === f.status ? "selected" : ""}>${s}</option>`).join("")}
      </select></div>
      <div><label for="f-definition">Definition</label><select id="f-definition">
        <option value="">any</option>${ids.map(d => `<option ${d === f.definition ? "selected" : ""}>${esc(d)}</option>`).join("")}
      </select></div>
      <div><label for="f-version">Version</label><input id="f-version" size="6" value="${esc(f.version)}"></div>
      <div><label for="f-state">State</label><input id="f-state" size="14" value="${esc(f.state)}" placeholder="state name"></div>
      <div><label for="f-startedAfter">Started from (UTC)</label><input id="f-startedAfter" type="datetime-local" value="${esc(local(f.startedAfter))}"></div>
      <div><label for="f-startedBefore">Started before (UTC)</label><input id="f-startedBefore" type="datetime-local" value="${esc(local(f.startedBefore))}"></div>
      <div><label for="f-condition">Data matches (jq condition)</label><input id="f-condition" size="26" class="mono" value="${esc(f.condition)}" placeholder='.orderId == "A1"'></div>
      <div><button type="submit">Filter</button> <a href="#/instances">clear</a>
        <a id="act-on-these" href="#/batches?${esc(batchQuery(f))}" title="Cancel, redrive, migrate or send an event to every instance these filters match">Act on all that match…</a></div>
    </form>
    <section><div id="rows"><p class="muted">Loading…</p></div></section>`;
  const apply = () => {
    const p = new URLSearchParams();
    for (const k of FILTERS) {
      let v = $(`#f-${k}`).value;
      if (v && k.startsWith("started")) v = new Date(v + "Z").toISOString();
      if (v) p.set(k, v);
    }
    location.hash = "#/instances" + (p.toString() ? "?" + p : "");
  };
  $("#filters").addEventListener("submit", e => { e.preventDefault(); apply(); });
  $("#f-status").addEventListener("change", apply);
  $("#f-definition").addEventListener("change", apply);

  let pages = 1;
  // Reads overlap (a refresh on reconnecting, the live stream's changes): only the latest one
  // started may render, or a slow older read would put back a list without the newest rows.
  let loads = 0;
  const load = async (flash = new Set()) => {
    const mine = ++loads;
    let rows = [], next = null, before = "", scanned = 0;
    for (let i = 0; i < pages; i++) {
      const p = new URLSearchParams(scan ? {} : { limit: "100" });
      for (const k of FILTERS) if (f[k] && (scan || k === "status" || k === "definition")) p.set(k, f[k]);
      if (before) p.set("before", before);
      // Both answer the newest first.
      const page = await api((scan ? "/ui/api/search?" : "/ui/api/instances?") + p);
      rows = rows.concat(page.instances);
      scanned += page.scanned || 0;
      next = page.next;
      if (!next) break;
      before = next;
    }
    if (seq !== renderSeq || mine !== loads) return;
    const box = $("#rows");
    const more = next ? ` · <button id="more" type="button">${scan ? "Search further (older)" : "Load 100 older"}</button>` : "";
    const filtered = FILTERS.some(k => f[k]);
    if (!rows.length) {
      box.innerHTML = defs.length
        ? `<div class="empty">No instance matches${filtered ? " these filters" : " yet"}${scan ? ` (${scanned} scanned)` : ""}. <a href="#/start">Start one</a>.${more}</div>`
        : `<div class="empty">No definition is registered yet. Register one with<br><code>curl -X POST ${esc(location.origin)}/definitions -H 'Content-Type: application/json' -d @definition.json</code></div>`;
    } else {
      box.innerHTML = `<table id="instances"><thead><tr><th>Instance</th><th>Status</th><th>Definition</th><th>State</th><th>Started</th><th>Ended</th></tr></thead><tbody>
        ${rows.map(x => `<tr data-id="${esc(x.id)}" class="${flash.has(x.id) ? "changed" : ""}">
          <td>${instLink(x.id)}${x.parent ? `<div class="muted">child of ${instLink(x.parent)}</div>` : ""}</td>
          <td>${badge(x.status)}</td><td><a href="#/definition/${encodeURIComponent(x.definition)}/${encodeURIComponent(x.version)}">${esc(x.definition)}</a> <span class="muted">v${esc(x.version)}</span></td>
          <td>${esc(x.state || "")}</td><td>${when(x.startedAt)}</td><td>${when(x.endedAt)}</td></tr>`).join("")}
        </tbody></table>
        <p class="muted">${rows.length} shown${scan ? `, ${scanned} scanned` : ""}${more}</p>`;
    }
    const b = $("#more");
    if (b) b.addEventListener("click", () => { pages++; load(); });
  };
  const shown = () => load().catch(e => {
    $("#rows").innerHTML = `<div class="empty">The list could not be read.</div>`;
    banner(explainError(e));
  });
  await shown();
  current.refresh = () => load();
  current.onChanges = list => {
    if (f.definition && !list.some(c => c.definition === f.definition)) return;
    load(new Set(list.map(c => c.id)));
  };
}

// ---------------------------------------------------------------------------------------------
// An instance

async function instancePage(r, seq) {
  const id = r.rest;
  // Whether the cancel confirmation is showing: a refresh (the live stream, the periodic re-read)
  // re-renders the page and must not take the question away while the user answers it.
  let confirming = false;
  // As on the list: only the latest read started may render.
  let reads = 0;
  const render = async () => {
    const mine = ++reads;
    const v = await api("/ui/api/instance?id=" + encodeURIComponent(id));
    if (seq !== renderSeq || mine !== reads) return;
    const i = v.instance;
    const open = !FINAL.has(i.status);
    current.ended = !open && v.children.every(c => FINAL.has(c.status));
    const openDetails = new Set([...view.querySelectorAll("details[open][data-key]")].map(d => d.dataset.key));
    // The question being answered is moved into the new page as it is, not drawn again: a button
    // replaced under the pointer would lose the click.
    const asking = confirming ? view.querySelector("#cancel-box") : null;
    // The migration form being filled in is moved into the new page the same way.
    const migrating = view.querySelector("#migrate-box[open]");
    // And the redrive form.
    const redriving = view.querySelector("#redrive-box[open]");
    view.innerHTML = `
      <h1>${esc(i.id)} ${badge(i.status)}</h1>
      <section>
        <dl class="kv">
          <dt>Definition</dt><dd><a href="#/definition/${encodeURIComponent(i.definition)}/${encodeURIComponent(i.version)}">${esc(i.definition)}</a> version ${esc(i.version)}</dd>
          <dt>State</dt><dd id="current-state">${esc(i.state || "—")}</dd>
          <dt>Started</dt><dd>${when(i.startedAt)}</dd>
          ${i.endedAt ? `<dt>Ended</dt><dd>${when(i.endedAt)}</dd>` : ""}
          ${i.parent ? `<dt>Parent</dt><dd id="parent">${instLink(i.parent.instance)} <span class="muted">(operation ${esc(i.parent.operation)})</span></dd>` : ""}
          ${i.scheduled ? `<dt>Schedule</dt><dd id="scheduled"><a href="#/schedule/${encodeURIComponent(i.scheduled.schedule)}">${esc(i.scheduled.schedule)}</a>, the run for ${whenUtc(i.scheduled.nominalTime)}</dd>` : ""}
          <dt>Children</dt><dd id="children">${v.children.length ? v.children.map(c => `${instLink(c.id)} ${c.status ? badge(c.status) : ""}`).join("<br>") : `<span class="muted">none</span>`}</dd>
        </dl>
        <div class="actions" style="margin-top:10px">
          ${open ? `<a class="button" href="#/send?instance=${encodeURIComponent(i.id)}">Send an event…</a>
          <span id="cancel-box"><button type="button" id="cancel" class="danger">Cancel instance</button></span>` : ""}
        </div>
      </section>
      ${open ? `<details id="migrate-box" data-key="migrate"><summary>Move to another version…</summary>
        <form id="migrate-form" class="actions">
          <label>Version <select id="migrate-version"></select></label>
          <label>States whose names differ <input id="migrate-states" placeholder="${esc(i.state || "Old")}=New, …" size="30"></label>
          <button type="button" id="migrate-preview">Preview</button>
          <button type="button" id="migrate-go" class="danger" disabled title="Preview the move first">Move</button>
        </form>
        <div id="migrate-plan" aria-live="polite"></div></details>` : ""}
      ${i.status === "failed" || i.status === "timedOut" ? `<details id="redrive-box" data-key="redrive"><summary>Redrive…</summary>
        <p class="muted">Sends the instance back to running from where it failed, after an optional update of its data (a jq expression, e.g. <code>.card = "4242"</code>).</p>
        <form id="redrive-form" class="actions">
          <label>Update <input id="redrive-update" placeholder=".field = &quot;value&quot;" size="40" spellcheck="false"></label>
          <button type="button" id="redrive-preview">Preview</button>
          <button type="button" id="redrive-go" class="danger" disabled title="Preview the redrive first">Redrive</button>
        </form>
        <div id="redrive-plan" aria-live="polite"></div></details>` : ""}
      ${i.status === "paused" ? `<section id="paused" class="paused-banner" aria-live="polite"><h2>Paused</h2>
        <p id="paused-at">Paused ${esc(describeBreakpoint(i.pausedAt))}</p>
        <div class="actions"><button type="button" id="resume">Resume</button>
        <button type="button" id="step" title="Go on to the next breakpoint-able point and pause there">Step</button>
        <a href="#/definition/${encodeURIComponent(i.definition)}/${encodeURIComponent(i.version)}">Breakpoints…</a></div>
        <details open data-key="paused-data"><summary>Its data</summary><pre id="paused-data">${json(i.data)}</pre></details></section>` : ""}
      ${i.error ? `<section id="error"><h2>Error</h2><p><strong>${esc(i.error.kind || i.error.error || "")}</strong> ${esc(i.error.message || "")}</p><details data-key="error"><summary>details</summary><pre>${json(i.error)}</pre></details></section>` : ""}
      <div class="grid">
        <div>
          <section><h2>Diagram</h2>
            <div class="diagram-box" id="diagram">${v.diagram || `<p class="muted">The definition ${esc(i.definition)} version ${esc(i.version)} is not registered on this server.</p>`}</div>
            <div class="legend"><span><i style="background:#ffe9b8;border:2px solid #c77700"></i>current</span><span><i style="background:#e3f3e7;border:1px solid #3f9a5a"></i>visited</span><span><i style="background:#2e8b4e"></i>transition taken</span></div>
          </section>
          <section><h2>History</h2>${timeline(v)}</section>
        </div>
        <div>
          <section id="waiting" class="waiting"><h2>Waiting on</h2>${waitingPanel(i, v.waiting)}</section>
          <section><h2>Data</h2><pre id="data">${json(i.data)}</pre></section>
        </div>
      </div>`;
    for (const d of view.querySelectorAll("details[data-key]")) if (openDetails.has(d.dataset.key)) d.open = true;
    const answered = () => { confirming = false; return render(); };
    const cancel = $("#cancel");
    if (cancel && confirming && asking && asking.querySelector("#cancel-yes")) cancel.parentElement.replaceWith(asking);
    else if (cancel && confirming) confirmCancel(i.id, answered, false);
    else if (cancel) cancel.addEventListener("click", () => { confirming = true; confirmCancel(i.id, answered, true); });
    if (!cancel) confirming = false;
    const box = $("#migrate-box");
    if (box && migrating) box.replaceWith(migrating);
    else if (box) box.addEventListener("toggle", () => { if (box.open) migrationForm(i); }, { once: true });
    const rbox = $("#redrive-box");
    if (rbox && redriving) rbox.replaceWith(redriving);
    else if (rbox) redriveForm(i);
    for (const how of ["resume", "step"]) {
      const b = $("#" + how);
      if (b) b.addEventListener("click", async () => {
        b.disabled = true;
        try {
          await api("/instances/" + i.id.split("/").map(encodeURIComponent).join("/") + "/" + how, { method: "POST" });
          await render();
        } catch (e) { banner(explainError(e)); b.disabled = false; }
      });
    }
    for (const b of view.querySelectorAll("button[data-send]")) {
      b.addEventListener("click", () => { location.hash = "#/send?" + b.dataset.send; });
    }
    startTicking();
  };
  await render();
  current.refresh = render;
  current.onChanges = list => {
    if (list.some(c => c.id === id || c.id.startsWith(id + "/") || id.startsWith(c.id + "/"))) render().catch(e => banner(explainError(e)));
  };
}

// The migration form of instance `i`: the other versions of its definition, a dry run that shows
// the plan (or why it cannot move), then the move itself.
async function migrationForm(i) {
  const select = $("#migrate-version"), plan = $("#migrate-plan"), go = $("#migrate-go");
  try {
    const d = await api("/definitions/" + encodeURIComponent(i.definition));
    const others = d.versions.map(v => v.version).filter(v => v !== i.version);
    select.innerHTML = others.length ? others.map(v => `<option value="${esc(v)}">${esc(v)}</option>`).join("")
      : `<option value="">(no other version is registered)</option>`;
    if (others.includes(d.startsTake)) select.value = d.startsTake;
  } catch (e) { plan.innerHTML = `<p class="error">${esc(refusal(e))}</p>`; return; }
  const body = dryRun => {
    const states = {};
    for (const pair of $("#migrate-states").value.split(",").map(p => p.trim()).filter(Boolean)) {
      const [from, to] = pair.split("=").map(x => x.trim());
      if (from && to) states[from] = to;
    }
    return JSON.stringify({ version: select.value, states, dryRun });
  };
  const path = "/instances/" + i.id.split("/").map(encodeURIComponent).join("/") + "/migrate";
  const post = dryRun => api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: body(dryRun) });
  const describe = p => `<p id="migrate-says">From version ${esc(p.from)} state <strong>${esc(p.state)}</strong> to version ${esc(p.version)} state <strong>${esc(p.to)}</strong></p>`
    + (p.timers.length ? `<ul>${p.timers.map(t => `<li>timer <code>${esc(t.timer)}</code> ${esc(t.change)}${t.due ? " (due " + when(new Date(t.due).toISOString()) + ")" : ""}</li>`).join("")}</ul>` : "");
  const reset = () => { go.disabled = true; plan.innerHTML = ""; };
  select.addEventListener("change", reset);
  $("#migrate-states").addEventListener("input", reset);
  $("#migrate-preview").addEventListener("click", async () => {
    try {
      const v = await post(true);
      plan.innerHTML = describe(v.plan);
      go.disabled = false;
    } catch (e) {
      go.disabled = true;
      plan.innerHTML = `<p class="error" id="migrate-refused">${esc(e.code ? `${e.code}: ${e.message}` : explainError(e))}${e.details && e.details.reason ? ` <span class="muted">(${esc(e.details.reason)})</span>` : ""}</p>`;
    }
  });
  go.addEventListener("click", async () => {
    go.disabled = true;
    try {
      const v = await post(false);
      banner(`Instance ${i.id} moved to version ${v.migration.version}, state ${v.migration.to}.`, "info");
      $("#migrate-box").open = false;
      await current.refresh();
    } catch (e) { plan.innerHTML = `<p class="error" id="migrate-refused">${esc(refusal(e))}</p>`; }
  });
}

// The redrive form of failed or timed-out instance `i`: a dry run that previews the data after the
// update (or says why it cannot go on), then the redrive itself.
function redriveForm(i) {
  const plan = $("#redrive-plan"), go = $("#redrive-go"), update = $("#redrive-update");
  const path = "/instances/" + i.id.split("/").map(encodeURIComponent).join("/") + "/redrive";
  const body = dryRun => JSON.stringify(update.value.trim() ? { update: update.value, dryRun } : { dryRun });
  const post = dryRun => api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: body(dryRun) });
  const patch = op => `<li><code>${esc(op.op)} ${esc(op.path)}</code>${"value" in op ? " " + esc(JSON.stringify(op.value)) : ""}</li>`;
  const refused = e => `<p class="error" id="redrive-refused">${esc(e.code ? `${e.code}: ${e.message}` : explainError(e))}${e.details && e.details.reason ? ` <span class="muted">(${esc(e.details.reason)})</span>` : ""}</p>`;
  update.addEventListener("input", () => { go.disabled = true; plan.innerHTML = ""; });
  $("#redrive-preview").addEventListener("click", async () => {
    try {
      const r = (await post(true)).redrive;
      plan.innerHTML = `<p id="redrive-says">Goes on from ${esc(r.from)} (redrive ${esc(String(r.redrives))})</p>`
        + (r.diff.length ? `<ul id="redrive-diff">${r.diff.map(patch).join("")}</ul>` : `<p class="muted">The data stays as it is.</p>`)
        + `<details open><summary>The data after the update</summary><pre id="redrive-data">${json(r.data)}</pre></details>`;
      go.disabled = false;
    } catch (e) { go.disabled = true; plan.innerHTML = refused(e); }
  });
  go.addEventListener("click", async () => {
    go.disabled = true;
    try {
      const v = await post(false);
      banner(`Instance ${i.id} redriven from ${v.redrive.from}.`, "info");
      await current.refresh();
    } catch (e) { plan.innerHTML = refused(e); }
  });
}

function confirmCancel(id, after, focus) {
  const box = $("#cancel-box");
  box.innerHTML = `Cancel ${esc(id)}? <button type="button" id="cancel-yes" class="danger">Yes, cancel it</button> <button type="button" id="cancel-no">No</button>`;
  $("#cancel-no").addEventListener("click", () => after());
  $("#cancel-yes").addEventListener("click", async () => {
    try {
      await api("/instances/" + id.split("/").map(encodeURIComponent).join("/") + "/cancel", { method: "POST" });
      banner(`Instance ${id} is cancelled.`, "info");
      await after();
    } catch (e) { banner(explainError(e)); }
  });
  if (focus) $("#cancel-no").focus();
}

function waitingPanel(i, w) {
  if (FINAL.has(i.status)) return `<p class="muted">Nothing: the instance has ended (${esc(i.status)}).</p>`;
  const parts = [];
  if (w.events.length) {
    parts.push(`<h3 class="muted">Events</h3><ul class="plain" id="waiting-events">${w.events.map(e => {
      const ext = {};
      for (const c of e.correlation) if (c.value != null) ext[c.attribute] = c.value;
      const q = new URLSearchParams({ type: e.type, source: e.source || "", ext: JSON.stringify(ext), instance: i.id });
      return `<li data-event="${esc(e.event)}"><strong>${esc(e.event)}</strong> <span class="muted">type</span> <code>${esc(e.type)}</code>${e.source ? ` <span class="muted">source</span> <code>${esc(e.source)}</code>` : ""}
        → ${e.next ? esc(e.next) : "stays"}${e.all ? ` <span class="muted">(with the other events of its group)</span>` : ""}
        ${e.correlation.length ? `<div>must carry ${e.correlation.map(c => c.error ? `<code>${esc(c.attribute)}</code>: <span class="muted">${esc(c.error)}</span>` : `<code>${esc(c.attribute)}</code> = ${c.value == null ? `<em>any (${esc(c.from)})</em>` : `<code class="corr">${esc(c.value)}</code>`}`).join(", ")}</div>` : ""}
        <button type="button" data-send="${esc(q.toString())}">Send this event…</button></li>`;
    }).join("")}</ul>`);
  }
  if (w.timers.length) {
    parts.push(`<h3 class="muted">Timers</h3><ul class="plain" id="waiting-timers">${w.timers.map(t => `<li data-timer="${esc(t.timer)}"><strong>${esc(t.kind)}</strong> <code>${esc(t.timer)}</code>${t.next ? ` → ${esc(t.next)}` : ""}<br>
        fires in <span class="countdown" data-due="${t.dueMs}"></span> <span class="muted">(${when(t.due)})</span></li>`).join("")}</ul>`);
  }
  if (w.operations.length) {
    parts.push(`<h3 class="muted">Calls and subflows</h3><ul class="plain" id="waiting-operations">${w.operations.map(o => `<li>${esc(o.kind)} <strong>${esc(o.name)}</strong> <span class="muted">operation ${esc(o.op)}</span>${o.instance ? ` ${instLink(o.instance)}` : ""}</li>`).join("")}</ul>`);
  }
  if (w.inbox && w.inbox.length) {
    parts.push(`<h3 class="muted">Inbox</h3><p>${w.inbox.length} event(s) delivered and not consumed: ${w.inbox.map(e => `<code>${esc(e.type)}</code>`).join(", ")}</p>`);
  }
  return parts.length ? parts.join("") : `<p class="muted">No event, timer or call: the instance is ${esc(i.status)}.</p>`;
}

let ticker = null;
function startTicking() {
  const tick = () => {
    for (const el of document.querySelectorAll(".countdown[data-due]")) {
      const ms = Number(el.dataset.due) - Date.now();
      el.textContent = ms <= 0 ? "now (due)" : duration(ms);
    }
  };
  tick();
  if (!ticker) ticker = setInterval(tick, 1000);
}
function stopTicking() { if (ticker) { clearInterval(ticker); ticker = null; } }
function duration(ms) {
  const s = Math.ceil(ms / 1000), d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), r = s % 60;
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + r + "s";
}

function describeInput(input) {
  const k = input.input;
  if (k === "event") return `event <code>${esc(input.event && input.event.type)}</code>`;
  if (k === "timerFired") return `timer <code>${esc(input.timer)}</code> fired`;
  if (k === "completed") return `operation <code>${esc(input.op)}</code> completed`;
  if (k === "failed") return `operation <code>${esc(input.op)}</code> failed: ${esc(input.error && input.error.message)}`;
  if (k === "cancel") return `cancelled${input.reason ? ": " + esc(input.reason) : ""}`;
  if (k === "abort") return `aborted: ${esc(input.error && input.error.message)}`;
  if (k === "debug") return input.breakpoints.length ? `breakpoints: ${input.breakpoints.map(b => esc(describeBreakpoint(b))).join("; ")}` : "breakpoints cleared";
  if (k === "resume") return input.step ? "step" : "resume";
  if (k === "migrate") return `moved from version ${esc(input.from)} to ${esc(input.version)}`;
  if (k === "redrive") return `redriven${input.update ? ` with update <code>${esc(input.update)}</code>` : " without update"}`
    + ((input.diff || []).length ? `: ${input.diff.map(op => `<code>${esc(op.op)} ${esc(op.path)}</code>${"value" in op ? " " + esc(JSON.stringify(op.value)) : ""}`).join(", ")}` : "");
  return esc(k);
}

function describeBreakpoint(b) {
  if (!b) return "";
  if (b.on === "enter") return `entering ${b.state}`;
  if (b.on === "action") return b.action === "enter" || b.action === "exit"
    ? `before the ${b.action} action of ${b.state}` : `before the action of transition ${b.action.slice(1)} of ${b.state}`;
  if (b.on === "transition") return b.transition === undefined ? `before any transition of ${b.state}` : `before transition ${b.transition} of ${b.state}`;
  return JSON.stringify(b);
}

function describeTrace(t) {
  switch (t.step) {
    case "paused": return `<strong>paused</strong> ${esc(describeBreakpoint(t.at))}`;
    case "resumed": return t.stepping ? "stepped" : "resumed";
    case "stateEntered": return `entered <strong>${esc(t.state)}</strong>`;
    case "redriven": return `<strong>redriven</strong> from ${esc(t.from)} <span class="muted">(redrive ${esc(String(t.redrives))})</span>`;
    case "migrated": return `moved to version ${esc(t.version)}: ${esc(t.state)} → <strong>${esc(t.to)}</strong>`;
    case "transitionFired": return `${esc(t.state)} → ${esc(t.next || t.state)} <span class="muted">(${esc(t.trigger)})</span>`;
    case "eventConsumed": return `consumed event ${esc(t.event)}`;
    case "actionCompleted": return `${esc(t.action)} <code>${esc(t.op)}</code> done`;
    case "actionFailed": return `<span class="del">${esc(t.action)} <code>${esc(t.op)}</code> failed: ${esc(t.message)}</span>`;
    default: return `${esc(t.step)}`;
  }
}

function describeEffect(e) {
  switch (e.effect) {
    case "invokeFunction": return `call ${esc(e.function)} <code>${esc(e.op)}</code>`;
    case "startSubflow": return `start subflow ${esc(e.definition)}`;
    case "sendEvent": return `send <code>${esc(e.event && e.event.type)}</code>`;
    case "startTimer": return `timer <code>${esc(e.timer)}</code> until ${when(new Date(e.due).toISOString())}`;
    case "cancelTimer": return `cancel timer <code>${esc(e.timer)}</code>`;
    case "cancelOperation": return `cancel operation <code>${esc(e.op)}</code>`;
    default: return esc(e.effect);
  }
}

function timeline(v) {
  if (v.historyError) return `<p class="muted">The history cannot be read here: ${esc(v.historyError)}</p>`;
  if (!v.steps.length) return `<p class="muted">No step recorded${v.machineMissing ? " (the definition is not registered here, so the journal cannot be replayed)" : ""}.</p>`;
  let prev = null;
  const items = v.steps.map((s, n) => {
    const d = diff(prev === null ? {} : prev, s.data);
    prev = s.data;
    const failed = s.traces.some(t => t.step === "actionFailed") || s.status === "failed";
    return `<li class="${failed ? "fail" : ""}" data-step="${n}">
      <div class="step-head"><span class="muted">${when(s.time)}</span> <span>${describeInput(s.input)}</span> ${badge(s.status)} ${s.state ? `<span class="muted">in</span> ${esc(s.state)}` : ""}</div>
      ${s.traces.length ? `<div>${s.traces.map(describeTrace).join(" · ")}</div>` : ""}
      ${s.effects.length ? `<div class="muted">${s.effects.map(describeEffect).join(" · ")}</div>` : ""}
      ${d.length ? `<div class="diff" aria-label="data change">${d.slice(0, 40).map(renderDiff).join("")}${d.length > 40 ? `<div class="muted">… ${d.length - 40} more</div>` : ""}</div>` : `<div class="muted">data unchanged</div>`}
      <details data-key="step-${n}"><summary>data after this step</summary><pre>${json(s.data)}</pre></details>
    </li>`;
  });
  return `${v.truncated ? `<p class="muted">Only the first entries of the journal are shown.</p>` : ""}<ol class="timeline" id="timeline">${items.join("")}</ol>`;
}

function renderDiff(c) {
  const path = c.path || "(the whole data)";
  const short = v => { const s = JSON.stringify(v); return esc(s && s.length > 160 ? s.slice(0, 159) + "…" : s); };
  if (c.op === "add") return `<div class="add mono">+ ${esc(path)}: ${short(c.value)}</div>`;
  if (c.op === "remove") return `<div class="del mono">− ${esc(path)}: ${short(c.old)}</div>`;
  return `<div class="chg mono">~ ${esc(path)}: ${short(c.old)} → ${short(c.value)}</div>`;
}

/** The changes from `a` to `b` as JSON pointer paths: add, remove, replace. */
function diff(a, b, path = "", out = []) {
  const obj = x => x !== null && typeof x === "object";
  if (obj(a) && obj(b) && Array.isArray(a) === Array.isArray(b)) {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    for (const k of keys) {
      const p = path + "/" + String(k).replace(/~/g, "~0").replace(/\//g, "~1");
      if (!(k in b)) out.push({ op: "remove", path: p, old: a[k] });
      else if (!(k in a)) out.push({ op: "add", path: p, value: b[k] });
      else diff(a[k], b[k], p, out);
    }
  } else if (JSON.stringify(a) !== JSON.stringify(b)) {
    out.push({ op: "replace", path, old: a, value: b });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Definitions

async function definitionsPage(r, seq) {
  const defs = (await api("/definitions")).definitions;
  if (seq !== renderSeq) return;
  view.innerHTML = `<h1>Definitions</h1><section>${defs.length ? `<table id="definitions"><thead><tr><th>Id</th><th>Version</th><th>Name</th><th>Description</th><th></th></tr></thead><tbody>
    ${defs.map(d => `<tr><td><a href="#/definition/${encodeURIComponent(d.id)}/${encodeURIComponent(d.version)}">${esc(d.id)}</a></td><td>${esc(d.version)}</td><td>${esc(d.name)}</td><td>${esc(d.description || "")}</td>
      <td><a href="#/instances?definition=${encodeURIComponent(d.id)}">instances</a> · <a href="#/start?definition=${encodeURIComponent(d.id)}&version=${encodeURIComponent(d.version)}">start</a></td></tr>`).join("")}
    </tbody></table>` : `<div class="empty">No definition is registered yet. Register one with<br><code>curl -X POST ${esc(location.origin)}/definitions -H 'Content-Type: application/json' -d @definition.json</code></div>`}</section>`;
  current.refresh = () => definitionsPage(r, seq);
}

async function definitionPage(r, seq) {
  const [id, version] = r.rest.split("/");
  const p = new URLSearchParams({ id });
  if (version) p.set("version", version);
  const d = await api("/ui/api/definition?" + p);
  if (seq !== renderSeq) return;
  view.innerHTML = `<h1>${esc(d.name || d.id)} <span class="muted">${esc(d.id)} version ${esc(d.version)}</span></h1>
    <section><div class="actions">
      <label for="d-version" style="display:inline">Version</label>
      <select id="d-version">${d.versions.map(v => `<option ${v === d.version ? "selected" : ""}>${esc(v)}</option>`).join("")}</select>
      <a href="#/start?definition=${encodeURIComponent(d.id)}&version=${encodeURIComponent(d.version)}">Start an instance</a> ·
      <a href="#/instances?definition=${encodeURIComponent(d.id)}">Its instances</a></div>
      ${d.description ? `<p>${esc(d.description)}</p>` : ""}</section>
    <section><h2>Diagram</h2><div class="diagram-box" id="diagram">${d.diagram}</div>
      <details><summary>Mermaid source (<code>sm4c graph</code>)</summary><pre>${esc(d.mermaid)}</pre></details></section>
    ${d.events.length ? `<section><h2>Events</h2><ul>${d.events.map(e => `<li><strong>${esc(e.name)}</strong> type <code>${esc(e.type)}</code>${e.source ? ` source <code>${esc(e.source)}</code>` : ""}</li>`).join("")}</ul></section>` : ""}
    ${d.definition && Array.isArray(d.definition.states) ? `<section id="breakpoints-box"><h2>Breakpoints</h2><div id="breakpoints-body" class="muted">…</div></section>` : ""}
    <section><h2>Definition</h2><pre id="definition-json">${json(d.definition)}</pre></section>`;
  $("#d-version").addEventListener("change", e => { location.hash = `#/definition/${encodeURIComponent(d.id)}/${encodeURIComponent(e.target.value)}`; });
  if ($("#breakpoints-box")) await breakpointsPanel(d, seq);
}

// The step debugger: a definition's breakpoints, one checkbox per breakpoint-able point of each state.
async function breakpointsPanel(d, seq) {
  const box = $("#breakpoints-body");
  const path = "/definitions/" + encodeURIComponent(d.id) + "/breakpoints";
  let set;
  try { set = (await api(path)).breakpoints; } catch (e) {
    if (seq !== renderSeq) return;
    box.textContent = e.status === 501 ? e.message : explainError(e);
    return;
  }
  if (seq !== renderSeq) return;
  const key = b => JSON.stringify([b.on, b.state, b.action || "", b.transition === undefined ? "" : b.transition]);
  const on = new Set(set.map(key));
  const cell = (b, label) => `<label><input type="checkbox" data-kind="${esc(b.on + (b.action ? "-" + b.action : ""))}" data-bp='${esc(JSON.stringify(b))}' ${on.has(key(b)) ? "checked" : ""}> ${esc(label)}</label>`;
  const rows = d.definition.states.map(st => {
    const cells = [cell({ on: "enter", state: st.name }, "entering")];
    if (st.enterAction) cells.push(cell({ on: "action", state: st.name, action: "enter" }, "enter action"));
    (st.transitions || []).forEach((t, n) => { if (t.action) cells.push(cell({ on: "action", state: st.name, action: "t" + n }, `action of transition ${n}`)); });
    if (st.exitAction) cells.push(cell({ on: "action", state: st.name, action: "exit" }, "exit action"));
    if ((st.transitions || []).length) cells.push(cell({ on: "transition", state: st.name }, "any transition"));
    return `<tr data-state="${esc(st.name)}"><th scope="row">${esc(st.name)}</th><td>${cells.join(" &nbsp; ")}</td></tr>`;
  }).join("");
  const others = set.filter(b => b.on === "transition" && b.transition !== undefined);
  box.className = "";
  box.innerHTML = `<p class="muted">An instance of ${esc(d.id)} (any version) that reaches a checked point pauses there until it is resumed. Breakpoints cost nothing while none is set.</p>
    <table id="breakpoints"><tbody>${rows}</tbody></table>
    ${others.length ? `<p id="bp-others">Also: ${others.map(b => `${esc(describeBreakpoint(b))} <button type="button" data-remove='${esc(JSON.stringify(b))}'>remove</button>`).join("; ")}</p>` : ""}
    <div class="actions" style="margin-top:8px"><button type="button" id="bp-clear" ${set.length ? "" : "disabled"}>Clear all breakpoints</button></div>`;
  const save = async list => {
    try {
      await api(path, { method: "PUT", body: JSON.stringify({ breakpoints: list }), headers: { "content-type": "application/json" } });
      banner(list.length ? `${list.length} breakpoint${list.length > 1 ? "s" : ""} set on ${d.id}.` : `No breakpoint is set on ${d.id}.`, "info");
    } catch (e) { banner(explainError(e)); }
    await breakpointsPanel(d, seq);
  };
  for (const c of box.querySelectorAll("input[data-bp]")) {
    c.addEventListener("change", () => {
      const b = JSON.parse(c.dataset.bp);
      const rest = set.filter(x => key(x) !== key(b));
      save(c.checked ? [...rest, b] : rest);
    });
  }
  for (const r of box.querySelectorAll("button[data-remove]")) {
    r.addEventListener("click", () => save(set.filter(x => key(x) !== key(JSON.parse(r.dataset.remove)))));
  }
  $("#bp-clear").addEventListener("click", () => save([]));
}

// ---------------------------------------------------------------------------------------------
// Batches: GET /batches and /batches/{id}, POST /batches (with a dry run first) and its cancel.

const WHERE = ["definition", "version", "status", "state", "startedAfter", "startedBefore", "jq"];

/** The instances page's filters as the batches page's query (its jq condition is `where.jq`). */
function batchQuery(f) {
  const p = new URLSearchParams();
  for (const k of WHERE) { const v = k === "jq" ? f.condition : f[k]; if (v) p.set(k, v); }
  return p.toString();
}

function noBatches(e) {
  view.innerHTML = `<h1>Batches</h1><section><div class="empty" id="no-batches"><strong>This server runs no batches.</strong><br>${esc(e.message)}</div></section>`;
}

function batchCounts(b) {
  return `${esc(b.done)} done · ${esc(b.failedCount)} failed · ${esc(b.matched)} matched`;
}

/** The request the form describes, or throws naming what is missing. */
function batchRequest() {
  const op = $("#b-operation").value;
  const where = {};
  for (const k of WHERE) {
    let v = $(`#b-${k}`).value.trim();
    if (v && k.startsWith("started")) v = new Date(v + "Z").toISOString();
    if (v) where[k] = v;
  }
  const body = { operation: op, where };
  const rate = $("#b-rate").value.trim();
  if (rate) body.rate = Number(rate);
  if (op === "redrive" && $("#b-update").value.trim()) body.update = $("#b-update").value.trim();
  if (op === "migrate") body.version = $("#b-target").value.trim();
  if (op === "send") {
    try { body.event = JSON.parse($("#b-event").value); } catch (e) { throw new Error("The event is not JSON: " + e.message); }
  }
  return body;
}

async function batchesPage(r, seq) {
  const f = Object.fromEntries(WHERE.map(k => [k, r.params.get(k) || ""]));
  const local = t => t ? new Date(t).toISOString().slice(0, 16) : "";
  let list;
  try { list = (await api("/batches")).batches; } catch (e) {
    if (e.status !== 501) throw e;
    if (seq === renderSeq) noBatches(e);
    return;
  }
  if (seq !== renderSeq) return;
  view.innerHTML = `<h1>Batches</h1>
    <section><h2>New batch</h2>
      <form class="filters" id="batch-form">
        <div><label for="b-operation">Operation</label><select id="b-operation">
          ${["cancel", "redrive", "migrate", "send"].map(o => `<option>${o}</option>`).join("")}</select></div>
        <div><label for="b-definition">Definition</label><input id="b-definition" size="12" value="${esc(f.definition)}"></div>
        <div><label for="b-version">Version</label><input id="b-version" size="6" value="${esc(f.version)}"></div>
        <div><label for="b-status">Status</label><select id="b-status"><option value="">any</option>
          ${STATUSES.map(s => `<option ${s === f.status ? "selected" : ""}>${s}</option>`).join("")}</select></div>
        <div><label for="b-state">State</label><input id="b-state" size="12" value="${esc(f.state)}"></div>
        <div><label for="b-startedAfter">Started after (UTC)</label><input id="b-startedAfter" type="datetime-local" value="${esc(local(f.startedAfter))}"></div>
        <div><label for="b-startedBefore">Started before (UTC)</label><input id="b-startedBefore" type="datetime-local" value="${esc(local(f.startedBefore))}"></div>
        <div><label for="b-jq">Data matches (jq)</label><input id="b-jq" size="22" class="mono" value="${esc(f.jq)}"></div>
        <div><label for="b-rate">Per second</label><input id="b-rate" size="6" placeholder="server's"></div>
        <div data-op="redrive" hidden><label for="b-update">Update (jq)</label><input id="b-update" size="22" class="mono"></div>
        <div data-op="migrate" hidden><label for="b-target">To version</label><input id="b-target" size="6"></div>
        <div data-op="send" hidden><label for="b-event">Event (JSON)</label><textarea id="b-event" rows="3" cols="40" class="mono">{"type": "", "source": "inspector", "data": {}}</textarea></div>
        <div><button type="button" id="b-dry">Dry run</button> <button type="submit" id="b-start" class="primary" disabled>Start</button></div>
      </form>
      <div id="b-preview" class="muted">A dry run lists what the batch would touch; then Start runs it.</div>
    </section>
    <section><h2>Batches</h2>${list.length ? `<table id="batches"><thead><tr><th>Batch</th><th>Operation</th><th>Phase</th><th>Progress</th><th>Posted</th></tr></thead><tbody>
      ${list.map(b => `<tr data-id="${esc(b.id)}"><td><a href="#/batch/${encodeURIComponent(b.id)}">${esc(b.id)}</a></td><td>${esc(b.operation)}</td>
        <td>${badge(b.phase)}</td><td>${batchCounts(b)}</td><td>${when(b.createdAt)}</td></tr>`).join("")}
      </tbody></table>` : `<div class="empty" id="batches-none">No batch yet.</div>`}</section>`;
  const showFields = () => {
    for (const d of view.querySelectorAll("[data-op]")) d.hidden = d.dataset.op !== $("#b-operation").value;
    $("#b-start").disabled = true;
  };
  $("#b-operation").addEventListener("change", showFields);
  for (const i of view.querySelectorAll("#batch-form input, #batch-form textarea, #batch-form select")) {
    if (i.id !== "b-operation") i.addEventListener("input", () => { $("#b-start").disabled = true; });
  }
  showFields();
  $("#b-dry").addEventListener("click", async () => {
    banner(null);
    try {
      const v = await api("/batches", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ ...batchRequest(), dryRun: true }) });
      $("#b-preview").innerHTML = `<p id="b-matched"><strong>${esc(v.matched)}</strong> instance(s) would be touched by ${esc(v.operation)}${v.truncated ? " (the first 1000 listed)" : ""}.</p>
        ${v.instances.length ? `<table id="b-instances"><thead><tr><th>Instance</th><th>Status</th><th>Definition</th><th>State</th></tr></thead><tbody>
        ${v.instances.map(x => `<tr><td>${instLink(x.id)}</td><td>${badge(x.status)}</td><td>${esc(x.definition)} <span class="muted">v${esc(x.version)}</span></td><td>${esc(x.state || "")}</td></tr>`).join("")}</tbody></table>` : ""}`;
      $("#b-start").disabled = v.matched === 0;
    } catch (e) { banner(e instanceof ApiError ? refusal(e) : e.message); }
  });
  $("#batch-form").addEventListener("submit", async e => {
    e.preventDefault();
    banner(null);
    try {
      const v = await api("/batches", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(batchRequest()) });
      location.hash = "#/batch/" + encodeURIComponent(v.id);
    } catch (e) { banner(e instanceof ApiError ? refusal(e) : e.message); }
  });
  current.refresh = async () => {
    // The form keeps what was typed: only the list is read again.
    const fresh = (await api("/batches")).batches;
    if (seq !== renderSeq) return;
    for (const b of fresh) {
      const row = view.querySelector(`#batches tr[data-id="${CSS.escape(b.id)}"]`);
      if (row) { row.cells[2].innerHTML = badge(b.phase); row.cells[3].innerHTML = batchCounts(b); }
    }
  };
}

async function batchPage(r, seq) {
  const id = r.rest;
  const path = "/batches/" + encodeURIComponent(id);
  let timer = null;
  const render = async () => {
    let b;
    try { b = await api(path); } catch (e) {
      if (e.status !== 501) throw e;
      if (seq === renderSeq) noBatches(e);
      return;
    }
    if (seq !== renderSeq) return;
    const reached = b.done + b.failedCount;
    view.innerHTML = `<h1>${esc(b.id)} ${badge(b.phase)}</h1>
      <div class="actions">${b.running ? `<button type="button" id="batch-stop">Stop</button>` : ""} <a href="#/batches">All batches</a></div>
      <section>
        <progress id="batch-progress" max="${esc(Math.max(b.matched, 1))}" value="${esc(reached)}" aria-label="instances reached"></progress>
        <dl class="kv">
          <dt>Operation</dt><dd>${esc(b.operation)}</dd>
          <dt>Where</dt><dd><code>${esc(JSON.stringify(b.where))}</code></dd>
          <dt>Matched</dt><dd id="batch-matched">${esc(b.matched)}${b.matching ? " so far (still matching)" : ""}</dd>
          <dt>Done</dt><dd id="batch-done">${esc(b.done)}</dd>
          <dt>Failed</dt><dd id="batch-failed">${esc(b.failedCount)}</dd>
          <dt>Not reached</dt><dd>${esc(b.pending)}</dd>
          <dt>Posted</dt><dd>${whenUtc(b.createdAt)}</dd>
          ${b.endedAt ? `<dt>Ended</dt><dd>${whenUtc(b.endedAt)}</dd>` : ""}
          ${b.halted ? `<dt>Halted</dt><dd>${esc(b.halted)} (it resumes when the server starts again)</dd>` : ""}
        </dl>
        <details><summary>The request</summary><pre>${json(b.request)}</pre></details>
      </section>
      <section><h2>Failures</h2>${b.failed.length ? `<table id="batch-failures"><thead><tr><th>Instance</th><th>Why</th></tr></thead><tbody>
        ${b.failed.map(x => `<tr><td>${instLink(x.instance)}</td><td>${esc(x.reason)}</td></tr>`).join("")}</tbody></table>` : `<p class="muted" id="batch-no-failures">None.</p>`}</section>`;
    const stop = $("#batch-stop");
    if (stop) stop.addEventListener("click", async () => {
      try { await api(path + "/cancel", { method: "POST" }); await render(); } catch (e) { banner(refusal(e)); }
    });
    clearTimeout(timer);
    // Followed every second while it runs.
    if (b.running) timer = setTimeout(() => { if (seq === renderSeq) render().catch(e => banner(explainError(e))); }, 1000);
  };
  await render();
  current.refresh = () => render();
}

// ---------------------------------------------------------------------------------------------
// Schedules: GET /schedules and /schedules/{id}, and the pause, resume and trigger buttons.

/** A time in the user's locale (as elsewhere on the page), followed by its RFC 3339 UTC form. */
function whenUtc(t) { return t ? `${when(t)} <span class="muted mono utc">${esc(t)}</span>` : ""; }

/** When a schedule runs: `every PT2S` or `cron 0 2 * * *`, and the time zone its clock is in. */
function describeSpec(spec) {
  const how = spec.every ? `every <code>${esc(spec.every)}</code>` : `cron <code>${esc(spec.cron)}</code>`;
  return `${how} <span class="muted">in</span> ${esc(spec.timezone || "UTC")}`;
}

function scheduleDefinition(spec) {
  const href = "#/definition/" + encodeURIComponent(spec.definition) + (spec.version ? "/" + encodeURIComponent(spec.version) : "");
  return `<a href="${href}">${esc(spec.definition)}</a> <span class="muted">${spec.version ? "v" + esc(spec.version) : "latest version"}</span>`;
}

function skippedCounts(k) {
  return `<span title="the previous run still ran">overlap ${esc(k.overlap)}</span> · <span title="missed for longer than the catch-up window">catch-up ${esc(k.catchup)}</span> · <span title="came while paused">paused ${esc(k.paused)}</span>`;
}

function lateness(ms) { return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`; }

/** The schedule a run belongs to: its instance id is `<schedule id>@<nominal time>`. */
function scheduleOf(instance) { const at = instance.indexOf("@"); return at > 0 ? instance.slice(0, at) : null; }

/** A refusal from the server, with its code, the way the page shows other failures. */
function refusal(e) { return e.code ? `${e.code}: ${explainError(e)}` : explainError(e); }

/** A host without schedules (Kafka mode) answers /schedules with 501 notSupported: said plainly. */
function noSchedules(e) {
  view.innerHTML = `<h1>Schedules</h1><section><div class="empty" id="no-schedules"><strong>This server has no schedules.</strong><br>${esc(e.message)}</div></section>`;
}

async function schedulesPage(r, seq) {
  let shown = new Set();
  // Only the latest read started may render (the live stream and the periodic re-read overlap).
  let reads = 0;
  const render = async (flash = new Set()) => {
    const mine = ++reads;
    let list;
    try { list = (await api("/schedules")).schedules; } catch (e) {
      if (e.status !== 501) throw e;
      if (seq === renderSeq) noSchedules(e);
      return;
    }
    if (seq !== renderSeq || mine !== reads) return;
    shown = new Set(list.map(s => s.id));
    view.innerHTML = `<h1>Schedules</h1><section>${list.length ? `<table id="schedules"><thead><tr><th>Schedule</th><th>Definition</th><th>When</th><th>State</th><th>Next time</th><th>Runs</th><th>Skipped</th></tr></thead><tbody>
      ${list.map(s => `<tr data-id="${esc(s.id)}" class="${flash.has(s.id) ? "changed" : ""}">
        <td><a href="#/schedule/${encodeURIComponent(s.id)}">${esc(s.id)}</a>${s.spec.note ? `<div class="muted">${esc(s.spec.note)}</div>` : ""}</td>
        <td>${scheduleDefinition(s.spec)}</td><td>${describeSpec(s.spec)}</td><td>${badge(s.state)}</td>
        <td class="next">${s.nextTimes.length ? whenUtc(s.nextTimes[0]) : `<span class="muted">none</span>`}</td>
        <td class="runs">${esc(s.runs)}</td><td class="skipped">${skippedCounts(s.skipped)}</td></tr>`).join("")}
      </tbody></table>` : `<div class="empty">No schedule yet. Create one with<br><code>curl -X POST ${esc(location.origin)}/schedules -H 'Content-Type: application/json' -d '{"id": "nightly", "definition": "report", "cron": "0 2 * * *"}'</code><br>or <code>sm4c schedule create FILE</code> (see the Schedules chapter).</div>`}</section>`;
  };
  await render();
  current.refresh = () => render();
  current.onChanges = list => {
    const runs = new Set(list.map(c => scheduleOf(c.id)).filter(s => shown.has(s)));
    if (runs.size) render(runs).catch(e => banner(explainError(e)));
  };
}

async function schedulePage(r, seq) {
  const id = r.rest;
  const path = "/schedules/" + encodeURIComponent(id);
  // The heading and its buttons are drawn again only when they change (the state): a button
  // replaced under the pointer, as a run's live update re-renders the page, would lose the click.
  let head = null;
  let latest = null;
  let reads = 0;
  const render = async () => {
    const mine = ++reads;
    let s;
    try { s = await api(path); } catch (e) {
      if (e.status !== 501) throw e;
      if (seq === renderSeq) { noSchedules(e); head = null; }
      return;
    }
    if (seq !== renderSeq || mine !== reads) return;
    latest = s;
    const spec = s.spec;
    const none = `<span class="muted">none</span>`;
    const top = `<h1>${esc(s.id)} ${badge(s.state)}</h1>
      <div class="actions">
        ${s.state === "paused" ? `<button type="button" id="sched-resume" class="primary">Resume</button>` : `<button type="button" id="sched-pause">Pause</button>`}
        <button type="button" id="sched-trigger" title="Start one run now, named with the current time, under the overlap policy">Trigger now</button>
        <a href="#/schedules">All schedules</a>
      </div>`;
    if (head === null) view.innerHTML = `<div id="sched-head" class="card"></div><div id="sched-body"></div>`;
    const openDetails = new Set([...view.querySelectorAll("details[open][data-key]")].map(d => d.dataset.key));
    $("#sched-body").innerHTML = `
      <section>
        <dl class="kv">
          <dt>Definition</dt><dd>${scheduleDefinition(spec)}</dd>
          <dt>When</dt><dd id="sched-spec">${describeSpec(spec)}</dd>
          <dt>Overlap</dt><dd>${esc(spec.overlap)}</dd>
          <dt>Catch-up window</dt><dd>${esc(spec.catchupWindow)}</dd>
          ${spec.jitter && spec.jitter !== "PT0S" ? `<dt>Jitter</dt><dd>up to ${esc(spec.jitter)}</dd>` : ""}
          ${spec.startAt ? `<dt>From</dt><dd>${whenUtc(spec.startAt)}</dd>` : ""}
          ${spec.endAt ? `<dt>Until</dt><dd>${whenUtc(spec.endAt)} <span class="muted">(not included)</span></dd>` : ""}
          ${spec.note ? `<dt>Note</dt><dd>${esc(spec.note)}</dd>` : ""}
          <dt>Runs</dt><dd id="sched-runs">${esc(s.runs)} started</dd>
          <dt>Skipped</dt><dd id="sched-skipped">${skippedCounts(s.skipped)}</dd>
        </dl>
        <details data-key="input"><summary>Each run's input</summary><pre>${json(spec.input)}</pre></details>
      </section>
      <div class="grid">
        <div>
          <section><h2>Recent runs</h2>${s.recentRuns.length ? `<table id="sched-recent"><thead><tr><th>Nominal time</th><th>Instance</th><th>Started late by</th><th>Outcome</th></tr></thead><tbody>
            ${s.recentRuns.map(x => `<tr data-instance="${esc(x.instance)}"><td>${whenUtc(x.nominalTime)}</td><td>${instLink(x.instance)}</td><td>${esc(lateness(x.lateMs))}</td><td>${badge(x.status)}</td></tr>`).join("")}
            </tbody></table>` : `<p class="muted" id="sched-recent-none">No run yet.</p>`}</section>
          <section><h2>Running and kept</h2><dl class="kv">
            <dt>Running</dt><dd id="sched-running">${s.running.length ? s.running.map(instLink).join("<br>") : none}</dd>
            <dt>Kept</dt><dd id="sched-kept">${s.buffered.length ? s.buffered.map(whenUtc).join("<br>") : none}
              <div class="muted">times that came while a run still ran, to start when it ends (overlap <code>bufferOne</code>, <code>bufferAll</code>)</div></dd>
            ${s.backfillPending ? `<dt>Backfill</dt><dd id="sched-backfill">${esc(s.backfillPending)} time(s) still to start</dd>` : ""}
          </dl></section>
        </div>
        <div>
          <section><h2>Next times</h2>${s.nextTimes.length ? `<ol id="sched-next">${s.nextTimes.map(t => `<li>${whenUtc(t)}</li>`).join("")}</ol>
            ${s.state === "paused" ? `<p class="muted">While the schedule is paused these times are skipped.</p>` : ""}` : `<p class="muted" id="sched-next-none">None: the schedule has ended.</p>`}</section>
        </div>
      </div>`;
    for (const d of view.querySelectorAll("details[data-key]")) if (openDetails.has(d.dataset.key)) d.open = true;
    if (top === head) return;
    head = top;
    $("#sched-head").innerHTML = top;
    const done = {
      pause: () => "is paused: the times that come are skipped until it is resumed",
      resume: () => "is resumed (the times that came while it was paused are not run)",
      trigger: () => `is triggered: a run named with the current time starts under its overlap policy (${latest.spec.overlap})`,
    };
    for (const how of Object.keys(done)) {
      const b = $("#sched-" + how);
      if (b) b.addEventListener("click", async () => {
        b.disabled = true;
        try {
          await api(path + "/" + how, { method: "POST" });
          banner(`Schedule ${id} ${done[how]()}.`, "info");
          await render();
        } catch (e) { banner(refusal(e)); }
        b.disabled = false;
      });
    }
  };
  await render();
  current.refresh = render;
  current.onChanges = list => {
    if (list.some(c => scheduleOf(c.id) === id)) render().catch(e => banner(explainError(e)));
  };
}

// ---------------------------------------------------------------------------------------------
// Actions: start an instance, send an event

async function startPage(r, seq) {
  const defs = (await api("/definitions")).definitions;
  if (seq !== renderSeq) return;
  const want = r.params.get("definition") || "";
  const ids = [...new Set(defs.map(d => d.id))];
  view.innerHTML = `<h1>Start an instance</h1><section>${ids.length ? `<form id="start-form">
    <div class="row">
      <div><label for="s-definition">Definition</label><select id="s-definition" required>${ids.map(d => `<option ${d === want ? "selected" : ""}>${esc(d)}</option>`).join("")}</select></div>
      <div><label for="s-version">Version (empty: the latest)</label><input id="s-version" value="${esc(r.params.get("version") || "")}"></div>
      <div><label for="s-id">Instance id (empty: a new one)</label><input id="s-id"></div>
    </div>
    <label for="s-input">Input (JSON)</label><textarea id="s-input">{}</textarea>
    <div class="actions"><button class="primary" type="submit">Start</button></div></form>` : `<div class="empty">No definition is registered yet.</div>`}</section>`;
  const form = $("#start-form");
  if (!form) return;
  form.addEventListener("submit", async e => {
    e.preventDefault();
    let input;
    try { input = JSON.parse($("#s-input").value || "{}"); } catch (err) { banner("The input is not JSON: " + err.message); return; }
    const body = { definition: $("#s-definition").value, input };
    if ($("#s-version").value) body.version = $("#s-version").value;
    if ($("#s-id").value) body.id = $("#s-id").value;
    try {
      const res = await api("/instances", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      location.hash = "#/instance/" + encodeURIComponent(res.id);
      if (!res.created) setTimeout(() => banner(`Instance ${res.id} existed already: it was not started again.`, "info"), 50);
    } catch (err) { banner(explainError(err)); }
  });
}

function sendPage(r) {
  let ext = {};
  try { ext = JSON.parse(r.params.get("ext") || "{}"); } catch (_) { /* a hand-made link: start empty */ }
  const instance = r.params.get("instance") || "";
  view.innerHTML = `<h1>Send an event</h1>
    <section><form id="send-form">
      <div class="row">
        <div><label for="e-type">type</label><input id="e-type" required value="${esc(r.params.get("type") || "")}"></div>
        <div><label for="e-source">source</label><input id="e-source" required value="${esc(r.params.get("source") || "")}"></div>
        <div><label for="e-instance">sm4cinstanceid (optional: only this instance)</label><input id="e-instance" value="${esc(instance)}"></div>
      </div>
      <label for="e-ext">Other attributes (a JSON object: correlation attributes and extensions)</label><textarea id="e-ext">${esc(JSON.stringify(ext, null, 2))}</textarea>
      <label for="e-data">data (JSON)</label><textarea id="e-data">{}</textarea>
      <div class="actions"><button type="submit" class="primary" id="explain">Explain where it would go</button>
        <button type="button" id="send" disabled>Send it</button>
        <span class="muted">Sending is allowed once the explanation of this very event is shown.</span></div>
    </form></section>
    <section id="explanation" hidden></section>`;
  const form = $("#send-form");
  let explained = null;
  let reached = [];
  const event = () => {
    const e = { specversion: "1.0", id: (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random()), type: $("#e-type").value, source: $("#e-source").value };
    Object.assign(e, JSON.parse($("#e-ext").value || "{}"));
    if ($("#e-instance").value) e.sm4cinstanceid = $("#e-instance").value;
    e.datacontenttype = "application/json";
    e.data = JSON.parse($("#e-data").value || "null");
    return e;
  };
  form.addEventListener("input", () => { explained = null; $("#send").disabled = true; });
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    let e;
    try { e = event(); } catch (err) { banner("Not JSON: " + err.message); return; }
    try {
      const x = await api("/events/explain", { method: "POST", headers: { "Content-Type": "application/cloudevents+json" }, body: JSON.stringify(e) });
      explained = e;
      reached = x.reached.map(h => h.instance);
      banner(null);
      const box = $("#explanation");
      box.hidden = false;
      box.innerHTML = `<h2>Where it would go</h2><div class="explain">
        ${x.reached.length ? `<p>It would reach:</p><ul id="reached">${x.reached.map(h => `<li>${instLink(h.instance)} in ${esc(h.state)} (event ${esc(h.event)})</li>`).join("")}</ul>` : `<p id="reached-none"><strong>It would reach no instance now</strong>; it would be kept (parked) for an instance that starts waiting for it.</p>`}
        ${x.starts.length ? `<p>It starts an instance of ${x.starts.map(s => esc(s.definition)).join(", ")}.</p>` : ""}
        ${x.nearMisses.length ? `<p>Turned away:</p><ul>${x.nearMisses.map(h => `<li>${h.instance ? instLink(h.instance) : ""} ${esc(h.reason)}</li>`).join("")}</ul>` : ""}
        <details><summary>definitions</summary><ul>${x.definitions.map(d => `<li>${esc(d.id)} v${esc(d.version)}: ${d.matches ? "declares it as " + esc(d.event) : esc(d.reason)}</li>`).join("")}</ul></details></div>`;
      $("#send").disabled = false;
      $("#send").focus();
    } catch (err) { banner(explainError(err)); }
  });
  $("#send").addEventListener("click", async () => {
    if (!explained) return;
    try {
      const d = await api("/events", { method: "POST", headers: { "Content-Type": "application/cloudevents+json" }, body: JSON.stringify(explained) });
      const box = $("#explanation");
      // SQLite mode answers where the event went; Kafka mode where it was queued for the workers.
      box.innerHTML = `<h2>Sent</h2><p id="delivered">${d.queued
        ? `Queued on topic <code>${esc(d.topic)}</code> (partition ${esc(d.partition)}): the workers deliver it${reached.length ? ` to ${reached.map(instLink).join(", ")}, as explained` : ", as explained"}.`
        : d.reached.length ? `Delivered to ${d.reached.map(instLink).join(", ")}.` : d.parked ? "It reached no instance and is kept (parked) for one that starts waiting for it." : "It reached no instance."}</p>`;
      explained = null;
      $("#send").disabled = true;
    } catch (err) { banner(explainError(err)); }
  });
}

// ---------------------------------------------------------------------------------------------
// Live updates: /ui/events read with fetch (so the token goes in a header), reconnecting for ever.

const live = $("#live");
let stream = null;
let connectedOnce = false;

function setLive(on, text) { live.className = "live " + (on ? "on" : "off"); live.textContent = text; }

async function connect() {
  const ctl = new AbortController();
  stream = ctl;
  try {
    const res = await fetch("/ui/events", { headers: headers({ Accept: "text/event-stream" }), signal: ctl.signal });
    if (res.status === 401 || res.status === 403) {
      setLive(false, "not live: needs a token");
      return retry(ctl, 5000);
    }
    if (!res.ok || !res.body) throw new Error("HTTP " + res.status);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trimStart();
        }
        onEvent(name, data);
      }
    }
  } catch (e) {
    if (ctl.signal.aborted && stream !== ctl) return;
  }
  setLive(false, "reconnecting…");
  retry(ctl, 1000);
}

function retry(ctl, ms) {
  if (stream !== ctl) return;
  setTimeout(() => { if (stream === ctl) connect(); }, ms);
}

function onEvent(name, data) {
  if (name === "hello") {
    setLive(true, "live");
    // After a restart or a lost connection, what the page shows may be stale.
    if (connectedOnce && current && current.refresh) current.refresh().catch(e => banner(explainError(e)));
    connectedOnce = true;
  } else if (name === "changes") {
    let list = [];
    try { list = JSON.parse(data); } catch (_) { return; }
    if (current && current.onChanges) {
      current.onChanges(list);
      // A step is reported as its host stores it; a Kafka worker's transaction may take longer than
      // the server's 250 ms gathering, so read once more a little later.
      const page = current;
      setTimeout(() => { if (current === page && page.onChanges) page.onChanges(list); }, 1500);
    }
  } else if (name === "resync") {
    if (current && current.refresh) current.refresh().catch(() => {});
  }
}

function reconnect() {
  if (stream) stream.abort();
  stream = null;
  connect();
}

// A Kafka worker reports only its own partitions' changes: re-read what is shown now and then.
setInterval(() => {
  if (document.hidden || !current || !current.refresh) return;
  // An ended instance does not change any more; a schedule's next time moves on with the clock.
  const reread = ["instances", "schedules", "schedule"].includes(current.name) || (current.name === "instance" && !current.ended);
  if (reread) current.refresh().catch(() => {});
}, 10000);

$("#token").value = token();
$("#token-form").addEventListener("submit", e => {
  e.preventDefault();
  const t = $("#token").value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  reconnect();
  route();
});
window.addEventListener("hashchange", route);
route();
connect();
