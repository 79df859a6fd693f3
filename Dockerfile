# gpuslice node agent image. Built and pushed by `make image-push` or .github/workflows/image.yml
# (see docs/install.md, "The image"); the chart's default image is what that path produces:
#   ghcr.io/gpuslice/gpuslice:<version in pyproject.toml> (= the chart's appVersion).
# CI builds it without Docker (scripts/build-image: buildah on an mmdebstrap base) and runs
# it in tests/image, so it must keep working on both bases below.
#
# Stage 1 builds the wheel and installs it into a virtualenv; the runtime stage copies only
# the virtualenv (no sources, wheels or build tools reach it). The wheel leaves out the test
# doubles (gpuslice.testing; see pyproject.toml).

# BASE: any Debian-like image with python3 3.11, the venv module and useradd. The default is
# what Docker users pull; where no registry serves it, scripts/build-image makes a stand-in
# with mmdebstrap and passes it here (docs/install.md, "Building without Docker").
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# Where pip reaches PyPI through a TLS-intercepting proxy, pass the host's CA bundle as the
# build secret `ca-bundle` (docker build --secret id=ca-bundle,src=...; buildah bud --secret
# likewise): a secret is mounted for this one step and never lands in a layer, unlike a
# COPY or a build arg. Without it pip trusts its own bundle. pip comes from the venv, not
# the base's interpreter: Debian's python3 has no pip module, python:3.11-slim's has.
RUN --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then \
      export PIP_CERT=/run/secrets/ca-bundle SSL_CERT_FILE=/run/secrets/ca-bundle; \
    fi \
 && python3 -m venv /opt/gpuslice \
 && /opt/gpuslice/bin/pip wheel --no-deps -w /wheels . \
 && /opt/gpuslice/bin/pip install /wheels/gpuslice-*.whl

FROM ${BASE}
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
