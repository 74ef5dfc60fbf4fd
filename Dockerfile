# The llmgw gateway image: multi-stage (build a virtualenv, copy it into a slim runtime), runs as non-root.
#   docker build -t llmgw .                          # with the semantic cache (sentence-transformers, FAISS)
#   docker build --build-arg EXTRAS= -t llmgw .      # exact cache only: a much smaller image
FROM python:3.11-slim AS build
ARG EXTRAS=semantic
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/llmgw
ENV PATH=/opt/llmgw/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY routing routing
COPY cache cache
COPY backends backends
COPY policies policies
COPY migrations migrations
# sentence-transformers needs torch: take the CPU build (the gateway only embeds short questions), not CUDA's GBs
RUN if [ -n "$EXTRAS" ]; then pip install torch --index-url https://download.pytorch.org/whl/cpu; fi \
 && pip install ".${EXTRAS:+[$EXTRAS]}"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /home/llmgw llmgw
COPY --from=build /opt/llmgw /opt/llmgw
ENV PATH=/opt/llmgw/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    LLMGW_HOST=0.0.0.0 \
    LLMGW_PORT=8000
USER llmgw
WORKDIR /home/llmgw
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health/live', timeout=2)"]
CMD ["llmgw", "serve", "--host", "0.0.0.0"]
