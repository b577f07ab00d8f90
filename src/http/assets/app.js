// onramp dashboard: jobs list with live updates, job detail with retry/cancel/approve (by role,
// with a confirmation that names the effect), routing and the live stream. The tenants and users
// views are in views.js. Everything comes from /v1 with the bearer token kept in this tab's
// sessionStorage.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v);
  }
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(k ?? ""));
  return e;
};
const token = () => sessionStorage.getItem("onramp-token") || "";
const CLOSED = ["succeeded", "cancelled"];

// who is signed in (from /v1/whoami): the buttons shown follow the role
let me = { token: "", role: "viewer", tenant: null };
const RANK = { viewer: 0, operator: 1, admin: 2 };
const atLeast = (role) => (RANK[me.role] ?? -1) >= RANK[role];

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function api(path, opts = {}) {
  const res = await fetch(path, { ...opts, headers: { Authorization: `Bearer ${token()}`, ...(opts.headers || {}) } });
  if (res.status === 401) { showLogin("The token was refused."); throw new ApiError(401, "unauthorized"); }
  const body = res.headers.get("content-type")?.includes("json") ? await res.json().catch(() => null) : null;
  if (!res.ok) throw new ApiError(res.status, `${res.status} ${res.statusText || ""}`.trim() + (body?.detail ? `: ${body.detail}` : body?.title ? `: ${body.title}` : ""));
  return body;
}

// ---- times: relative, re-rendered every few seconds ----
function ago(ts) {
  if (!ts) return "";
  const s = Math.round((Date.now() - new Date(ts)) / 1000);
  const a = Math.abs(s);
  const txt = a < 60 ? `${a} s` : a < 3600 ? `${Math.floor(a / 60)} min` : a < 86400 ? `${Math.floor(a / 3600)} h` : `${Math.floor(a / 86400)} d`;
  return s >= 0 ? `${txt} ago` : `in ${txt}`;
}
const when = (ts, prefix = "") =>
  ts ? el("time", { class: "ago", datetime: ts, title: ts, "data-prefix": prefix }, prefix + ago(ts)) : "";
setInterval(() => document.querySelectorAll("time.ago").forEach((t) => {
  t.textContent = t.dataset.prefix + ago(t.getAttribute("datetime"));
}), 5000);

const badge = (state) => el("span", { class: `badge s-${state}`, "data-testid": "state" }, state.replace("_", " "));
function next(job) {
  if (job.state === "pending" || job.state === "waiting") return when(job.run_at);
  if (job.state === "running") return when(job.run_at, "lease ");
  return "";
}

// Why a job is where it is: the approval it waits for, the error it failed or retries with.
function reason(job) {
  switch (job.state) {
    case "needs_approval": return { cls: "waiting", text: `waiting for approval: ${job.last_error || `step ${job.step}`}` };
    case "failed": return { cls: "error", text: `failed at ${job.step}: ${job.last_error || "no error recorded"}` };
    case "succeeded": case "cancelled": return null;
    default: // an approval's reason stays in last_error after it was given: not an error
      return job.last_error && !job.approved_by
        ? { cls: "error", text: `retrying ${job.step} (attempt ${job.attempt}): ${job.last_error}` } : null;
  }
}
const reasonEl = (job) => {
  const r = reason(job);
  return r ? el("span", { class: r.cls, "data-testid": "reason" }, r.text) : "";
};

// ---- login ----
function showLogin(msg) {
  $("#view").replaceChildren();
  $("#login").hidden = false;
  $("#login-error").textContent = msg || "";
}
$("#login").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("onramp-token", $("#token").value.trim());
  $("#login").hidden = true;
  await start();
});

// ---- live stream (fetch, so the Authorization header can be sent) ----
const listeners = new Set();
let streaming = false;
async function stream() {
  if (streaming) return;
  streaming = true;
  let lastId = null; // the last event seen: a reconnect resumes after it (Last-Event-ID)
  for (;;) {
    let ended = false; // the server ended the stream (its lifetime): reconnect soon
    try {
      const headers = { Authorization: `Bearer ${token()}` };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const res = await fetch("/v1/stream", { headers });
      if (!res.ok) throw new Error(res.status);
      $("#live").classList.add("on");
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) { ended = true; break; }
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, i); buf = buf.slice(i + 2);
          const data = chunk.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n");
          const id = chunk.split("\n").find((l) => l.startsWith("id:"));
          if (id) lastId = id.slice(3).trim();
          if (chunk.includes("event: job") && data) { const job = JSON.parse(data); listeners.forEach((f) => f(job)); missed?.push(job); }
        }
      }
    } catch (e) { /* reconnect below */ }
    $("#live").classList.remove("on");
    await new Promise((r) => setTimeout(r, ended ? 200 : 2000));
  }
}

