#!/usr/bin/env bash
# onramp side by side with its references, in one run on this machine's PostgreSQL:
# graphile-worker and pgbench (bench/reference/run.sh), then onramp's engine, webhook intake,
# end-to-end onboarding and full reconcile benchmarks (release build), then the ratios. Every
# figure is measured BENCH_RUNS times (default 3) and reported as the median with its spread.
# JSON lines go to bench/results.jsonl.
#   bench/run.sh          (BENCH_PG overrides the admin URL)
#   bench/run.sh intake   (only pgbench and the intake bench: intake, event storm, RSS)
#   bench/run.sh core     (the references, the engine and the intake: no Slurm test cluster)
# BENCH_JOBS (default 100000): no-op jobs of one throughput drain, the same for onramp's engine
# and both graphile-worker modes. BENCH_USERS (default 1000): users of the end-to-end figure.
# scripts/bench-smoke runs every bench seconds long (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results.jsonl
runs=${BENCH_RUNS:-3}
export BENCH_JOBS=${BENCH_JOBS:-100000}
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo build --release --quiet --workspace --bins
cargo bench --quiet --no-run --bench engine --bench intake --bench reconcile
: > "$out"
repeat() { for i in $(seq "$runs"); do echo "run $i of $runs: $*" >&2; "$@"; done; }
if [[ "${1:-}" == intake ]]; then
    BENCH_ONLY=pgbench repeat bench/reference/run.sh | tee -a "$out"
else
    repeat bench/reference/run.sh | tee -a "$out"
    repeat cargo bench --quiet --bench engine | grep '^{' | tee -a "$out"
fi
repeat cargo bench --quiet --bench intake | grep '^{' | tee -a "$out"
if [[ "${1:-}" != intake && "${1:-}" != core ]]; then
    scripts/slurm-test-cluster.sh start >&2
    # end to end through the shipped binary: the system test's world (root, the Slurm test cluster,
    # a real SMTP server for the welcome mail). It runs before the full reconcile: after that
    # bench's seeding and clean-up of 10,000 users, MariaDB was still purging their undo (half a
    # core, every `sacctmgr add user` slower), and the end-to-end figure came out 1.8x slower
    # than before it, its reference 1.3x (BENCHMARKS.md, 2026-12-07 10:24)
    scripts/ensure-python-module.sh aiosmtpd
    e2e() {
        ONRAMP_BIN=target/release/onramp ONRAMP_FAKES_BIN=target/release/onramp-fakes \
            ONRAMP_BENCH_USERS=${BENCH_USERS:-1000} flock /tmp/onramp-slurm.lock \
            cargo test --quiet --locked --test system bench:: -- --nocapture | grep '^{'
    }
    repeat e2e | tee -a "$out"
    # the full reconcile reads (and seeds, and cleans up) the shared Slurm test cluster: only the
    # run under the cluster's lock (ONRAMP_BENCH_SLURM=sim: a simulated slurmdbd); it repeats itself
    flock /tmp/onramp-slurm.lock cargo bench --quiet --bench reconcile | grep '^{' | tee -a "$out"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 bench/summary.py "$out"
