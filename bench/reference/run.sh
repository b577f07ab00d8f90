#!/usr/bin/env bash
# Reference numbers to compare onramp against, on this machine's Postgres:
#   1. graphile-worker: no-op job throughput (default and batched settings) and
#      add->start latency at ~200 jobs/s;
#   2. pgbench: single-row INSERT of a webhook-delivery-shaped row at 1/8/32
#      clients, with synchronous_commit on (durable) and off (CPU ceiling).
# Prints one JSON line per result on stdout; progress goes to stderr.
# Env: BENCH_PG (admin URL), PGBENCH_SECONDS=10, BENCH_JOBS=100000 (the jobs each throughput drain
# works: the same number as onramp's engine bench, whose default it is), plus GW_* knobs of
# graphile/bench.js;
# BENCH_ONLY=pgbench skips graphile-worker (bench/run.sh intake).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export BENCH_PG="${BENCH_PG:-postgres://postgres@127.0.0.1:5432/postgres}"
secs="${PGBENCH_SECONDS:-10}"
# Other work on this 2-core box (e.g. cargo builds) skews every number below.
echo "load average at start: $(cut -d" " -f1-3 /proc/loadavg)" >&2

# --- graphile-worker --------------------------------------------------------
if [[ "${BENCH_ONLY:-}" != pgbench ]]; then
(cd "$here/graphile" && npm ci --silent --no-audit --no-fund >&2)
jobs="${BENCH_JOBS:-100000}"
echo "graphile-worker: throughput (default settings, $jobs jobs)" >&2
GW_JOBS="$jobs" node "$here/graphile/bench.js" throughput
echo "graphile-worker: throughput (batched: localQueue + completeJobBatchDelay, $jobs jobs)" >&2
GW_BATCH=1 GW_JOBS="$jobs" GW_PROCS=2 GW_CONCURRENCY=8 node "$here/graphile/bench.js" throughput
echo "graphile-worker: add->start latency" >&2
node "$here/graphile/bench.js" latency
fi

# --- pgbench single-row INSERT ----------------------------------------------
db="bench_pgbench_$$"
db_url="${BENCH_PG%/*}/$db"
psql -q "$BENCH_PG" -c "CREATE DATABASE $db"
trap 'psql -q "$BENCH_PG" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
psql -q "$db_url" -c "CREATE TABLE webhook_delivery (
  id          text PRIMARY KEY,
  received_at timestamptz NOT NULL DEFAULT now(),
  body        jsonb NOT NULL)"
# synchronous_commit=on is the real (durable) number and follows this VM's fsync
# latency, which drifts a lot; =off shows the CPU-bound ceiling without the flush.
for sc in on off; do
  for c in 1 8 32; do
    echo "pgbench: INSERT, $c clients, ${secs}s, synchronous_commit=$sc" >&2
    psql -q "$db_url" -c "TRUNCATE webhook_delivery" -c "CHECKPOINT"
    # the run's WAL range (bench/wal-profile.sh breaks it down by record type)
    lsn0="$(psql -Atq "$db_url" -c "select pg_current_wal_lsn()")"
    out="$(PGOPTIONS="-c synchronous_commit=$sc" \
      pgbench -n -f "$here/pgbench/insert.sql" -c "$c" -j 2 -T "$secs" "$db_url" 2>&1)" \
      || { echo "$out" >&2; exit 1; }
    lsn1="$(psql -Atq "$db_url" -c "select pg_current_wal_lsn()")"
    tps="$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")"
    lat="$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$out")"
    n="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")"
    printf '{"system":"pgbench-insert","clients":%s,"tps":%.0f,"latency_avg_ms":%s,"synchronous_commit":"%s","seconds":%s,"transactions":%s,"wal_from":"%s","wal_to":"%s"}\n' \
      "$c" "$tps" "$lat" "$sc" "$secs" "$n" "$lsn0" "$lsn1"
  done
done
