#!/bin/sh
# The official image's first start, in short: a database cluster owned by POSTGRES_USER with
# POSTGRES_PASSWORD (scram over TCP), the database POSTGRES_DB; then the server in front.
set -eu
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres /var/run/postgresql
chown postgres:postgres "$PGDATA"
chmod 700 "$PGDATA"
as_postgres() { runuser -u postgres -- "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C > /dev/null
    rm /tmp/pwfile
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
    as_postgres createdb -U "$POSTGRES_USER" "$POSTGRES_DB"
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop > /dev/null
fi
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*'
