# The llmgw gateway image: multi-stage (build a virtualenv from the hashed locks, copy it into a slim runtime);
# runs as a non-root user (uid 10001) and on a read-only root filesystem (writable: /tmp, /var/lib/llmgw).
#   docker build -t llmgw .                          # with the semantic cache: requirements/semantic.txt
#   docker build --build-arg EXTRAS= -t llmgw .      # exact cache only, a much smaller image: requirements/runtime.txt
#   docker build --build-arg BASE=localhost/llmgw-base:bookworm ...   # another Python 3.11 base (CI builds one)
# Every dependency comes from a lock with hashes (pip --require-hashes); the project itself is installed
# --no-deps. Regenerate the locks with deploy/ci/lock.sh. tests/test_image.py builds and runs this file.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG EXTRAS=semantic
# torch==2.13.0+cpu (in the semantic lock) is on PyTorch's CPU index only: the gateway embeds short questions,
# CUDA's gigabytes are not needed.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/llmgw
ENV PATH=/opt/llmgw/bin:$PATH
WORKDIR /src
COPY requirements requirements
RUN pip install --require-hashes --no-deps -r requirements/build.txt \
 && pip install --require-hashes --no-deps ${EXTRAS:+--extra-index-url "$TORCH_INDEX"} -r "requirements/${EXTRAS:-runtime}.txt"
COPY pyproject.toml README.md ./
COPY core core
COPY gateway gateway
COPY routing routing
COPY cache cache
COPY backends backends
COPY policies policies
COPY migrations migrations
RUN pip install --no-deps --no-build-isolation . && pip check

FROM ${BASE}
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/llmgw llmgw \
 && install -d -o 10001 -g 10001 /var/lib/llmgw
COPY --from=build /opt/llmgw /opt/llmgw
ENV PATH=/opt/llmgw/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HUB_OFFLINE=1 \
    LLMGW_HOST=0.0.0.0 \
    LLMGW_PORT=8000
USER llmgw
# The embedded default's SQLite file (./llmgw.db) lands here; fleets point LLMGW_DATABASE_URL at PostgreSQL.
WORKDIR /var/lib/llmgw
VOLUME /var/lib/llmgw
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health/live', timeout=2)"]
CMD ["llmgw", "serve", "--host", "0.0.0.0"]
