#!/usr/bin/env bash
# A real single-host Slurm 22.05 cluster ("production") with accounting in MariaDB, for
# integration tests, on Debian 12, run as root, without systemd. The node has eight GPUs that
# are only counted (Gres=gpu:8; there are no GPUs here: Slurm 22.05 drops a GPU without File=,
# so gres.conf names eight null devices of our own) so GrpTRES=gres/gpu limits and
# `--gres=gpu:1` are exercised as the runbook uses them, and 16 CPUs declared over
# the machine's real ones (SlurmdParameters=config_overrides) so GPU limits, not cores, are
# what holds jobs back in the tests.
#   scripts/slurm-test-cluster.sh start|stop|status
# Config: /etc/slurm (where Debian's binaries look). State, logs and the PIDs of the daemons
# this script started: /var/lib/onramp-slurm-test. Every wait polls with a deadline and fails
# with the tail of the relevant log.
set -euo pipefail

CLUSTER=production
STATE=/var/lib/onramp-slurm-test
PIDS=$STATE/pids                 # PIDs this script started (only these are ever stopped)
LOG=$STATE/log
CONF=/etc/slurm
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=onramp-slurm-test        # a throwaway test cluster on loopback
PACKAGES=(munge slurmctld slurmd slurmdbd slurm-client mariadb-server)
GPUS=8                           # count-only GPU GRES on the one node
NODE_CPUS=16                     # declared CPUs (config_overrides): more than the 2 real cores
TEST_USERS=(onramp-alice:5001 onramp-bob:5002 onramp-carol:5003 onramp-dave:5004)
T0=$(date +%s%N)

say() { echo "slurm-test-cluster: $*" >&2; }
elapsed() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '%d.%03ds' $((ms / 1000)) $((ms % 1000)); }
fail() { # message, then log files whose tails explain it
    local f; say "ERROR: $1"; shift
    for f in "$@"; do [[ -s $f ]] && { echo "---- tail of $f" >&2; tail -n 25 "$f" >&2; }; done
    exit 1
}

# alive NAME: the PID this script recorded for NAME still runs NAME (guards against PID reuse).
alive() { local pid; pid=$(cat "$PIDS/$1.pid" 2>/dev/null) && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]]; }

# launch NAME CMD...: start CMD in the foreground mode of the daemon, detached into its own
# session (so it outlives this shell), and record its PID. setsid execs, so $! is the daemon.
# Descriptors the caller inherited (e.g. a `flock` around this script) are closed first: a daemon
# holding one would hold the caller's lock for as long as it runs.
launch() {
    local name=$1; shift
    (
        for fd in $(ls "/proc/$BASHPID/fd"); do
            if (( fd > 2 && fd != 255 )); then eval "exec $fd>&-"; fi
        done
        exec setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1
    ) &
    echo $! >"$PIDS/$name.pid"
    say "started $name (pid $!)"
}

# wait_for WHAT SECONDS DAEMON LOGS -- CMD...: poll CMD until it succeeds, the deadline passes,
# or DAEMON (if non-empty) dies; the last two fail with the tails of LOGS.
wait_for() {
    local what=$1 limit=$2 daemon=$3 logs=() end=$((SECONDS + $2))
    shift 3
    while [[ $1 != -- ]]; do logs+=("$1"); shift; done
    shift
    until "$@" >/dev/null 2>&1; do
        # kill -0, not alive: just after launch the PID may not have exec'd the daemon yet
        if [[ -n $daemon ]] && ! kill -0 "$(cat "$PIDS/$daemon.pid")" 2>/dev/null; then
            fail "$daemon exited while waiting for $what" "${logs[@]}"
        fi
        (( SECONDS < end )) || fail "timed out after ${limit}s waiting for $what" "${logs[@]}"
        sleep 0.2
    done
}

