# The gpufeed inference server: `gpufeed serve` with DALI GPU decoding and onnxruntime's CUDA provider.
#
#   docker build -f docker/server.Dockerfile -t gpufeed-server .        (from the repository root)
#   docker build -f docker/server.Dockerfile --build-arg CUDA_STACK=cuda13 -t gpufeed-server .   (Blackwell)
#   docker run --gpus all -p 127.0.0.1:8000:8000 -v "$PWD/models:/models:ro" gpufeed-server
#
# Same rules as the training image (docker/train.Dockerfile): plain Ubuntu, one CUDA stack named by
# CUDA_STACK (cuda12 by default, on CUDA 12 and 13 drivers; cuda13 for Blackwell GPUs, driver 580+),
# every CUDA library from wheels, cuDNN and cuBLAS included through onnxruntime-gpu's cuda and cudnn
# extras (onnxruntime.preload_dlls() loads them, as the server does before its first CUDA session).
# Installed the same two steps: `make deps` (torch and the stack's requirement set, from
# pyproject.toml and gpufeed/stack/_choice.py alone: a layer that survives source changes), then the
# source and `make install` (gpufeed, not editable, no dependencies, no other extras); the source
# copy is removed afterwards.
FROM ubuntu:24.04

# NVDEC (video decoding) and the hardware JPEG decoder need the `video` driver capability; `compute`
# runs CUDA, `utility` gives nvidia-smi and NVML.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,video,utility \
    DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv make ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/gpufeed
COPY pyproject.toml Makefile ./
COPY gpufeed/stack/_choice.py ./gpufeed/stack/
ARG CUDA_STACK=cuda12
RUN make deps CUDA_STACK="${CUDA_STACK}" PYTHON=python3

COPY . /opt/gpufeed/src
RUN make -C src install VENV=/opt/gpufeed/.venv \
    && rm -rf src gpufeed \
    && .venv/bin/gpufeed --help >/dev/null

ENV PATH=/opt/gpufeed/.venv/bin:$PATH
RUN useradd --create-home --uid 10001 gpufeed
USER gpufeed
WORKDIR /home/gpufeed

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
ENTRYPOINT ["gpufeed"]
CMD ["serve", "--model-repo", "/models", "--host", "0.0.0.0", "--port", "8000"]
