# One image per role, from one Dockerfile:
#   docker build --target serving -t feature-store-serving .   # feature-store serve
#   docker build --target ingest  -t feature-store-ingest  .   # feature-store ingest (Spark)
# The package's wheel, with its Rust extension compiled by Debian's cargo
FROM python:3.11-slim AS wheel
RUN apt-get update \
    && apt-get install -y --no-install-recommends cargo rustc \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY native ./native
COPY feature_store ./feature_store
RUN pip wheel --no-deps --no-cache-dir -w /wheels .

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY --from=wheel /wheels /wheels
RUN useradd --system --uid 10001 --home-dir /app features

FROM base AS serving
RUN pip install "$(ls /wheels/*.whl)[grpc]"
USER features
EXPOSE 8000 50051
# --host 0.0.0.0: reachable from other containers; --workers: one event loop per core
ENTRYPOINT ["feature-store", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--grpc-port", "50051", "--workers", "2"]

FROM base AS ingest
# PySpark runs on a JVM
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install "$(ls /wheels/*.whl)[spark]"
USER features
ENTRYPOINT ["feature-store", "ingest"]
