# gpuslice node agent image. Built and pushed by `make image-push` or .github/workflows/image.yml
# (see docs/install.md, "The image"); the chart's default image is what that path produces:
#   ghcr.io/gpuslice/gpuslice:<version in pyproject.toml> (= the chart's appVersion).
#
# Stage 1 builds the wheel (no compilers or build tools reach the final image); stage 2
# installs it into a virtualenv, copied into a slim runtime stage. The wheel leaves out the
# test doubles (gpuslice.testing; see pyproject.toml).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-deps -w /wheels . \
 && python -m venv /opt/gpuslice \
 && /opt/gpuslice/bin/pip install /wheels/gpuslice-*.whl

FROM python:3.11-slim
# The NVIDIA container toolkit injects the driver libraries (libnvidia-ml.so.1) and
# nvidia-smi / nvidia-cuda-mps-control at run time (NVIDIA_VISIBLE_DEVICES=all in the chart),
# so the image carries no driver.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/gpuslice/bin:$PATH
COPY --from=build /opt/gpuslice /opt/gpuslice
RUN useradd --system --uid 65532 --home-dir /nonexistent --shell /usr/sbin/nologin gpuslice

# Non-root by default: `gpuslice top|describe|labels|demo` and a plugin run that only needs
# its own socket directory work as this user. The device plugin on a real node needs root
# (the chart sets runAsUser: 0): the kubelet's /var/lib/kubelet/device-plugins is root-owned,
# MPS sets EXCLUSIVE_PROCESS compute mode through nvidia-smi and owns the MPS pipe
# directory, and per-pod attribution under hostPID reads other users' /proc/<pid>/cgroup.
USER 65532:65532
WORKDIR /
ENTRYPOINT ["gpuslice"]
CMD ["plugin"]