munge_ok() { munge -n | unmunge; }
dbd_ok() { timeout 10 sacctmgr -n -P show cluster format=cluster; }
ctld_ok() { timeout 10 scontrol ping | grep -q 'is UP'; }
node_state() { timeout 10 sinfo -h -N -n localhost -o %t 2>/dev/null | head -n1; }
# node_up: idle, or mix/alloc when jobs from before a stop/start survived (after such a job
# ends the node reads "mix" for about a minute more). Resumes a down/drained node.
node_up() {
    case $(node_state) in
        idle | mix | alloc) return 0 ;;
        down | drain | drng | drained) scontrol update nodename=localhost state=resume || true ;;
    esac
    return 1
}
mysql_root() { mariadb -uroot "$@" 2>/dev/null || mariadb -uroot -h127.0.0.1 "$@"; }

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    say "installing ${missing[*]}"
    # Keep package scripts from starting the daemons (a Docker image's policy-rc.d does that
    # already; a plain machine has none): this script starts them itself, and knows their PIDs.
    local policy=/usr/sbin/policy-rc.d added=""
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >$policy; chmod 755 $policy; added=1; fi
    export DEBIAN_FRONTEND=noninteractive
    local rc=0; { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
        >"$LOG/apt.out" 2>&1 || rc=$?
    [[ -z $added ]] || rm -f $policy
    ((rc == 0)) || fail "apt-get failed (rc $rc)" "$LOG/apt.out"
}

