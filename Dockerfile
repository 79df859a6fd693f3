# gpuslice node agent image. Not built in this repository's CI (no container engine there).
# Build: docker build -t ghcr.io/gpuslice/gpuslice:0.1.0 .
FROM python:3.11-slim

# The NVIDIA container toolkit injects the driver libraries (libnvidia-ml.so.1) and
# nvidia-smi / nvidia-cuda-mps-control at run time (NVIDIA_VISIBLE_DEVICES=all in the chart),
# so the image carries no driver.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . && rm -rf /src

WORKDIR /
ENTRYPOINT ["gpuslice"]
CMD ["plugin"]
