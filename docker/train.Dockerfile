# gpufeed training image: torch, DALI and onnxruntime built for one CUDA major (the CUDA stack).
#
#   docker build -f docker/train.Dockerfile -t gpufeed-train .
#   docker build -f docker/train.Dockerfile --build-arg CUDA_STACK=cuda13 -t gpufeed-train .   (Blackwell, driver 580+)
#   docker run --gpus all -v $PWD/data:/data gpufeed-train train --config /data/train.yaml
#
# Every CUDA library comes from wheels (torch's, DALI's, onnxruntime-gpu's cuda and cudnn extras), so
# the base is plain Ubuntu: a CUDA base image would add a second copy of the runtime, of whatever
# version it has. The driver comes from the host through the NVIDIA container toolkit. No GPU is
# visible while building, so the stack is named (CUDA_STACK, docs/gpu.md "CUDA stacks"): cuda12
# (the default: gpufeed's own CUDA 12 dependencies, the cuda12 extra and torch's cu126 build from
# PyTorch's index; runs on any driver with CUDA 12.0 or later, CUDA 13 drivers included, and on
# GPUs up to Hopper) or cuda13 (nvidia-dali-cuda130 and onnxruntime-gpu 1.27+ in place of the CUDA 12
# ones, PyPI's torch, a CUDA 13.0 build; driver 580 or later, needed for Blackwell GPUs).
#
# Installed in two steps with the Makefile's recipes: `make deps` installs the stack's torch and its
# requirement set (gpufeed/stack/_choice.py reads it from pyproject.toml: the runtime dependencies,
# with cuda12's extra or cuda13's replacements), so that slow layer is rebuilt only when those files
# change; then the source is copied and `make install` installs gpufeed itself (not editable, no
# dependencies, no other extras). The source copy is removed afterwards: the image runs the
# installed package, as `pip install` users do.
FROM ubuntu:24.04

# NVDEC (DALI's GPU video decoding) and the hardware JPEG decoder need the `video` capability
# besides compute and utility.
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
WORKDIR /data
ENTRYPOINT ["gpufeed"]
CMD ["--help"]
