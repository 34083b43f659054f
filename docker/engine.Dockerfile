# The spectune engine (inference server): slim Python and the `engine` extra.
#   docker build -f docker/engine.Dockerfile -t ghcr.io/spectune/spectune-engine:0.1.0 .
# No CUDA base image: PyPI's Linux torch wheel brings its CUDA libraries as nvidia-* wheels
# (CUDA 13, docker/engine-requirements.txt), so a base's CUDA would be dead weight. The node
# needs an NVIDIA driver that runs CUDA 13: version 580 or newer.
FROM python:3.12.8-slim-bookworm
ENV PATH=/opt/spectune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPECTUNE_CACHE=/cache
COPY pyproject.toml /src/
COPY LICENSE /src/
COPY operator/ /src/operator/
COPY engine/ /src/engine/
COPY demo/ /src/demo/
COPY sim/ /src/sim/
COPY docker/engine-requirements.txt /src/docker/
# Built from / : the source's operator/ folder would shadow the standard library's module.
RUN cd / && python3.12 -m venv /opt/spectune \
    && /opt/spectune/bin/pip install --no-cache-dir --disable-pip-version-check \
       --constraint /src/docker/engine-requirements.txt '/src[engine]' \
    && rm -rf /src
# A fixed non-root user: engine pods run as 10001 (Pod Security `restricted`).
RUN groupadd --gid 10001 spectune && useradd --uid 10001 --gid 10001 --no-create-home spectune \
    && mkdir /cache && chown 10001:10001 /cache
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["spectune-engine"]
CMD ["serve"]
