# gpufeed training image: CUDA 12 runtime, torch (CUDA build) and DALI (nvidia-dali-cuda120).
#
#   docker build -f docker/train.Dockerfile -t gpufeed-train .
#   docker run --gpus all -v $PWD/data:/data gpufeed-train train --config /data/train.yaml
#
# The project is installed with the README's own set-up (`make setup`: a venv, the torch build
# named by TORCH_SPEC, then `pip install -e ".[test]"`), so CI exercises the same commands.
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
COPY . /opt/gpufeed

# No GPU is visible while building, so name the CUDA build of torch instead of letting the
# Makefile pick the CPU wheel (PyPI's Linux x86-64 torch wheels are the CUDA 12 builds).
ARG TORCH_SPEC=torch
RUN make setup TORCH_SPEC="${TORCH_SPEC}"

ENV PATH=/opt/gpufeed/.venv/bin:$PATH
WORKDIR /data
ENTRYPOINT ["gpufeed"]
CMD ["--help"]
