# Prometheus (Debian's package, 2.42) for compose.yml's monitoring profile; its configuration
# is mounted at /etc/prometheus/prometheus.yml (docker/prometheus.yml). Its arguments and paths
# are the official prom/prometheus image's, so either image fits the compose service.
# BASE: any Debian bookworm image.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# policy-rc.d: the package's install must not start the service inside the build.
# moment-timezone's data/ (212 MB) goes: the web UI loads only moment-timezone-with-data.min.js.
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends prometheus > /dev/null \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man /usr/sbin/policy-rc.d \
        /usr/share/javascript/moment-timezone/data \
    && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
VOLUME /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
