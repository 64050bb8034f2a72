# The gpufeed inference server: `gpufeed serve` with DALI GPU decoding and onnxruntime-gpu.
#
#   docker build -f docker/server.Dockerfile -t gpufeed-server .        (from the repository root)
#   docker run --gpus all -p 127.0.0.1:8000:8000 -v "$PWD/models:/models:ro" gpufeed-server
#
# Same base rules as the training image: a CUDA 12 runtime (DALI's cuda120 wheels, torch's and
# onnxruntime-gpu's CUDA 12 builds) with cuDNN for onnxruntime's CUDA provider. Installed the same
# two steps: `make deps` (torch and the runtime dependencies, from pyproject.toml alone: a layer
# that survives source changes), then the source and `make install` (gpufeed, not editable, no
# extras); the source copy is removed afterwards.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

# NVDEC (video decoding) needs the `video` driver capability; `compute` runs CUDA, `utility` gives nvidia-smi.
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
# There is no driver at build time, so the CUDA build of torch is named instead of detected with nvidia-smi.
ARG TORCH_SPEC=torch
RUN make deps TORCH_SPEC="${TORCH_SPEC}" PYTHON=python3

COPY . /opt/gpufeed/src
RUN make -C src install VENV=/opt/gpufeed/.venv \
    && rm -rf src \
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
