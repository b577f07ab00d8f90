// onramp dashboard: jobs list with live updates, job detail with retry/cancel/approve, tenants.
// Everything comes from /v1 with the bearer token kept in this tab's sessionStorage.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(k ?? ""));
  return e;
};
const token = () => sessionStorage.getItem("onramp-token") || "";
const CLOSED = ["succeeded", "cancelled"];

async function api(path, opts = {}) {
  const res = await fetch(path, { ...opts, headers: { Authorization: `Bearer ${token()}`, ...(opts.headers || {}) } });
  if (res.status === 401) { showLogin("The token was refused."); throw new Error("unauthorized"); }
  const body = res.headers.get("content-type")?.includes("json") ? await res.json() : null;
  if (!res.ok) throw new Error(body?.detail || `${res.status} ${res.statusText}`);
  return body;
}

function ago(ts) {
  if (!ts) return "";
  const s = Math.round((Date.now() - new Date(ts)) / 1000);
  const abs = Math.abs(s);
  const txt = abs < 60 ? `${abs}s` : abs < 3600 ? `${Math.round(abs / 60)}m` : abs < 86400 ? `${Math.round(abs / 3600)}h` : `${Math.round(abs / 86400)}d`;
  return s >= 0 ? `${txt} ago` : `in ${txt}`;
}
const badge = (state) => el("span", { class: `badge s-${state}`, "data-testid": "state" }, state.replace("_", " "));
function next(job) {
  if (job.state === "pending" || job.state === "waiting") return ago(job.run_at);
  if (job.state === "running") return `lease ${ago(job.run_at)}`;
  return "";
}

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
  for (;;) {
    let ended = false; // the server ended the stream (its lifetime): reconnect soon
    try {
      const res = await fetch("/v1/stream", { headers: { Authorization: `Bearer ${token()}` } });
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
          if (chunk.includes("event: job") && data) { const job = JSON.parse(data); listeners.forEach((f) => f(job)); }
        }
      }
    } catch (e) { /* reconnect below */ }
    $("#live").classList.remove("on");
    await new Promise((r) => setTimeout(r, ended ? 200 : 2000));
  }
}

// ---- jobs list ----
function jobRow(job) {
  return el("tr", { class: "job", "data-job": job.id, onclick: () => (location.hash = `#/jobs/${job.id}`) },
    el("td", {}, `#${job.id}`), el("td", {}, badge(job.state)), el("td", { class: "hide-sm" }, job.kind),
    el("td", {}, job.subject), el("td", { "data-testid": "step" }, job.step),
    el("td", { class: "hide-sm" }, String(job.attempt)), el("td", { class: "hide-sm" }, next(job)),
    el("td", { class: "hide-sm muted" }, ago(job.created_at)));
}

async function jobsView(attention) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const form = el("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); const p = new URLSearchParams(new FormData(form)); for (const [k, v] of [...p]) if (!v) p.delete(k); location.hash = `#/jobs?${p}`; } },
    el("select", { name: "state", "aria-label": "state" }, el("option", { value: "" }, "any state"),
      ...["pending", "running", "waiting", "needs_approval", "failed", "succeeded", "cancelled"].map((s) => el("option", { value: s, ...(params.get("state") === s ? { selected: "" } : {}) }, s))),
    el("input", { name: "kind", placeholder: "kind", value: params.get("kind") || "" }),
    el("input", { name: "subject", placeholder: "subject or tenant/", value: params.get("subject") || "" }),
    el("button", { type: "submit" }, "Filter"));
  const tbody = el("tbody", { id: "jobs" });
  const table = el("table", {}, el("thead", {}, el("tr", {}, ...["Job", "State", "Kind", "Subject", "Step", "Attempt", "Next", "Age"].map((h, i) => el("th", { class: [2, 5, 6, 7].includes(i) ? "hide-sm" : null }, h)))), tbody);
  $("#view").replaceChildren(el("h1", {}, attention ? "Needs attention" : "Jobs"), attention ? "" : form, table);
  let jobs;
  if (attention) {
    const [f, a] = await Promise.all([api("/v1/jobs?state=failed&limit=200"), api("/v1/jobs?state=needs_approval&limit=200")]);
    jobs = [...f.jobs, ...a.jobs];
  } else {
    const q = new URLSearchParams(params); q.set("limit", "100");
    jobs = (await api(`/v1/jobs?${q}`)).jobs;
  }
  tbody.replaceChildren(...jobs.map(jobRow));
  if (!jobs.length) tbody.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No jobs.")));
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

// ---- one job ----
async function act(id, action) {
  try { await api(`/v1/jobs/${id}/${action}`, { method: "POST" }); } catch (e) { $("#action-error").textContent = e.message; }
  await render();
}

