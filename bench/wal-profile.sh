#!/usr/bin/env bash
# Where the WAL of a unit of work goes, record type by record type, onramp beside its reference
# in the same run on this machine's PostgreSQL (pg_walinspect, a contrib extension, created in a
# scratch database; a replication slot keeps the WAL until it is read; both dropped afterwards).
#   engine: one drain of graphile-worker's batched mode and one of onramp's engine (bench/run.sh's
#           throughput figures: jobs enqueued up front, timed until all are done); per job
#   intake: pgbench's single-row INSERT at 32 clients (bench/reference/run.sh) and onramp's
#           signed webhook intake at 32 clients until its pump caught up (benches/intake.rs);
#           per row, per delivery
# Each run prints its WAL range; this reads every record in it (the whole server's: nothing else
# should run). A count of what PostgreSQL writes per unit, which bounds the throughput: see
# BENCHMARKS.md.
#   bench/wal-profile.sh [engine|intake|graphile|onramp]   (default engine; BENCH_JOBS=100000)
#   BENCH_SETUP_SQL='drop index jobs_tenant' bench/wal-profile.sh onramp   (an A/B of the schema)
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_PG=${BENCH_PG:-postgres://postgres@127.0.0.1:5432/postgres}
jobs=${BENCH_JOBS:-100000}
which=${1:-engine}
scratch="${BENCH_PG%/*}/bench_walinspect"
psql -qX "$BENCH_PG" -c "drop database if exists bench_walinspect with (force)" -c "create database bench_walinspect"
# the slot keeps every WAL segment from its creation on: it must not outlive the run (a run
# killed before its cleanup left one: dropped here first)
drop_slot() {
    psql -qX "$BENCH_PG" -c "select pg_drop_replication_slot('onramp_wal_profile')
                             from pg_replication_slots where slot_name = 'onramp_wal_profile'" >/dev/null
}
cleanup() {
    drop_slot
    psql -qX "$BENCH_PG" -c "drop database if exists bench_walinspect with (force)"
}
trap cleanup EXIT
psql -qX "$scratch" -c "create extension pg_walinspect"
drop_slot
# holds the runs' WAL until it is read (a checkpoint would recycle it)
psql -qX "$BENCH_PG" -c "select pg_create_physical_replication_slot('onramp_wal_profile', true)" >/dev/null

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# a run's JSON line, the field that counts its units -> the WAL records of its range per unit
profile() {
    local line=$1 n from to
    n=$(field "$line" "$2")
    from=$(field "$line" wal_from)
    to=$(field "$line" wal_to)
    echo "$(field "$line" system): $n $2 $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print({k: d[k] for k in ("jobs_per_s", "deliveries_per_s", "tps") if k in d})' "$line")"
    psql -qX "$scratch" -v from="$from" -v to="$to" -v n="$n" <<'SQL'
select round(pg_wal_lsn_diff(:'to', :'from') / :n) as wal_bytes_per_unit;
select "resource_manager/record_type" as record, round(count::numeric / :n, 2) as per_unit,
       round(record_size::numeric / :n) as bytes_per_unit, round(fpi_size::numeric / :n) as fpi_bytes_per_unit
from pg_get_wal_stats(:'from', :'to', true)
where count > 0 order by combined_size desc;
SQL
}

if [[ "$which" == engine || "$which" == graphile ]]; then
    (cd bench/reference/graphile && npm ci --silent --no-audit --no-fund >&2)
    profile "$(GW_BATCH=1 GW_RUNS=1 GW_JOBS="$jobs" GW_PROCS=2 GW_CONCURRENCY=8 \
        node bench/reference/graphile/bench.js throughput)" jobs
fi
if [[ "$which" == engine || "$which" == onramp ]]; then
    cargo bench --quiet --no-run --bench engine
    profile "$(BENCH_ONLY=throughput BENCH_JOBS="$jobs" cargo bench --quiet --bench engine | grep '^{')" jobs
fi
if [[ "$which" == intake ]]; then
    cargo build --release --quiet --bin onramp
    cargo bench --quiet --no-run --bench intake
    profile "$(BENCH_ONLY=pgbench PGBENCH_SECONDS=20 bench/reference/run.sh \
        | grep '"clients":32,' | grep '"synchronous_commit":"on"')" transactions
    profile "$(cargo bench --quiet --bench intake | grep '"measure":"webhook_intake"')" deliveries
fi
