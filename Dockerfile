# syntax=docker/dockerfile:1
# rdma-device-plugin image for linux/amd64 and linux/arm64: built from Debian 12 packages, run on
# bookworm-slim with only the shared libraries the binary links (test/chart/test_image.py checks
# that list against the binary's DT_NEEDED entries and that every package exists).
#
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg RDP_VERSION=$(cat VERSION) \
#     -t <registry>/rdma-device-plugin:$(cat VERSION) --push .
#
# The build stage always runs on the build machine's platform and cross-compiles for another
# target (scripts/build.sh --arch arm64): nothing of the target runs there. The runtime stage
# installs the libraries with apt in the target's base image, which for a foreign target needs
# emulation (qemu binfmt); where there is none, build --target runtime-copied instead: the build
# stage installs the target's libraries (Multi-Arch) and that stage copies them onto
# RDP_RUNTIME_BASE, running nothing (docs/install.md, "Multi-architecture image").
#
# The binary's version comes from VERSION (CMake reads it); RDP_VERSION labels the image, and its
# default is held to VERSION by test/chart/test_version.py.
#
# The plugin runs as root (it owns a socket in the kubelet's root-owned device-plugin directory)
# with every capability dropped; the chart sets that security context.

ARG DEBIAN_RELEASE=bookworm
# BuildKit sets BUILDPLATFORM, TARGETPLATFORM and TARGETARCH itself; podman 4 sets the TARGET ones
# from --platform but BUILDPLATFORM only from --build-arg (BUILDPLATFORM=linux/amd64 on an amd64
# machine): without it and with --platform, the build stage would be the target's too. The
# runtime stages name TARGETPLATFORM: podman would otherwise keep the build stage's platform.
ARG BUILDPLATFORM
ARG TARGETPLATFORM
# runtime-copied's base: an image of the target's architecture (see the top).
ARG RDP_RUNTIME_BASE=debian:bookworm-slim

FROM --platform=$BUILDPLATFORM debian:${DEBIAN_RELEASE} AS build
ARG TARGETARCH
WORKDIR /src
# Dependencies first, in their own layer: source edits do not re-run apt. Only what building
# needs (--build: no test tools), and the cross build's for another architecture.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN native=$(dpkg --print-architecture) \
 && if [ "${TARGETARCH:-$native}" = "$native" ]; then scripts/install-deps.sh --build; \
    else scripts/install-deps.sh --build --arch "$TARGETARCH"; fi \
 && rm -rf /var/lib/apt/lists/*
COPY . .
# ccache (CMakeLists.txt uses it when present) in a build cache mount: a rebuild after a source
# edit compiles only what changed. Needs BuildKit (docker's default builder) or buildah/podman;
# the image is the same with an empty cache. RDP_CCACHE_DIR names another ccache directory, one
# mounted into the build (scripts/build-image.sh mounts the build machine's own with `podman
# build -v`): the build tree is the one scripts/build.sh makes on a machine (build/ or
# build-arm64/ under the sources, its default build type), so the compiles of sources already
# compiled there are cache hits. The binary is installed stripped. For another architecture
# the program cannot run here: its --version is checked by the image test (under qemu), and its
# libraries are gathered for runtime-copied.
ARG RDP_CCACHE_DIR=/root/.cache/ccache
RUN --mount=type=cache,target=/root/.cache/ccache \
    native=$(dpkg --print-architecture) target=${TARGETARCH:-$(dpkg --print-architecture)} \
 && if [ "$target" = "$native" ]; then arch= strip=strip tree=build; \
    else arch="--arch $target" strip=aarch64-linux-gnu-strip tree=build-$target; fi \
 && CCACHE_DIR=$RDP_CCACHE_DIR RDP_BUILD_TARGETS=rdma-device-plugin \
      scripts/build.sh $arch -DBUILD_TESTING=OFF -DRDP_BUILD_BENCHMARKS=OFF \
 && install -D -m 0755 -s --strip-program="$strip" $tree/cmd/rdma-device-plugin \
      /out/rdma-device-plugin \
 && rm -rf "$tree" \
 && mkdir -p /out/libs \
 && if [ "$target" = "$native" ]; then /out/rdma-device-plugin --version; \
    else scripts/runtime-libs.sh /out/rdma-device-plugin /out/libs; fi

# For a target whose programs cannot run in this build: the libraries from the build stage,
# nothing run. `podman build --platform linux/arm64 --target runtime-copied` (scripts/image-test.sh
# with an arm64 bookworm-slim made by debootstrap --foreign as RDP_RUNTIME_BASE).
FROM --platform=$TARGETPLATFORM ${RDP_RUNTIME_BASE} AS runtime-copied
ARG RDP_VERSION=0.15.0
COPY --from=build /out/libs/ /
COPY --from=build /out/rdma-device-plugin /usr/bin/rdma-device-plugin
LABEL org.opencontainers.image.title="rdma-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for RDMA HCAs (rdma/hca), shared or exclusive per node" \
      org.opencontainers.image.version="${RDP_VERSION}" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
ENTRYPOINT ["/usr/bin/rdma-device-plugin"]
CMD ["serve"]

FROM --platform=$TARGETPLATFORM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG RDP_VERSION=0.15.0
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
