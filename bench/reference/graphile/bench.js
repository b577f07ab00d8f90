#!/usr/bin/env node
// Reference benchmark for graphile-worker on the local Postgres.
//
//   node bench.js throughput   enqueue GW_JOBS no-op jobs up front, then time
//                              GW_PROCS worker processes draining them
//                              (median of GW_RUNS drains)
//   node bench.js latency      one idle worker; add jobs one at a time at
//                              GW_RATE/s for GW_SECONDS s; add->start p50/p99
//
// Each run creates a fresh database bench_graphile_<pid> (from the admin URL
// in BENCH_PG) and drops it afterwards. Prints one JSON line on stdout.
// Knobs (env): GW_JOBS=20000 GW_PROCS=2 GW_CONCURRENCY=12 (per process)
//              GW_RUNS=3 GW_BATCH=0|1 GW_RATE=200 GW_SECONDS=10
"use strict";
const { fork } = require("node:child_process");
const { performance } = require("node:perf_hooks");
const { Client } = require("pg");
const { run, runMigrations, makeWorkerUtils, Logger } = require("graphile-worker");

const env = (k, d) => (process.env[k] === undefined ? d : process.env[k]);
const ADMIN_URL = env("BENCH_PG", "postgres://postgres@127.0.0.1:5432/postgres");
const JOBS = Number(env("GW_JOBS", 20000));
const PROCS = Number(env("GW_PROCS", 2));
const CONCURRENCY = Number(env("GW_CONCURRENCY", 12));
const RUNS = Number(env("GW_RUNS", 3));
const BATCH = env("GW_BATCH", "0") === "1";
const RATE = Number(env("GW_RATE", 200));
const SECONDS = Number(env("GW_SECONDS", 10));

const now = () => performance.timeOrigin + performance.now(); // wall-clock ms, sub-ms resolution
const quietLogger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[graphile ${level}] ${message}`);
});

// Worker options. "default" = graphile-worker out of the box (one DB round trip
// per fetch and per completion); "batched" = its documented batching knobs
// (https://worker.graphile.org/docs/performance#batching), as in its perfTest.
function preset(connectionString) {
  const worker = {
    connectionString,
    concurrentJobs: CONCURRENCY,
    maxPoolSize: Math.max(10, CONCURRENCY + 2),
    pollInterval: 2000,
  };
  if (BATCH) {
    Object.assign(worker, {
      localQueue: { size: 500, refetchDelay: { durationMs: 10 } },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    });
  }
  return { worker };
}

async function withDatabase(fn) {
  const name = `bench_graphile_${process.pid}`;
  const admin = new Client({ connectionString: ADMIN_URL });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name}`);
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  try {
    await runMigrations({ connectionString: url.toString(), logger: quietLogger });
    return await fn(url.toString());
  } finally {
    // Pools close their sockets asynchronously: let them go before dropping.
    const gone = async () =>
      (await admin.query("select count(*)::int n from pg_stat_activity where datname = $1", [name])).rows[0].n === 0;
    await pollUntil(gone, 10_000, 20, "connections to close").catch(() => {});
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  }
}

