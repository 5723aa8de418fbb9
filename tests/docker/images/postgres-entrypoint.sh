# First start on an empty volume: initialise with the official image's variables, then serve on all addresses.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s' "${POSTGRES_PASSWORD:?the postgres image needs POSTGRES_PASSWORD}" > /tmp/pwfile
    initdb -D "$PGDATA" -U "$user" --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f /tmp/pwfile
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    [ "$db" = postgres ] || createdb -U "$user" "$db"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
