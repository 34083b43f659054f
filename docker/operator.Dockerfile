# The spectune operator: Debian's Python and the `operator` extra only (no torch, ever).
#   docker build -f docker/operator.Dockerfile -t ghcr.io/spectune/spectune-operator:0.1.0 .
# `make images` builds it with podman FROM a bookworm made from Debian's packages (BASE).
ARG BASE=debian:12.11-slim
FROM ${BASE}
ENV PATH=/opt/spectune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml /src/
COPY LICENSE /src/
COPY operator/ /src/operator/
COPY engine/ /src/engine/
COPY demo/ /src/demo/
COPY sim/ /src/sim/
COPY docker/ /src/docker/
# A CA bundle the build's network needs is a secret (`--secret id=ca,src=FILE`), never a layer.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && sh /src/docker/install-operator.sh /src /opt/spectune \
    && rm -rf /src
# A fixed non-root user: the chart's securityContext runs as 10001 with a read-only root.
RUN groupadd --gid 10001 spectune && useradd --uid 10001 --gid 10001 --no-create-home spectune
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["spectune-operator"]
CMD ["run"]
