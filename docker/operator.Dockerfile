# The spectune operator: slim Python and the `operator` extra only (no torch, ever).
#   docker build -f docker/operator.Dockerfile -t ghcr.io/spectune/spectune-operator:0.1.0 .
FROM python:3.12.8-slim-bookworm AS build
COPY pyproject.toml /src/
COPY LICENSE /src/
COPY operator/ /src/operator/
COPY engine/ /src/engine/
COPY demo/ /src/demo/
COPY sim/ /src/sim/
COPY docker/ /src/docker/
RUN sh /src/docker/install-operator.sh /src /opt/spectune

FROM python:3.12.8-slim-bookworm
ENV PATH=/opt/spectune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/spectune /opt/spectune
# A fixed non-root user: the chart's securityContext runs as 10001 with a read-only root.
RUN groupadd --gid 10001 spectune && useradd --uid 10001 --gid 10001 --no-create-home spectune
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["spectune-operator"]
CMD ["run"]
