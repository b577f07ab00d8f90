#!/usr/bin/env bash
# onramp side by side with its references, in one run on this machine's PostgreSQL:
# graphile-worker and pgbench (bench/reference/run.sh), then onramp's engine, webhook intake and
# full reconcile benchmarks (release build), then the ratios. JSON lines go to bench/results.jsonl.
#   bench/run.sh          (BENCH_PG overrides the admin URL)
#   bench/run.sh intake   (only pgbench and the intake bench: intake, event storm, RSS)
# ONRAMP_BENCH_SMOKE=1 makes the intake bench seconds long (results still checked).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results.jsonl
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo build --release --quiet
if [[ "${1:-}" == intake ]]; then
    BENCH_ONLY=pgbench bench/reference/run.sh | tee "$out"
else
    bench/reference/run.sh | tee "$out"
    cargo bench --quiet --bench engine | grep '^{' | tee -a "$out"
fi
cargo bench --quiet --bench intake | grep '^{' | tee -a "$out"
if [[ "${1:-}" != intake ]]; then
    # the full reconcile reads (and seeds, and cleans up) the shared Slurm test cluster: build
    # first, then only the run under the cluster's lock (ONRAMP_BENCH_SLURM=sim: a simulated slurmdbd)
    scripts/slurm-test-cluster.sh start >&2
    cargo bench --quiet --no-run --bench reconcile
    flock /tmp/onramp-slurm.lock cargo bench --quiet --bench reconcile | grep '^{' | tee -a "$out"
    # end to end through the shipped binary: the system test's world (root, the Slurm test cluster)
    ONRAMP_BIN=target/release/onramp ONRAMP_FAKES_BIN=target/release/onramp-fakes \
        ONRAMP_BENCH_USERS=${BENCH_USERS:-1000} flock /tmp/onramp-slurm.lock \
        cargo test --quiet --locked --test system bench:: -- --nocapture | grep '^{' | tee -a "$out"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def find(**kw):
    return next((r for r in rows if all(r.get(k) == v for k, v in kw.items())), None)
gw = find(system="graphile-worker", mode="default")
gwl = find(system="graphile-worker", test="add_to_start_latency")
pg32 = find(system="pgbench-insert", clients=32, synchronous_commit="on")
eng = find(system="onramp", measure="throughput")
lat = find(system="onramp", measure="enqueue_to_start")
rec = find(system="onramp", measure="kill9_recovery")
hook = find(system="onramp", measure="webhook_intake")
recon = find(system="onramp", measure="full_reconcile")
storm = find(system="onramp", measure="event_storm")
rss = find(system="onramp", measure="serve_rss")
print()
if gw and eng:
    print(f"engine no-op jobs/s: onramp {eng['jobs_per_s']:.0f} vs graphile-worker {gw['jobs_per_s']:.0f}"
          f" = {eng['jobs_per_s'] / gw['jobs_per_s']:.2f}x (target >= 2x)")
if lat:
    extra = f" (graphile-worker p50 {gwl['p50_ms']:.1f} / p99 {gwl['p99_ms']:.1f} ms)" if gwl else ""
    print(f"enqueue -> step start: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms (targets 5 / 25 ms){extra}")
if rec:
    print(f"kill -9 recovery: {rec['recovered_ms']} ms = {rec['ratio_to_lease']:.2f}x the lease (target <= 2x)")
if hook and pg32:
    print(f"webhook intake at 32 clients: onramp {hook['deliveries_per_s']:.0f}/s vs pgbench INSERT {pg32['tps']:.0f} tps"
          f" = {hook['deliveries_per_s'] / pg32['tps']:.2f}x (target >= 1x); p99 {hook['p99_ms']:.1f} ms (target <= 20 ms)")
if recon:
    print(f"full reconcile, {recon['users']} users / {recon['tenants']} tenants, 1% drift ({recon['slurm']} Slurm):"
          f" median {recon['median_s']:.2f} s (min {recon['min_s']:.2f}, max {recon['max_s']:.2f}, {recon['runs']} runs;"
          f" target <= 5 s), {recon['slurm_reads']} Slurm read(s), {recon['authentik_requests']} Authentik requests,"
          f" {recon['onboard_jobs']} onboardings + {recon['offboard_jobs']} offboardings enqueued")
bulk = find(system="onramp", measure="bulk_onboarding")
if bulk:
    print(f"{bulk['users']} users onboarded as webhooks: associations verified in {bulk['associations_verified_s']:.1f} s"
          f" ({bulk['sacctmgr_add_user_calls']} add-user calls), every job succeeded in {bulk['onboardings_succeeded_s']:.1f} s;"
          f" the runbook one by one: {bulk['runbook_one_by_one_s']:.0f} s = {bulk['speedup']:.0f}x (targets >= 50x, <= 15 s)")
if storm:
    print(f"event storm: {storm['acknowledged']} of {storm['deliveries']} deliveries about one group acknowledged"
          f" in {storm['seconds']:.1f} s (target <= 10 s) -> {storm['reconcile_jobs']} reconcile job(s) (target <= 2)")
if rss:
    print(f"onramp serve RSS: idle {rss['idle_mb']:.1f} MB (target <= 40), peak during intake {rss['peak_mb']:.1f} MB"
          f" (VmHWM {rss['hwm_mb']:.1f}; target <= 150)")
PY