ensure_users() {
    getent group slurm >/dev/null || groupadd --system slurm
    id slurm >/dev/null 2>&1 || useradd --system -g slurm -d /nonexistent -s /usr/sbin/nologin slurm
    local entry name uid
    for entry in "${TEST_USERS[@]}"; do
        name=${entry%%:*} uid=${entry##*:}
        id "$name" >/dev/null 2>&1 && continue
        useradd -m -u "$uid" -U -s /bin/bash "$name"
        say "created user $name (uid $uid)"
    done
}

start_munge() {
    install -d -o munge -g munge -m 700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then mungekey -c -f -k /etc/munge/munge.key; fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    if munge_ok >/dev/null 2>&1; then return 0; fi     # ours, or a munged already running
    alive munged || launch munged setpriv --reuid=munge --regid=munge --init-groups munged -F
    wait_for "munge -n | unmunge" 20 munged "$LOG/munged.out" /var/log/munge/munged.log -- munge_ok
}

start_mariadb() {
    if ! mariadb-admin ping >/dev/null 2>&1; then    # else: use the MariaDB already running
        install -d -o mysql -g mysql -m 755 /run/mysqld
        alive mariadbd || launch mariadbd mariadbd --user=mysql
        wait_for "mariadb-admin ping" 60 mariadbd "$LOG/mariadbd.out" -- mariadb-admin ping
    fi
    mysql_root -e "CREATE DATABASE IF NOT EXISTS $DB_NAME;"
    local u
    for u in "'$DB_USER'@'localhost'" "'$DB_USER'@'127.0.0.1'"; do
        mysql_root -e "CREATE USER IF NOT EXISTS $u IDENTIFIED BY '$DB_PASS';
            ALTER USER $u IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON $DB_NAME.* TO $u;"
    done
}

# put_file PATH MODE OWNER: write stdin to PATH only if it differs (keeps a running cluster's
# config untouched when nothing changed).
put_file() {
    local tmp; tmp=$(mktemp)
    cat >"$tmp"
    if cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 0; fi
    if alive slurmctld; then say "WARNING: $1 changed while the cluster runs; 'stop' then 'start' to apply"; fi
    install -m "$2" -o "${3%%:*}" -g "${3##*:}" "$tmp" "$1" && rm -f "$tmp"
}

write_config() {
    install -d -m 755 "$CONF"
    install -d -o slurm -g slurm -m 755 "$STATE/slurmctld" "$STATE/slurmd" "$STATE/run"
    chown slurm:slurm "$LOG"
    # Memory from slurmd -C (RealMemory below the real value, or the node drains); the CPUs
    # are declared (NODE_CPUS), over the real ones, with config_overrides.
    local hw mem
    hw=$(slurmd -C | head -n1)
    mem=$(sed -n 's/.*\bRealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    [[ -n $mem ]] || fail "could not parse 'slurmd -C': $hw"
    put_file "$CONF/slurmdbd.conf" 600 slurm:slurm <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
LogFile=$LOG/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
    # the GPUs' "device files": character devices 1:3, i.e. /dev/null
    install -d -m 755 "$STATE/dev"
    local i
    for ((i = 0; i < GPUS; i++)); do [[ -c $STATE/dev/gpu$i ]] || mknod -m 666 "$STATE/dev/gpu$i" c 1 3; done
    put_file "$CONF/gres.conf" 644 root:root <<EOF
# Written by scripts/slurm-test-cluster.sh: GPUs only counted (null devices, no GPUs here).
Name=gpu File=$STATE/dev/gpu[0-$((GPUS - 1))]
EOF
    put_file "$CONF/slurm.conf" 644 root:root <<EOF
# Written by scripts/slurm-test-cluster.sh (onramp integration tests).
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
PriorityType=priority/multifactor
PriorityFlags=FAIR_TREE
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations,limits,qos,safe
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$NODE_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$NODE_CPUS ThreadsPerCore=1 RealMemory=$((mem * 9 / 10)) Gres=gpu:$GPUS State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

start_slurm() {
    if ! alive slurmdbd; then launch slurmdbd slurmdbd -D; fi
    wait_for "slurmdbd (sacctmgr show cluster)" 60 slurmdbd "$LOG/slurmdbd.log" "$LOG/slurmdbd.out" -- dbd_ok
    if ! dbd_ok 2>/dev/null | grep -qx "$CLUSTER"; then    # must exist before slurmctld starts
        sacctmgr -i add cluster "$CLUSTER" >>"$LOG/sacctmgr.out" 2>&1 \
            || fail "sacctmgr add cluster $CLUSTER failed" "$LOG/sacctmgr.out"
        say "added cluster $CLUSTER to slurmdbd"
    fi
    if ! alive slurmctld; then launch slurmctld slurmctld -D; fi
    wait_for "slurmctld (scontrol ping)" 60 slurmctld "$LOG/slurmctld.log" "$LOG/slurmctld.out" -- ctld_ok
    if ! alive slurmd; then launch slurmd slurmd -D -N localhost; fi
    wait_for "node localhost to be up (sinfo: idle/mix/alloc)" 60 slurmd \
        "$LOG/slurmd.log" "$LOG/slurmd.out" "$LOG/slurmctld.log" -- node_up
    [[ $(node_state) == idle ]] || say "node localhost is $(node_state): jobs from before still hold it"
}

cmd_start() {
    install -d -m 755 "$STATE" "$LOG" "$PIDS"
    install_packages
    ensure_users
    start_munge
    start_mariadb
    write_config
    start_slurm
    echo "slurm test cluster ready ($(elapsed))" >&2
}

# stop_group NAME...: SIGTERM those of NAME this script started, all at once, then wait
# (each takes 1-3 s to shut down); SIGKILL what is left after 20 s.
stop_group() {
    local name end=$((SECONDS + 20))
    for name in "$@"; do
        if alive "$name"; then kill -TERM "$(cat "$PIDS/$name.pid")" 2>/dev/null || true; fi
    done
    for name in "$@"; do
        while alive "$name" && (( SECONDS < end )); do sleep 0.1; done
        if alive "$name"; then
            kill -KILL "$(cat "$PIDS/$name.pid")" 2>/dev/null || true
            say "killed $name after 20s"
        fi
        [[ -e $PIDS/$name.pid ]] && say "stopped $name (pid $(cat "$PIDS/$name.pid"))"
        rm -f "$PIDS/$name.pid"
    done
}

cmd_stop() {
    local f
    stop_group slurmd slurmctld slurmdbd
    stop_group munged mariadbd    # mariadbd only if this script started it
    # Stale pidfiles (a daemon's own, or Debian's /run/slurm*.pid) break package scripts.
    for f in /run/slurm*.pid "$STATE"/run/*.pid; do
        [[ -e $f ]] && ! kill -0 "$(cat "$f")" 2>/dev/null && rm -f "$f"
    done
    say "stopped ($(elapsed))"
}

cmd_status() {
    local name up=0 entry state="" uid
    for name in slurmd slurmctld slurmdbd munged mariadbd; do
        if alive "$name"; then echo "$name: running (pid $(cat "$PIDS/$name.pid"))"
        else echo "$name: not running from this script"; fi
    done
    if mariadb-admin ping >/dev/null 2>&1; then echo "mariadb: answers"; else echo "mariadb: down"; up=1; fi
    if ctld_ok 2>/dev/null; then echo "slurmctld: UP"; state=$(node_state || true)
    else echo "slurmctld: not answering"; up=1; fi    # (sinfo would retry for 9 s)
    echo "node localhost: ${state:-unknown}"
    [[ $state =~ ^(idle|alloc|mix)$ ]] || up=1
    echo "cluster: $CLUSTER, config: $CONF, state: $STATE"
    for entry in "${TEST_USERS[@]}"; do
        uid=$(id -u "${entry%%:*}" 2>/dev/null) || { uid=missing; up=1; }
        echo "test user: ${entry%%:*} (uid $uid)"
    done
    return "$up"
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