async function pollUntil(check, deadlineMs, intervalMs, what) {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

// Child process: load everything, say "ready", start the worker on "go".
async function workerChild() {
  let runner;
  process.on("message", async (msg) => {
    if (msg === "go") {
      runner = await run({
        preset: preset(process.env.GW_DB_URL),
        taskList: { noop: async () => {} },
        logger: quietLogger,
        noHandleSignals: true,
      });
    } else if (msg === "stop") {
      if (runner) await runner.stop();
      process.exit(0);
    }
  });
  process.send("ready");
}

// One drain: fresh database, JOBS enqueued up front, PROCS workers started together.
async function drainOnce() {
  return withDatabase(async (dbUrl) => {
    const utils = await makeWorkerUtils({ connectionString: dbUrl, logger: quietLogger });
    const t = performance.now();
    const specs = Array.from({ length: JOBS }, (_, i) => ({ identifier: "noop", payload: { i } }));
    for (let i = 0; i < specs.length; i += 5000) await utils.addJobs(specs.slice(i, i + 5000));
    const enqueueSeconds = (performance.now() - t) / 1000;
    await utils.release();

    const children = Array.from({ length: PROCS }, () =>
      fork(__filename, ["worker"], { env: { ...process.env, GW_DB_URL: dbUrl } }),
    );
    await Promise.all(children.map((c) => new Promise((r) => c.once("message", r))));

    const db = new Client({ connectionString: dbUrl });
    await db.connect();
    try {
      // WAL written while draining (the whole server's; nothing else should run): what a job costs on disk
      const lsn = async () => (await db.query("select pg_current_wal_lsn()::text l")).rows[0].l;
      const lsn0 = await lsn();
      const t0 = performance.now();
      children.forEach((c) => c.send("go"));
      // Completed jobs are deleted, so "no rows left" means all done (failed ones would stay).
      await pollUntil(
        async () => !(await db.query("select exists(select 1 from graphile_worker._private_jobs) e")).rows[0].e,
        Math.max(120_000, JOBS * 5), 20, "queue to drain",
      );
      const seconds = (performance.now() - t0) / 1000;
      const lsn1 = await lsn();
      const wal = (await db.query("select pg_wal_lsn_diff($1, $2)::float8 d", [lsn1, lsn0])).rows[0].d;
      return { seconds, enqueueSeconds, walBytesPerJob: wal / JOBS, walFrom: lsn0, walTo: lsn1 };
    } finally {
      await db.end();
      await Promise.all(children.map((c) => new Promise((r) => (c.once("exit", r), c.send("stop")))));
    }
  });
}

// GW_RUNS drains (fresh database each); report the median one. Disk fsync
// latency on this VM drifts a lot between minutes, so one run is not enough.
async function throughput() {
  const runs = [];
  for (let i = 0; i < RUNS; i++) runs.push(await drainOnce());
  runs.sort((a, b) => a.seconds - b.seconds);
  const median = runs[Math.floor(runs.length / 2)];
  return {
    system: "graphile-worker", mode: BATCH ? "batched" : "default", jobs: JOBS,
    seconds: +median.seconds.toFixed(3), jobs_per_s: Math.round(JOBS / median.seconds),
    procs: PROCS, concurrency: CONCURRENCY, enqueue_s: +median.enqueueSeconds.toFixed(3),
    runs_jobs_per_s: runs.map((r) => Math.round(JOBS / r.seconds)),
    wal_bytes_per_job: Math.round(median.walBytesPerJob),
    // the median drain's WAL (bench/wal-profile.sh breaks it down by record type)
    wal_from: median.walFrom, wal_to: median.walTo,
  };
}

async function latency() {
  return withDatabase(async (dbUrl) => {
    let samples = [];
    const runner = await run({
      preset: preset(dbUrl),
      taskList: {
        latency: async (payload) => {
          samples.push(now() - payload.t);
        },
      },
      logger: quietLogger,
      noHandleSignals: true,
    });
    const utils = await makeWorkerUtils({ connectionString: dbUrl, logger: quietLogger });
    const waitFor = (n) => pollUntil(() => samples.length >= n, 30_000, 5, `${n} latency samples`);

    for (let i = 0; i < 100; i++) await utils.addJob("latency", { t: now() }); // warm-up
    await waitFor(100);
    samples = [];

    const total = Math.round(RATE * SECONDS);
    const start = now();
    const addMs = []; // how long each add_job (its commit) took, to tell disk stalls apart
    const adds = []; // open loop: each add starts on schedule, not after the previous one
    for (let i = 0; i < total; i++) {
      const due = start + (i * 1000) / RATE;
      const wait = due - now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const t = now();
      adds.push(utils.addJob("latency", { t }).then(() => addMs.push(now() - t)));
    }
    const sentRate = total / ((now() - start) / 1000);
    await Promise.all(adds);
    await waitFor(total);
    await utils.release();
    await runner.stop();

    const pct = (xs, p) => +xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))].toFixed(2);
    const s = samples.sort((a, b) => a - b);
    addMs.sort((a, b) => a - b);
    return {
      system: "graphile-worker", test: "add_to_start_latency", mode: BATCH ? "batched" : "default",
      jobs: total, rate_per_s: Math.round(sentRate), procs: 1, concurrency: CONCURRENCY,
      p50_ms: pct(s, 50), p99_ms: pct(s, 99), max_ms: pct(s, 100),
      mean_ms: +(s.reduce((a, b) => a + b, 0) / s.length).toFixed(2),
      add_job_p50_ms: pct(addMs, 50), add_job_p99_ms: pct(addMs, 99),
    };
  });
}

const mode = process.argv[2];
if (mode === "worker") {
  workerChild().catch((e) => { console.error(e); process.exit(1); });
} else {
  const fn = { throughput, latency }[mode];
  if (!fn) {
    console.error("usage: node bench.js throughput|latency");
    process.exit(2);
  }
  fn().then((r) => console.log(JSON.stringify(r)), (e) => { console.error(e); process.exit(1); });
}
