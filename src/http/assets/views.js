// onramp dashboard: the tenants overview and each tenant's users (GET /v1/tenants/{t}/users).
// Uses el, api, when, badge, jobRow and jobTable from app.js (loaded after this file; all run
// once the page has loaded).
"use strict";

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
      el("div", { class: "muted", "data-testid": "members-as-of" }, when(m.as_of ?? m.measured_at, "as of "), " (reconcile ",
        el("a", { href: `#/jobs/${m.job}` }, `#${m.job}`), ")")]
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
      el("div", { class: "muted", "data-testid": "drift-as-of" }, when(d.as_of ?? d.measured_at, "as of "), d.reason ? ` · ${d.reason}` : "")];
  }
  const q = t.quotas;
  const quota = (name, x) => (x ? `${name} ${x.soft}/${x.hard}` : "");
  return el("div", { class: "card tenant", "data-tenant": t.name },
    el("h2", {}, t.name, t.description ? el("span", { class: "muted" }, ` · ${t.description}`) : ""),
    el("p", {}, el("a", { href: `#/tenants/${encodeURIComponent(t.name)}/users`, "data-testid": "users-link" }, "Users and their state →")),
    el("dl", { class: "wrap" },
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

// Counts come from a reconcile: re-read them whenever a job changes (an onboarding or offboarding
// that finished changes them) and show their age.
async function tenantsView() {
  const { tenants } = await api("/v1/tenants");
  const grid = el("div", { class: "tenants" }, ...tenants.map(tenantCard));
  $("#view").replaceChildren(el("h1", {}, "Tenants"), tenants.length ? grid : el("p", { class: "muted" }, "No tenants."));
  let timer;
  return () => { clearTimeout(timer); timer = setTimeout(render, 500); };
}

// ---- users of a tenant ----
const USER_STATE = {
  onboarded: "succeeded", onboarding: "running", waiting_for_key: "waiting", waiting_for_approval: "needs_approval",
  failed: "failed", blocked: "needs_approval", in_retention: "waiting", offboarding: "running", offboarded: "cancelled",
  not_onboarded: "pending",
};
const userBadge = (state) => el("span", { class: `badge s-${USER_STATE[state] ?? state}`, "data-testid": "user-state" }, state.replaceAll("_", " "));
const assocText = (a) => (a ? `${a.account}${Object.keys(a.limits || {}).length ? ` · ${Object.entries(a.limits).map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : v}`).join(" · ")}` : ""}` : "none");
const memberText = (m) => (m === true ? "yes" : m === false ? "no" : "unknown");
const userHref = (tenant, name) => `#/tenants/${encodeURIComponent(tenant)}/users/${encodeURIComponent(name)}`;

function userRow(tenant, u) {
  return el("tr", { class: "job", "data-user": u.username },
    td("User", {}, el("a", { class: "row-link", href: userHref(tenant, u.username) }, u.username)),
    td("State", {}, userBadge(u.state)),
    td("Why", { class: "reason", "data-testid": "user-reason" }, u.reason ?? ""),
    td("Member", {}, memberText(u.member)),
    td("Association", { class: "wrap" }, assocText(u.association)),
    td("Updated", { class: "muted" }, when(u.updated_at)));
}

async function usersView(tenant, username) {
  const back = el("p", {}, el("a", { href: "#/tenants" }, "← tenants"), username ? [" · ", el("a", { href: `#/tenants/${encodeURIComponent(tenant)}/users` }, `users of ${tenant}`)] : "");
  const title = el("h1", { class: "wrap" }, username ? `${username} in ${tenant}` : `Users of ${tenant}`);
  let body;
  try {
    body = username ? await userDetail(tenant, username) : await userList(tenant);
  } catch (e) {
    if (e.status === 401) throw e;
    const what = username ? `${username} in ${tenant}` : `the users of ${tenant}`;
    const hint = e.status === 404 && !username ? " (this server does not serve the users API, or the tenant is not one you can see)" : "";
    body = [el("p", { class: "error", "data-testid": "users-error" }, `Could not load ${what}: ${e.message}${hint}`)];
  }
  $("#view").replaceChildren(back, title, ...body);
  let timer;
  return (job) => { if (job.tenant === tenant || job.subject?.startsWith(`${tenant}/`)) { clearTimeout(timer); timer = setTimeout(render, 500); } };
}

async function userList(tenant) {
  const r = await api(`/v1/tenants/${encodeURIComponent(tenant)}/users`);
  const tbody = el("tbody", {}, ...r.users.map((u) => userRow(tenant, u)));
  if (!r.users.length) tbody.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No users known.")));
  return [el("p", { class: "muted", "data-testid": "users-as-of" },
    r.as_of ? ["Membership and associations ", when(r.as_of, "as of "), " (the latest reconcile); states from jobs, live."]
      : "No reconcile has read this tenant yet; states from jobs, live."),
  el("table", { class: "stack users", "data-testid": "users" },
    el("thead", {}, el("tr", {}, ...["User", "State", "Why", "Member", "Association", "Updated"].map((h) => el("th", {}, h)))), tbody)];
}

async function userDetail(tenant, username) {
  const u = await api(`/v1/tenants/${encodeURIComponent(tenant)}/users/${encodeURIComponent(username)}`);
  const a = u.association;
  const tbody = el("tbody", { id: "jobs" }, ...(u.jobs || []).map(jobRow));
  return [el("div", { class: "card", "data-user": u.username },
    el("dl", { class: "wrap" },
      el("dt", {}, "State"), el("dd", {}, userBadge(u.state)),
      el("dt", {}, "Why"), el("dd", { "data-testid": "user-reason" }, u.reason ?? ""),
      u.step ? [el("dt", {}, "Step"), el("dd", {}, u.step)] : [],
      u.job ? [el("dt", {}, "From job"), el("dd", {}, el("a", { href: `#/jobs/${u.job}` }, `#${u.job}`))] : [],
      u.retention_until ? [el("dt", {}, "In retention until"), el("dd", {}, u.retention_until, " (", when(u.retention_until), ")")] : [],
      el("dt", {}, "Group member"), el("dd", {}, memberText(u.member)),
      el("dt", {}, "Association"), el("dd", { "data-testid": "association" }, assocText(a), a?.read_at ? el("div", { class: "muted" }, when(a.read_at, "read ")) : ""),
      el("dt", {}, "Updated"), el("dd", {}, when(u.updated_at)))),
  el("h2", {}, "Jobs"), jobTable(tbody)];
}
