# syntax=docker/dockerfile:1.7
# One image for every StitchCUDA service, in two targets:
#   cpu   gateway, planner, coder, verifier.cpu (C++ extensions built with the host compiler)
#   cuda  verifier.build (nvcc, no GPU needed) and verifier.gpu (runs the builds on a GPU)
# Build:  docker build --target cpu  -t stitchcuda-cpu:0.1.0 .
#         docker build --target cuda -t stitchcuda-cuda:0.1.0 .
# The service is chosen by the command: python -m stitchcuda.<gateway|planner|coder|verifier ...>.

ARG PYTHON_IMAGE=python:3.12.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04

# ---------------------------------------------------------------------------------------------
# cpu: Debian slim + CPython 3.12; g++ and ninja because the CPU backend compiles candidates.
FROM ${PYTHON_IMAGE} AS cpu

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/stitchcuda \
    PATH=/opt/stitchcuda/bin:$PATH \
    STITCH_HOME=/var/lib/stitchcuda \
    TORCH_EXTENSIONS_DIR=/var/lib/stitchcuda/torch_extensions \
    HOME=/var/lib/stitchcuda \
    XDG_CACHE_HOME=/var/lib/stitchcuda/cache \
    TRITON_CACHE_DIR=/var/lib/stitchcuda/cache/triton \
    HEALTHCHECK_URL=http://127.0.0.1:9100/metrics

# bubblewrap: the Verifier's sandbox (no network, read-only system, private work dir).
# tini: PID 1 that forwards signals and reaps the harness subprocesses.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap tini g++ ninja-build ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv "$VIRTUAL_ENV" \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /src
# Dependencies first (a layer that survives source edits): install from the metadata alone, then
# drop the placeholder package and install the real sources without touching the dependencies.
COPY pyproject.toml setup.py ./
RUN mkdir -p services shared proto/stitchcuda/api training \
    && pip install ".[platform]" \
    && pip uninstall -y stitchcuda
COPY . .
RUN pip install --no-deps . \
    && python -m stitchcuda.shared.selfcheck

RUN useradd --uid 10001 --no-create-home --home-dir /var/lib/stitchcuda --shell /usr/sbin/nologin stitch \
    && install -d -o stitch -g stitch "$HOME" "$TORCH_EXTENSIONS_DIR" "$XDG_CACHE_HOME"
WORKDIR /var/lib/stitchcuda
USER 10001:10001

EXPOSE 8080 50051 9100
# Workers answer on their metrics port, the gateway on /healthz (compose and k8s set the URL).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os,urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["tini", "--"]
CMD ["python", "-m", "stitchcuda.gateway"]

# ---------------------------------------------------------------------------------------------
# cuda: the CUDA devel image brings nvcc and the CUDA headers; Ubuntu 24.04's CPython is 3.12.
FROM ${CUDA_IMAGE} AS cuda

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# Build for the data-centre GPUs the verifier pool runs on (H100/H200 = 9.0); extend as needed.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/stitchcuda \
    PATH=/opt/stitchcuda/bin:$PATH \
    STITCH_HOME=/var/lib/stitchcuda \
    TORCH_EXTENSIONS_DIR=/var/lib/stitchcuda/torch_extensions \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HOME=/var/lib/stitchcuda \
    XDG_CACHE_HOME=/var/lib/stitchcuda/cache \
    TRITON_CACHE_DIR=/var/lib/stitchcuda/cache/triton \
    HEALTHCHECK_URL=http://127.0.0.1:9100/metrics

RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev bubblewrap tini g++ ninja-build ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv "$VIRTUAL_ENV" \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /src
COPY pyproject.toml setup.py ./
# CUTLASS's headers (the nvidia-cutlass package, its C++ headers only) for candidates that instantiate its
# templates: the builder adds them to such a build (shared/cutlass.py), its utility headers too (the Hopper
# convolution includes cutlass/util/).
RUN mkdir -p services shared proto/stitchcuda/api training \
    && pip install ".[platform]" \
    && pip install --no-deps "nvidia-cutlass==4.2.0.0" \
    && pip uninstall -y stitchcuda
COPY . .
RUN pip install --no-deps . \
    && python -c "import stitchcuda.verifier, stitchcuda.shared.metrics" \
    && python -c "from stitchcuda.shared import cutlass; assert cutlass.include_dir(), 'CUTLASS headers'" \
    && python -c "from stitchcuda.shared import cutlass; assert cutlass.util_include_dir(), 'CUTLASS util'" \
    && nvcc --version

# Ubuntu images ship a uid-1000 "ubuntu" user; the service user gets the same uid as the cpu target.
RUN useradd --uid 10001 --no-create-home --home-dir /var/lib/stitchcuda --shell /usr/sbin/nologin stitch \
    && install -d -o stitch -g stitch "$HOME" "$TORCH_EXTENSIONS_DIR" "$XDG_CACHE_HOME"
WORKDIR /var/lib/stitchcuda
USER 10001:10001

EXPOSE 9100
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os,urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["tini", "--"]
CMD ["python", "-m", "stitchcuda.verifier", "--queues", "verifier.gpu"]
