# syntax=docker/dockerfile:1
# The gpu-tailor image: `gpu-tailor webhook` and `gpu-tailor extender` as manifests/ run them (and
# `certs`, and `simulate` without --plot: matplotlib is the optional `plot` extra, left out here).
#
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/gpu-tailor/gpu-tailor:0.1.0 .
#
# The builder turns the project and every runtime dependency into wheels; the final stage installs
# only those wheels, offline, and keeps no compiler, no pip cache, and no pip, setuptools or wheel.
# It runs as 65532:65532 under readOnlyRootFilesystem: bytecode is compiled here, Python is told not
# to write any at run time, and HOME and TMPDIR are /tmp, where the Deployments mount an emptyDir.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# what the wheel build reads, and all that .dockerignore lets into the context
COPY pyproject.toml README.md ./
COPY gpu_tailor ./gpu_tailor
# Every runtime dependency publishes manylinux wheels for CPython 3.11 (amd64 and arm64), so
# --prefer-binary compiles nothing; the cache mount speeds up rebuilds and is never part of a layer.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --prefer-binary --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# VERSION must be the version in pyproject.toml: the install below pins it, so a stale label fails the build.
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-tailor" \
      org.opencontainers.image.description="Portable GPU asks for Kubernetes: admission webhook and scheduler extender" \
      org.opencontainers.image.source="https://github.com/gpu-tailor/gpu-tailor" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
# The wheels are bind-mounted from the builder rather than copied, so they never become a layer.
# The official image ships the standard library without .pyc files; compiling it and site-packages
# here saves every start (and every exec probe) from compiling in memory what it cannot write.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
 && pip install --no-index --find-links /wheels --no-compile "gpu-tailor==${VERSION}" \
 && pip check \
 && pip uninstall --yes setuptools wheel \
 && python -m pip uninstall --yes pip \
 && python -m compileall -q -j 0 /usr/local/lib/python3.11
# relative paths (`gpu-tailor certs --out certs-out`, `simulate --json runs.json`) land on the emptyDir
WORKDIR /tmp
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpu-tailor"]
CMD ["--help"]
