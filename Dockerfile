# syntax=docker/dockerfile:1
# rdma-device-plugin image: built from Debian 12 packages, run on bookworm-slim with only the
# shared libraries the binary links (test/chart/test_image.py checks that list against the
# binary's DT_NEEDED entries and that every package exists).
#
#   docker build --build-arg RDP_VERSION=$(cat VERSION) -t <registry>/rdma-device-plugin:$(cat VERSION) .
#
# The binary's version comes from VERSION (CMake reads it); RDP_VERSION labels the image, and its
# default is held to VERSION by test/chart/test_version.py.
#
# The plugin runs as root (it owns a socket in the kubelet's root-owned device-plugin directory)
# with every capability dropped; the chart sets that security context.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
WORKDIR /src
# Dependencies first, in their own layer: source edits do not re-run apt. Only what building
# needs (--build: no test tools).
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build && rm -rf /var/lib/apt/lists/*
COPY . .
# ccache (CMakeLists.txt uses it when present) in a build cache mount: a rebuild after a source
# edit compiles only what changed. Needs BuildKit (docker's default builder) or buildah/podman;
# the image is the same with an empty cache.
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
          -DRDP_BUILD_BENCHMARKS=OFF \
 && cmake --build /build --target rdma-device-plugin -j"$(nproc)" \
 && install -D -m 0755 -s /build/cmd/rdma-device-plugin /out/rdma-device-plugin \
 && /out/rdma-device-plugin --version

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG RDP_VERSION=0.8.0
# Exactly the runtime packages of the libraries the binary links (libc6, libgcc-s1 and
# libstdc++6 are already in the base image); apt brings their own dependencies.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libabsl20220623 \
      libcivetweb1 \
      libcurl4 \
      libfmt9 \
      libgrpc++1.51 \
      libgrpc29 \
      libhwloc15 \
      libprotobuf32 \
      libspdlog1.10 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/rdma-device-plugin /usr/bin/rdma-device-plugin
LABEL org.opencontainers.image.title="rdma-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for RDMA HCAs (rdma/hca), shared or exclusive per node" \
      org.opencontainers.image.version="${RDP_VERSION}" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
ENTRYPOINT ["/usr/bin/rdma-device-plugin"]
CMD ["serve"]
