#!/usr/bin/env bash
# Cost of adding N users to one Slurm account: one `sacctmgr add user u1,…,uN` vs N calls.
#   bench/slurm/batch-add.sh [N...]        (default: 30 100)
# Needs the test cluster (scripts/slurm-test-cluster.sh start); creates and deletes its own
# account and users (names start with "bench-").
set -euo pipefail
CLUSTER=production
sizes=("${@:-30}")
(($#)) || sizes=(30 100)
tag=$(printf '%06x' $((RANDOM * RANDOM % 16777216)))
acct="bench-$tag"
now() { date +%s%N; }
ms() { echo $((($2 - $1) / 1000000)); }

cleanup() {
    sacctmgr -i delete user where name="$(seq -f "bench-$tag-%g" -s, 1 "$max")" >/dev/null 2>&1 || true
    sacctmgr -i delete user where name="$(seq -f "bench-$tag-s%g" -s, 1 "$max")" >/dev/null 2>&1 || true
    sacctmgr -i delete account where name="$acct" >/dev/null 2>&1 || true
}
max=0; for n in "${sizes[@]}"; do ((n > max)) && max=$n; done
trap cleanup EXIT
sacctmgr -i add account "$acct" Cluster=$CLUSTER >/dev/null

defaults=(Fairshare=parent DefaultQOS=normal QOS=normal MaxJobs=20 GrpTRESMins=gres/gpu=10000)
for n in "${sizes[@]}"; do
    users=$(seq -f "bench-$tag-%g" -s, 1 "$n")
    t0=$(now)
    sacctmgr -i add user "$users" Account="$acct" DefaultAccount="$acct" Cluster=$CLUSTER "${defaults[@]}" >/dev/null
    t1=$(now)
    echo "batched: $n users in one call: $(ms "$t0" "$t1") ms"
    sacctmgr -i delete user where name="$users" >/dev/null

    t0=$(now)
    for i in $(seq 1 "$n"); do
        sacctmgr -i add user "bench-$tag-s$i" Account="$acct" DefaultAccount="$acct" Cluster=$CLUSTER "${defaults[@]}" >/dev/null
    done
    t1=$(now)
    echo "one by one: $n users in $n calls: $(ms "$t0" "$t1") ms ($(( $(ms "$t0" "$t1") / n )) ms per user)"
    sacctmgr -i delete user where name="$(seq -f "bench-$tag-s%g" -s, 1 "$n")" >/dev/null
done
