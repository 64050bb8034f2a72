# gpufeed training image: CUDA 12 runtime, torch (CUDA build) and DALI (nvidia-dali-cuda120).
#
#   docker build -f docker/train.Dockerfile -t gpufeed-train .
#   docker run --gpus all -v $PWD/data:/data gpufeed-train train --config /data/train.yaml
#
# Installed in two steps with the Makefile's recipes: `make deps` installs the torch build named by
# TORCH_SPEC and gpufeed's runtime dependencies from pyproject.toml alone, so that slow layer is
# rebuilt only when pyproject.toml or the Makefile change; then the source is copied and
# `make install` installs gpufeed itself (not editable, no extras). The source copy is removed
# afterwards: the image runs the installed package, as `pip install` users do.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

# NVDEC (DALI's GPU video decoding) needs the `video` capability besides compute and utility.
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
# No GPU is visible while building, so name the CUDA build of torch instead of letting the
# Makefile pick the CPU wheel (PyPI's Linux x86-64 torch wheels are the CUDA 12 builds).
ARG TORCH_SPEC=torch
RUN make deps TORCH_SPEC="${TORCH_SPEC}" PYTHON=python3

COPY . /opt/gpufeed/src
RUN make -C src install VENV=/opt/gpufeed/.venv \
    && rm -rf src \
    && .venv/bin/gpufeed --help >/dev/null

ENV PATH=/opt/gpufeed/.venv/bin:$PATH
WORKDIR /data
ENTRYPOINT ["gpufeed"]
CMD ["--help"]
