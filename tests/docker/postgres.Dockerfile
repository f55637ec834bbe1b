# A stand-in for the official postgres image, for docker/compose.yml's cluster profile under
# test: no registry is reachable where the suite runs, so Debian's PostgreSQL over the local
# base, taking the official image's POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB on first
# start and keeping its data in /var/lib/postgresql/data.
ARG BASE
FROM ${BASE}
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends postgresql-15 > /dev/null \
    && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
STOPSIGNAL SIGINT
CMD ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
