# The spectune engine (inference server): CUDA runtime and the `engine` extra.
#   docker build -f docker/engine.Dockerfile -t REGISTRY/spectune-engine:0.1.0 .
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/spectune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SPECTUNE_CACHE=/cache
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12=3.12.3-* python3.12-venv=3.12.3-* \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml /src/
COPY operator/ /src/operator/
COPY engine/ /src/engine/
COPY demo/ /src/demo/
COPY sim/ /src/sim/
COPY docker/engine-constraints.txt /src/docker/
# Built from / : the source's operator/ folder would shadow the standard library's module.
RUN cd / && python3.12 -m venv /opt/spectune \
    && /opt/spectune/bin/pip install --no-cache-dir --disable-pip-version-check \
       --constraint /src/docker/engine-constraints.txt '/src[engine]' \
    && rm -rf /src
RUN groupadd --gid 10001 spectune && useradd --uid 10001 --gid 10001 --no-create-home spectune \
    && mkdir /cache && chown 10001:10001 /cache
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["spectune-engine"]
CMD ["serve"]
