#!/usr/bin/env bash
# Makes sure a PostgreSQL answers at 127.0.0.1:5432 with a superuser `postgres` and trust auth on
# loopback, as the tests expect (ONRAMP_TEST_DATABASE_URL overrides where tests look; then this
# script only checks that one answers). In order: it already answers; start the machine's
# cluster (pg_ctlcluster); install Debian's postgresql package and start its cluster.
set -euo pipefail

say() { echo "ensure-postgres: $*" >&2; }
url=${ONRAMP_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}

answers() { psql "$url" -Atqc 'select 1' >/dev/null 2>&1; }

wait_answers() {
    local deadline=$((SECONDS + 60))
    until answers; do
        ((SECONDS < deadline)) || { say "PostgreSQL at $url did not answer within 60 s"; exit 1; }
        sleep 0.2
    done
}

if command -v psql >/dev/null && answers; then
    say "PostgreSQL answers at $url"
    exit 0
fi
if [[ -n ${ONRAMP_TEST_DATABASE_URL:-} ]]; then
    say "ONRAMP_TEST_DATABASE_URL is set but $url does not answer"
    exit 1
fi

if ! command -v pg_ctlcluster >/dev/null || [[ -z $(ls /etc/postgresql 2>/dev/null) ]]; then
    [[ $(id -u) == 0 ]] || { say "no PostgreSQL here: install the postgresql package (needs root)"; exit 1; }
    say "installing Debian's postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends postgresql postgresql-client >/dev/null
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
hba=/etc/postgresql/$version/main/pg_hba.conf
# the tests connect over TCP on loopback as postgres without a password
if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
    say "allowing trust auth on 127.0.0.1 in $hba (test machine)"
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload 2>/dev/null || true
fi
if ! pg_ctlcluster --skip-systemctl-redirect "$version" main status >/dev/null 2>&1; then
    say "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
fi
wait_answers
say "PostgreSQL answers at $url"