async function jobView(id) {
  const { job, steps, events } = await api(`/v1/jobs/${id}`);
  const actions = el("div", { class: "actions" },
    job.state === "failed" ? el("button", { class: "primary", "data-testid": "retry", onclick: () => act(id, "retry") }, "Retry from failed step") : "",
    job.state === "needs_approval" ? el("button", { class: "primary", "data-testid": "approve", onclick: () => act(id, "approve") }, "Approve") : "",
    !CLOSED.includes(job.state) ? el("button", { class: "danger", "data-testid": "cancel", onclick: () => confirm(`Cancel job #${id}?`) && act(id, "cancel") }, "Cancel") : "");
  const json = (v) => (v === null || v === undefined ? "" : el("pre", {}, JSON.stringify(v, null, 2)));
  // the commands and requests an attempt made; changes marked +
  const effects = (list) => (!list || !list.length ? "" : el("ul", { class: "effects", "data-testid": "effects" },
    ...list.map((e) => el("li", { class: e.write ? "write" : "read" },
      el("span", { class: "sys" }, `${e.write ? "+" : " "} ${e.system}`), el("code", {}, e.call)))));
  $("#view").replaceChildren(
    el("p", {}, el("a", { href: "#/jobs" }, "← all jobs")),
    el("div", { class: "card" },
      el("h1", {}, `#${job.id} ${job.kind} `, badge(job.state)),
      el("dl", {},
        el("dt", {}, "Subject"), el("dd", {}, job.subject),
        el("dt", {}, "Step"), el("dd", { "data-testid": "current-step" }, `${job.step} (attempt ${job.attempt})`),
        CLOSED.includes(job.state) || job.state === "failed"
          ? [el("dt", {}, "Finished"), el("dd", {}, job.finished_at ? `${job.finished_at} (${ago(job.finished_at)})` : "")]
          : [el("dt", {}, job.state === "running" ? "Lease until" : "Due"), el("dd", {}, `${job.run_at} (${ago(job.run_at)})`)],
        el("dt", {}, "Created"), el("dd", {}, `${job.created_at} by ${job.created_by}`),
        job.approved_by ? [el("dt", {}, "Approved by"), el("dd", {}, job.approved_by)] : [],
        job.last_error ? [el("dt", {}, "Last error"), el("dd", { class: "error", "data-testid": "last-error" }, job.last_error)] : []),
      actions, el("p", { id: "action-error", class: "error" })),
    el("h2", {}, "Steps and attempts"),
    el("table", { class: "steps", "data-testid": "steps" },
      el("thead", {}, el("tr", {}, ...["Step", "Attempt", "Worker", "Started", "Took", "Outcome", "Error / calls / output"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...steps.map((r) => el("tr", {},
        el("td", {}, r.step), el("td", {}, String(r.attempt)), el("td", { class: "muted" }, r.worker),
        el("td", {}, r.started_at), el("td", {}, r.finished_at ? `${((new Date(r.finished_at) - new Date(r.started_at)) / 1000).toFixed(2)}s` : "running"),
        el("td", {}, r.outcome ? badge(r.outcome) : "", r.next_run_at ? el("div", { class: "muted" }, `next ${ago(r.next_run_at)}`) : ""),
        el("td", {}, r.error ? el("div", { class: "error" }, r.error) : "", effects(r.effects), json(r.output)))))),
    el("h2", {}, "Audit trail"),
    el("table", { "data-testid": "events" },
      el("thead", {}, el("tr", {}, ...["When", "Change", "Step", "By", "Detail"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...events.map((e) => el("tr", {},
        el("td", {}, e.at), el("td", {}, `${e.from_state ?? "—"} → ${e.to_state}`), el("td", {}, e.step ?? ""),
        el("td", {}, e.actor), el("td", { class: "muted" }, e.detail ?? ""))))));
  let timer;
  return (changed) => { if (changed.id === job.id) { clearTimeout(timer); timer = setTimeout(render, 150); } };
}

// ---- tenants ----
const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
function tenantCard(t) {
  const dd = (testid, ...kids) => el("dd", { "data-testid": testid }, ...kids);
  const limits = [t.limits.fairshare != null ? `Fairshare ${t.limits.fairshare}` : "",
    t.limits.grp_tres ? `GrpTRES ${t.limits.grp_tres}` : "", t.limits.grp_jobs != null ? `GrpJobs ${t.limits.grp_jobs}` : ""]
    .filter(Boolean).join(" · ") || "none";
  const m = t.members;
  const members = m
    ? [el("strong", { "data-testid": "members" }, String(m.members)), ` in ${t.group} · `,
      el("span", { "data-testid": "associations" }, plural(m.associations, "Slurm association")),
      el("div", { class: "muted" }, `measured ${ago(m.measured_at)} by reconcile `, el("a", { href: `#/jobs/${m.job}` }, `#${m.job}`))]
    : [el("span", { class: "muted", "data-testid": "members" }, "not measured yet (no reconcile has run)")];
  const f = t.jobs_in_flight;
  const kinds = Object.entries(f.by_kind).map(([k, n]) => `${k} ${n}`).join(" · ");
  const flight = [el("a", { href: `#/jobs?subject=${encodeURIComponent(t.name)}%2F`, "data-testid": "in-flight" }, String(f.total)),
    f.needs_attention ? el("span", { class: "badge s-failed" }, `${f.needs_attention} need attention`) : "",
    kinds ? el("div", { class: "muted" }, kinds) : ""];
  const d = t.drift;
  let drift;
  if (!d) drift = [el("span", { class: "muted", "data-testid": "drift" }, "no reconcile yet")];
  else {
    const parts = [d.onboard ? `${d.onboard} to onboard` : "", d.offboard ? `${d.offboard} to offboard` : "",
      d.held ? `${d.held} held for approval` : "", d.skipped ? `${d.skipped} skipped` : ""].filter(Boolean);
    drift = [el("span", { class: `badge ${parts.length ? "s-needs_approval" : "s-succeeded"}`, "data-testid": "drift" }, parts.join(" · ") || "in sync"),
      el("div", { class: "muted" }, `${ago(d.measured_at)}${d.reason ? ` · ${d.reason}` : ""}`)];
  }
  const q = t.quotas;
  const quota = (name, x) => (x ? `${name} ${x.soft}/${x.hard}` : "");
  return el("div", { class: "card tenant", "data-tenant": t.name },
    el("h2", {}, t.name, t.description ? el("span", { class: "muted" }, ` · ${t.description}`) : ""),
    el("dl", {},
      el("dt", {}, "Members"), dd("members-line", ...members),
      el("dt", {}, "Jobs in flight"), dd("flight-line", ...flight),
      el("dt", {}, "Drift"), dd("drift-line", ...drift),
      el("dt", {}, "Limits"), dd("limits", limits),
      el("dt", {}, "Teams"), dd("teams", t.teams.length ? t.teams.map((x) => `${x.account} (${x.group})`).join(", ") : `none (all in ${t.default_account})`),
      el("dt", {}, "Quotas"), dd("quotas", [quota("home", q.home), quota("scratch", q.scratch)].filter(Boolean).join(" · ") || "none"),
      el("dt", {}, "Kubernetes"), dd("kubernetes", ...k8sNames(t.kubernetes))));
}

// The names onramp uses in the tenant's namespace and on its nodes (from the tenant registry).
function k8sNames(k) {
  const login = k.login_pod ? `pod/${k.login_pod}` : `a Ready pod of deploy/${k.login_deployment}`;
  const res = k.reservation_namespace ? `${k.reservation_namespace}/${k.reservation}` : `${k.reservation} (cluster-scoped)`;
  const line = (testid, text) => el("div", { "data-testid": testid }, text);
  return [line("k8s-namespace", `namespace ${k.namespace}`), line("k8s-secret", `secret ${k.keys_secret}`),
    line("k8s-login", `login ${login}${k.login_container ? ` -c ${k.login_container}` : ""} · deploy/${k.login_deployment}`),
    line("k8s-cluster", `slurmcluster ${k.slurm_cluster}`), line("k8s-reservation", `reservation ${res}`),
    line("k8s-nodes", `nodes reserved.tenant=${k.node_label}`)];
}

async function tenantsView() {
  const { tenants } = await api("/v1/tenants");
  const grid = el("div", { class: "tenants" }, ...tenants.map(tenantCard));
  $("#view").replaceChildren(el("h1", {}, "Tenants"), tenants.length ? grid : el("p", { class: "muted" }, "No tenants."));
  let timer;
  return () => { clearTimeout(timer); timer = setTimeout(render, 500); };
}

// ---- routing ----
let current = null;
async function render() {
  listeners.delete(current);
  const hash = location.hash || "#/jobs";
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", hash.startsWith(`#/${a.dataset.nav}`)));
  try {
    const m = hash.match(/^#\/jobs\/(\d+)/);
    current = m ? await jobView(Number(m[1])) : hash.startsWith("#/tenants") ? await tenantsView() : await jobsView(hash.startsWith("#/attention"));
    listeners.add(current);
  } catch (e) {
    if (e.message !== "unauthorized") $("#view").replaceChildren(el("p", { class: "error" }, e.message));
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
    const me = await api("/v1/whoami");
    $("#who").textContent = `${me.token} · ${me.role}${me.tenant ? ` · ${me.tenant}` : ""}`;
  } catch (e) { return; }
  window.addEventListener("hashchange", render);
  listeners.add(() => { clearTimeout(start.t); start.t = setTimeout(attentionCount, 300); });
  await render();
  attentionCount();
  stream();
}
start();