// ---- jobs list (rows are links: open in a new tab works) ----
const td = (label, attrs, ...kids) => el("td", { "data-label": label, ...attrs }, ...kids);
const JOB_COLUMNS = ["Job", "State", "Kind", "Subject", "Step", "Reason", "Attempt", "Next", "Age"];
const HIDE_SM = ["Attempt", "Next"];
function jobRow(job) {
  return el("tr", { class: "job", "data-job": job.id },
    td("Job", {}, el("a", { class: "row-link", href: `#/jobs/${job.id}` }, `#${job.id}`)),
    td("State", {}, badge(job.state)), td("Kind", {}, job.kind), td("Subject", { class: "wrap" }, job.subject),
    td("Step", { "data-testid": "step" }, job.step), td("Reason", { class: "reason" }, reasonEl(job)),
    td("Attempt", { class: "hide-sm" }, String(job.attempt)), td("Next", { class: "hide-sm" }, next(job)),
    td("Age", { class: "muted" }, when(job.created_at)));
}
const jobTable = (tbody) => el("table", { class: "stack jobs" },
  el("thead", {}, el("tr", {}, ...JOB_COLUMNS.map((h) => el("th", { class: HIDE_SM.includes(h) ? "hide-sm" : null }, h)))), tbody);

async function jobsView(attention) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const form = el("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); const p = new URLSearchParams(new FormData(form)); for (const [k, v] of [...p]) if (!v) p.delete(k); location.hash = `#/jobs?${p}`; } },
    el("select", { name: "state", "aria-label": "state" }, el("option", { value: "" }, "any state"),
      ...["pending", "running", "waiting", "needs_approval", "failed", "succeeded", "cancelled"].map((s) => el("option", { value: s, selected: params.get("state") === s ? "" : null }, s))),
    el("input", { name: "kind", placeholder: "kind", value: params.get("kind") || "" }),
    el("input", { name: "subject", placeholder: "subject or tenant/", value: params.get("subject") || "" }),
    el("button", { type: "submit" }, "Filter"));
  const tbody = el("tbody", { id: "jobs" });
  $("#view").replaceChildren(el("h1", {}, attention ? "Needs attention" : "Jobs"), attention ? "" : form, jobTable(tbody));
  let jobs;
  if (attention) {
    const [f, a] = await Promise.all([api("/v1/jobs?state=failed&limit=200"), api("/v1/jobs?state=needs_approval&limit=200")]);
    jobs = [...f.jobs, ...a.jobs].sort((x, y) => y.id - x.id);
  } else {
    const q = new URLSearchParams(params); q.set("limit", "100");
    jobs = (await api(`/v1/jobs?${q}`)).jobs;
  }
  tbody.replaceChildren(...jobs.map(jobRow));
  if (!jobs.length) tbody.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No jobs.")));
  const matches = (j) => attention ? ["failed", "needs_approval"].includes(j.state)
    : (!params.get("state") || j.state === params.get("state")) && (!params.get("kind") || j.kind === params.get("kind"))
      && (!params.get("subject") || j.subject === params.get("subject") || (params.get("subject").endsWith("/") && j.subject.startsWith(params.get("subject"))));
  return (job) => {
    const old = tbody.querySelector(`tr[data-job="${job.id}"]`);
    if (old && !matches(job)) { old.remove(); return; }
    if (old) old.replaceWith(jobRow(job));
    else if (matches(job)) { tbody.querySelector("td[colspan]")?.parentElement.remove(); tbody.prepend(jobRow(job)); }
  };
}

// ---- confirmations: an in-page dialog that says what will happen ----
function confirmDialog(title, lines, ok, danger) {
  const dlg = el("dialog", { class: "confirm", "data-testid": "confirm" },
    el("h2", {}, title), ...lines.map((l) => el("p", { class: "wrap" }, l)),
    el("form", { method: "dialog", class: "actions" },
      el("button", { value: "no", "data-testid": "confirm-no" }, "Go back"),
      el("button", { value: "yes", class: danger ? "danger" : "primary", "data-testid": "confirm-yes" }, ok)));
  document.body.append(dlg);
  dlg.showModal();
  return new Promise((resolve) => dlg.addEventListener("close", () => { dlg.remove(); resolve(dlg.returnValue === "yes"); }));
}

