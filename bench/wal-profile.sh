#!/usr/bin/env bash
# Where a drained job's WAL goes, record type by record type: graphile-worker's batched mode and
# onramp's engine, one drain each, in the same run on this machine's PostgreSQL (pg_walinspect,
# a contrib extension, created in a scratch database it drops afterwards; a replication slot keeps
# the WAL until it is read, dropped afterwards too). The drains are
# bench/run.sh's throughput figures (jobs enqueued up front, then timed until all are done); each
# prints its WAL range and this reads every record in it (the whole server's: nothing else should
# run). A count of what PostgreSQL writes per job, which bounds the throughput: see BENCHMARKS.md.
#   bench/wal-profile.sh                         (BENCH_JOBS=20000, BENCH_PG: the admin URL)
#   BENCH_SETUP_SQL='drop index jobs_tenant' bench/wal-profile.sh onramp   (an A/B of the schema)
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_PG=${BENCH_PG:-postgres://postgres@127.0.0.1:5432/postgres}
jobs=${BENCH_JOBS:-20000}
which=${1:-both}
scratch="${BENCH_PG%/*}/bench_walinspect"
psql -qX "$BENCH_PG" -c "drop database if exists bench_walinspect" -c "create database bench_walinspect"
# a replication slot holds the drains' WAL until it is read (a checkpoint would recycle it)
cleanup() {
    psql -qX "$BENCH_PG" -c "select pg_drop_replication_slot('onramp_wal_profile')
                             from pg_replication_slots where slot_name = 'onramp_wal_profile'" >/dev/null
    psql -qX "$BENCH_PG" -c "drop database if exists bench_walinspect with (force)"
}
trap cleanup EXIT
psql -qX "$scratch" -c "create extension pg_walinspect"
psql -qX "$BENCH_PG" -c "select pg_create_physical_replication_slot('onramp_wal_profile', true)" >/dev/null

field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# one drain's JSON line -> its figures, then the WAL records of its range per job
profile() {
    local line=$1 n from to
    n=$(field "$line" jobs)
    from=$(field "$line" wal_from)
    to=$(field "$line" wal_to)
    printf "%s: %s jobs, %.0f jobs/s, %.0f B of WAL a job\n" "$(field "$line" system)" "$n" "$(field "$line" jobs_per_s)" "$(field "$line" wal_bytes_per_job)"
    psql -qX "$scratch" -v from="$from" -v to="$to" -v n="$n" <<'SQL'
select "resource_manager/record_type" as record, round(count::numeric / :n, 2) as per_job,
       round(record_size::numeric / :n) as bytes_per_job, round(fpi_size::numeric / :n) as fpi_bytes_per_job
from pg_get_wal_stats(:'from', :'to', true)
where count > 0 order by combined_size desc;
SQL
}

if [[ "$which" == both || "$which" == graphile ]]; then
    (cd bench/reference/graphile && npm ci --silent --no-audit --no-fund >&2)
    line=$(GW_BATCH=1 GW_RUNS=1 GW_JOBS="$jobs" GW_PROCS=2 GW_CONCURRENCY=8 \
        node bench/reference/graphile/bench.js throughput)
    profile "$line"
fi
if [[ "$which" == both || "$which" == onramp ]]; then
    cargo bench --quiet --no-run --bench engine
    line=$(BENCH_ONLY=throughput BENCH_JOBS="$jobs" cargo bench --quiet --bench engine | grep '^{')
    profile "$line"
fi
