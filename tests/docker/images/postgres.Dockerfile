# Stand-in for postgres:15-bookworm: Debian 12's PostgreSQL 15 with an entrypoint that honours the official
# image's POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB on an empty data directory.
ARG BASE
FROM ${BASE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin PGDATA=/var/lib/postgresql/data
USER postgres
ENTRYPOINT ["/bin/sh", "/usr/local/bin/docker-entrypoint.sh"]
