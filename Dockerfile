# memory-proxy container image (multi-stage; see README "Deploy", "Build and push the
# image"). scripts/check-image builds it with buildah, offline from any container registry,
# and starts the gateway from the built image's own configuration.
#
#   docker build -t memory-proxy .                              # extras: redis (default)
#   docker build --build-arg EXTRAS=redis,embeddings -t memory-proxy:embeddings .
#   docker build --build-arg EXTRAS= -t memory-proxy:sqlite .   # SQLite only
#
# EXTRAS: comma-separated extras of pyproject.toml (redis, embeddings). With embeddings,
# torch comes from TORCH_INDEX (the CPU wheels by default, not the multi-GB CUDA build).
# The final image has no compiler and no pip cache, and runs as uid 10001.
# PYTHON_IMAGE: any Debian-based image with Python 3.11+, `python` on PATH and its venv
# module (scripts/check-image passes one made locally by debootstrap).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=redis
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md ./
COPY proxy ./proxy
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# TORCH_INDEX is asked only when the embeddings extra is wanted: pip would otherwise query
# it for every package, and a machine that reaches only PyPI would wait on each query.
# DL3013 (pin pip versions) does not apply: this installs the project itself from the
# build context; its dependencies' ranges are those of pyproject.toml.
# hadolint ignore=DL3013
RUN target="."; \
    if [ -n "${EXTRAS}" ]; then target=".[${EXTRAS}]"; fi; \
    set --; \
    case ",${EXTRAS}," in *,embeddings,*) set -- --extra-index-url "${TORCH_INDEX}" ;; esac; \
    pip install "$@" "${target}" \
    && find /opt/venv -name '__pycache__' -type d -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="memory-proxy" \
      org.opencontainers.image.description="OpenAI-compatible gateway with long-term user memory" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 memory-proxy \
    && useradd --system --uid 10001 --gid memory-proxy --home-dir /app \
       --shell /usr/sbin/nologin memory-proxy \
    && mkdir -p /app /data /etc/memory-proxy \
    && chown memory-proxy:memory-proxy /app /data
COPY --from=build /opt/venv /opt/venv
COPY config.yaml /etc/memory-proxy/config.yaml
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    HF_HUB_OFFLINE=1 \
    MEMORY_PROXY_CONFIG=/etc/memory-proxy/config.yaml \
    MEMORY_PROXY_SERVER__HOST=0.0.0.0 \
    MEMORY_PROXY_SERVER__PORT=8080 \
    MEMORY_PROXY_STORAGE__PATH=/data/memory-proxy.db
WORKDIR /app
VOLUME ["/data"]
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('MEMORY_PROXY_SERVER__PORT', '8080') + '/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["memory-proxy"]
CMD ["serve"]
