"""The figures of bench/run.sh's JSON lines: each the median of its runs, with min-max and n."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]


def all_of(**kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]


def med(rs, key):
    """(median, min, max, n) of one field over runs; None when there are none."""
    vs = [r[key] for r in rs if r.get(key) is not None]
    return (statistics.median(vs), min(vs), max(vs), len(vs)) if vs else None


def fmt(m, unit="", digits=0):
    v, lo, hi, n = m
    return f"{v:,.{digits}f}{unit} (min {lo:,.{digits}f}, max {hi:,.{digits}f}, n={n})"


def ratio(a, b):
    return a[0] / b[0]


gw = med([r for r in all_of(system="graphile-worker", mode="default") if "jobs_per_s" in r], "jobs_per_s")
gwb = med([r for r in all_of(system="graphile-worker", mode="batched") if "jobs_per_s" in r], "jobs_per_s")
gwl = all_of(system="graphile-worker", test="add_to_start_latency")
drains = all_of(system="onramp", measure="throughput")


def subjects(r):
    """A drain's subjects; lines without the field are of the earlier bench (1,000 subjects)."""
    return r.get("subjects", 1000)


# each job its own subject, as graphile-worker's reference jobs (no queue)
independent = [r for r in drains if subjects(r) == r["jobs"]]
serialized = [r for r in drains if subjects(r) != r["jobs"]]
eng = med(independent, "jobs_per_s")
lat = all_of(system="onramp", measure="enqueue_to_start")
rec = med(all_of(system="onramp", measure="kill9_recovery"), "ratio_to_lease")
pg32 = med(all_of(system="pgbench-insert", clients=32, synchronous_commit="on"), "tps")
hook = all_of(system="onramp", measure="webhook_intake")
storm = all_of(system="onramp", measure="event_storm")
rss = all_of(system="onramp", measure="serve_rss")
recon = all_of(system="onramp", measure="full_reconcile")
bulk = all_of(system="onramp", measure="bulk_onboarding")
print()
# a drain's fixed costs (starting the workers, the first claims) weigh less in a longer one: the
# ratios hold only between drains of the same number of jobs
gw_drains = [r for r in all_of(system="graphile-worker") if "jobs_per_s" in r]
sizes = sorted({r["jobs"] for r in all_of(system="onramp", measure="throughput") + gw_drains})
if len(sizes) > 1:
    print(f"WARNING: throughput drains of different sizes ({sizes} jobs): their ratios mislead")
elif sizes:
    print(f"throughput drains: {sizes[0]:,} jobs each")
if eng and gw:
    print(f"engine no-op jobs/s, each job its own subject: onramp {fmt(eng)}"
          f" vs graphile-worker default {fmt(gw)} = {ratio(eng, gw):.2f}x")
if eng and gwb:
    print(f"  vs graphile-worker batched {fmt(gwb)} = {ratio(eng, gwb):.2f}x (target >= 1x)")
if gwb:
    for n in sorted({subjects(r) for r in serialized}):
        m = med([r for r in serialized if subjects(r) == n], "jobs_per_s")
        print(f"  the jobs over {n:,} subjects, each subject's one at a time: onramp {fmt(m)}"
              f" = {ratio(m, gwb):.2f}x graphile-worker batched (whose jobs wait for none)")
if eng and gwb:
    w = med(independent, "wal_bytes_per_job")
    wg = med([r for r in all_of(system="graphile-worker", mode="batched") if "wal_bytes_per_job" in r], "wal_bytes_per_job")
    if w and wg:
        print(f"  WAL per job while draining: onramp {fmt(w, ' B')}, graphile-worker batched {fmt(wg, ' B')}")
if lat:
    extra = ""
    if gwl:
        extra = f" (graphile-worker p50 {fmt(med(gwl, 'p50_ms'), ' ms', 1)})"
    print(f"enqueue -> step start: p50 {fmt(med(lat, 'p50_ms'), ' ms', 1)}, p99 {fmt(med(lat, 'p99_ms'), ' ms', 1)}{extra}")
if rec:
    print(f"kill -9 recovery: {fmt(rec, 'x the lease', 2)} (target <= 2x)")
if hook and pg32:
    h = med(hook, "deliveries_per_s")
    print(f"webhook intake at 32 clients: onramp {fmt(h, '/s')} vs pgbench INSERT {fmt(pg32, ' tps')}"
          f" = {ratio(h, pg32):.2f}x (target >= 1x); p99 {fmt(med(hook, 'p99_ms'), ' ms', 1)} (target <= 20 ms)")
if storm:
    print(f"event storm: {storm[0]['deliveries']} deliveries about one group, acknowledged in"
          f" {fmt(med(storm, 'seconds'), ' s', 1)} (target <= 10 s) -> reconcile jobs"
          f" {fmt(med(storm, 'reconcile_jobs'))} (target <= 2)")
if rss:
    print(f"onramp serve RSS: idle {fmt(med(rss, 'idle_mb'), ' MB', 1)} (target <= 40),"
          f" peak during intake {fmt(med(rss, 'peak_mb'), ' MB', 1)} (target <= 150)")
for r in recon:
    print(f"full reconcile, {r['users']} users / {r['tenants']} tenants, 1% drift ({r['slurm']} Slurm):"
          f" median {r['median_s']:.2f} s (min {r['min_s']:.2f}, max {r['max_s']:.2f}, n={r['runs']};"
          f" target <= 5 s), {r['slurm_reads']} Slurm read(s), {r['authentik_requests']} Authentik requests")
if bulk:
    a = med(bulk, "associations_verified_s")
    print(f"{bulk[0]['users']} users onboarded as webhooks: associations verified in {fmt(a, ' s', 1)},"
          f" every job succeeded in {fmt(med(bulk, 'onboardings_succeeded_s'), ' s', 1)};"
          f" the runbook one by one {fmt(med(bulk, 'runbook_one_by_one_s'), ' s')}"
          f" = {fmt(med(bulk, 'speedup'), 'x')} (targets >= 50x, <= 15 s)")