// Approving these lets something irreversible happen: admins only, as the API starts them.
const ADMIN_APPROVALS = ["user.offboard", "tenant.offboard"];
function approvalEffect(job) {
  const [tenant, user] = job.subject.split("/");
  if (job.kind === "user.offboard")
    return `Approve the hard cutoff of ${user} in ${tenant}: cancels all of ${user}'s running Slurm jobs now; the offboarding then disables ${user}'s login and, after the retention period, snapshots ${user}'s home and deletes ${user}'s Slurm association.`;
  if (job.kind === "tenant.offboard" && job.step === "confirm")
    return `Approve the offboarding of tenant ${tenant}: blocks its accounts, deletes its Slurm cluster and releases its nodes, and deletes its accounts after the retention period.`;
  if (job.kind === "tenant.offboard")
    return `Approve the hard cutoff of tenant ${tenant}: cancels all of its running Slurm jobs now; the offboarding then goes on.`;
  if (job.kind === "reconcile.hold")
    return "Approve the release of the held offboardings: offboards the held users still to be offboarded.";
  return `Approve job #${job.id} (${job.kind} of ${job.subject}) at step ${job.step}: it goes on from there.`;
}

// The outcome of the last action on a job page: kept across re-renders until the next action.
let notice = null; // { id, cls, text }
async function act(job, action) {
  if (action === "approve") {
    const ok = await confirmDialog(`Approve job #${job.id}?`, [approvalEffect(job), `Asked for: ${job.last_error || "approval"}`], "Approve", true);
    if (!ok) return;
  }
  if (action === "cancel") {
    const ok = await confirmDialog(`Cancel job #${job.id}?`, [`Cancels ${job.kind} of ${job.subject} at step ${job.step}; steps already done are not undone.`], "Cancel the job", true);
    if (!ok) return;
  }
  try {
    await api(`/v1/jobs/${job.id}/${action}`, { method: "POST" });
    notice = { id: job.id, cls: "ok", text: `${action}: done` };
  } catch (e) {
    if (e.status === 401) return;
    notice = { id: job.id, cls: "error", text: `${action} refused: ${e.message}` };
  }
  await render();
}

function actionsFor(job) {
  const btn = (action, label, cls) => el("button", { class: cls, "data-testid": action, onclick: () => act(job, action) }, label);
  const note = (text) => el("p", { class: "muted", "data-testid": "actions-note" }, text);
  if (!atLeast("operator")) return [note(`Signed in as a ${me.role}: retry, cancel and approve need an operator token.`)];
  const adminOnly = job.state === "needs_approval" && ADMIN_APPROVALS.includes(job.kind) && !atLeast("admin");
  return [el("div", { class: "actions" },
    job.state === "failed" ? btn("retry", "Retry from failed step", "primary") : "",
    job.state === "needs_approval" && !adminOnly ? btn("approve", "Approve…", "primary") : "",
    !CLOSED.includes(job.state) ? btn("cancel", "Cancel…", "danger") : ""),
  adminOnly ? note("Approving a hard cutoff or a tenant offboarding needs an admin token.") : ""];
}

// ---- one job ----
async function jobView(id) {
  const { job, steps, events } = await api(`/v1/jobs/${id}`);
  const json = (v) => (v === null || v === undefined ? "" : el("pre", {}, JSON.stringify(v, null, 2)));
  // the commands and requests an attempt made; changes marked +
  const effects = (list) => (!list || !list.length ? "" : el("ul", { class: "effects", "data-testid": "effects" },
    ...list.map((e) => el("li", { class: e.write ? "write" : "read" },
      el("span", { class: "sys" }, `${e.write ? "+" : " "} ${e.system}`), el("code", {}, e.call)))));
  const r = reason(job);
  const why = !r ? [] : job.state === "needs_approval"
    ? [el("dt", {}, "Waiting"), el("dd", { class: "waiting", "data-testid": "waiting" }, r.text)]
    : [el("dt", {}, "Last error"), el("dd", { class: "error", "data-testid": "last-error" }, job.last_error)];
  const shown = notice?.id === job.id ? notice : null;
  const runError = (s) => s.outcome === "needs_approval"
    ? el("div", { class: "waiting" }, `asked for approval: ${s.error}`) : el("div", { class: "error" }, s.error);
  $("#view").replaceChildren(
    el("p", {}, el("a", { href: "#/jobs" }, "← all jobs")),
    el("div", { class: "card" },
      el("h1", { class: "wrap" }, `#${job.id} ${job.kind} `, badge(job.state)),
      el("dl", { class: "wrap" },
        el("dt", {}, "Subject"), el("dd", {}, job.subject),
        el("dt", {}, "Step"), el("dd", { "data-testid": "current-step" }, `${job.step} (attempt ${job.attempt})`),
        why,
        CLOSED.includes(job.state) || job.state === "failed"
          ? [el("dt", {}, "Finished"), el("dd", {}, job.finished_at ? [job.finished_at, " (", when(job.finished_at), ")"] : "")]
          : [el("dt", {}, job.state === "running" ? "Lease until" : "Due"), el("dd", {}, job.run_at, " (", when(job.run_at), ")")],
        el("dt", {}, "Created"), el("dd", {}, `${job.created_at} by ${job.created_by}`),
        job.approved_by ? [el("dt", {}, "Approved by"), el("dd", { "data-testid": "approved-by" }, job.approved_by)] : []),
      actionsFor(job),
      el("p", { id: "action-error", class: shown?.cls === "ok" ? "ok" : "error", "data-testid": "action-result", role: "status" }, shown?.text ?? "")),
    el("h2", {}, "Steps and attempts"),
    el("table", { class: "steps stack", "data-testid": "steps" },
      el("thead", {}, el("tr", {}, ...["Step", "Attempt", "Worker", "Started", "Took", "Outcome", "Error / calls / output"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...steps.map((s) => el("tr", {},
        td("Step", {}, s.step), td("Attempt", {}, String(s.attempt)), td("Worker", { class: "muted" }, s.worker),
        td("Started", {}, when(s.started_at)),
        td("Took", {}, s.finished_at ? `${((new Date(s.finished_at) - new Date(s.started_at)) / 1000).toFixed(2)}s` : "running"),
        td("Outcome", {}, s.outcome ? badge(s.outcome) : "", s.next_run_at ? el("div", { class: "muted" }, when(s.next_run_at, "next ")) : ""),
        td("Detail", { class: "detail" }, s.error ? runError(s) : "", effects(s.effects), json(s.output)))))),
    el("h2", {}, "Audit trail"),
    el("table", { class: "stack", "data-testid": "events" },
      el("thead", {}, el("tr", {}, ...["When", "Change", "Step", "By", "Detail"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...events.map((e) => el("tr", {},
        td("When", { title: e.at }, when(e.at)), td("Change", {}, `${e.from_state ?? "—"} → ${e.to_state}`), td("Step", {}, e.step ?? ""),
        td("By", {}, e.actor), td("Detail", { class: "muted" }, e.detail ?? ""))))));
  let timer;
  return (changed) => { if (changed.id === job.id) { clearTimeout(timer); timer = setTimeout(render, 150); } };
}

// ---- routing ----
// Renders run one at a time: one asked for while another is loading runs after it, so an older
// answer never draws over a newer one (a live update, an action and a navigation can overlap).
let rendering = null, renderAgain = false;
function render() {
  if (rendering) { renderAgain = true; return rendering; }
  rendering = (async () => {
    try { do { renderAgain = false; await renderOnce(); } while (renderAgain); } finally { rendering = null; }
  })();
  return rendering;
}

let current = null;
let missed = null; // job events that arrive while a view loads: handed to it once it is drawn
async function renderOnce() {
  listeners.delete(current);
  missed = [];
  const hash = location.hash || "#/jobs";
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", hash.startsWith(`#/${a.dataset.nav}`)));
  const m = hash.match(/^#\/jobs\/(\d+)/);
  if (notice && (!m || Number(m[1]) !== notice.id)) notice = null;
  const u = hash.match(/^#\/tenants\/([^/?]+)\/users(?:\/([^/?]+))?/);
  try {
    current = m ? await jobView(Number(m[1]))
      : u ? await usersView(decodeURIComponent(u[1]), u[2] && decodeURIComponent(u[2]))
        : hash.startsWith("#/tenants") ? await tenantsView() : await jobsView(hash.startsWith("#/attention"));
    listeners.add(current);
    missed.forEach((job) => current(job));
  } catch (e) {
    if (e.status !== 401) $("#view").replaceChildren(el("p", { class: "error", "data-testid": "view-error" }, e.message));
  } finally {
    missed = null;
  }
}

async function attentionCount() {
  try {
    const [f, a] = await Promise.all([api("/v1/jobs?state=failed&limit=500"), api("/v1/jobs?state=needs_approval&limit=500")]);
    const n = f.jobs.length + a.jobs.length;
    $("#attention-count").textContent = n ? String(n) : "";
  } catch (e) { /* shown elsewhere */ }
}

async function start() {
  if (!token()) return showLogin();
  try {
    me = await api("/v1/whoami");
    $("#who").textContent = `${me.token} · ${me.role}${me.tenant ? ` · ${me.tenant}` : ""}`;
  } catch (e) { return; }
  window.addEventListener("hashchange", render);
  listeners.add(() => { clearTimeout(start.t); start.t = setTimeout(attentionCount, 300); });
  await render();
  attentionCount();
  stream();
}
window.addEventListener("DOMContentLoaded", start);
