# syntax=docker/dockerfile:1
# onramp's image: `docker build -t onramp .` (any OCI builder: docker, podman, buildah, kaniko).
#
# Builder: the Rust toolchain the project is built and tested with (rust 1.95 on Debian
# bookworm), so the binary links against the same glibc as the runtime below.
# Runtime: debian:bookworm-slim with only CA certificates (TLS to Authentik, Slack, the
# Kubernetes API) and the OpenSSH client (ONRAMP_SLURM_VIA=ssh). No kubectl, no shell scripts:
# onramp speaks to the Kubernetes API itself. It runs as uid/gid 65532 and writes nothing outside
# mounted volumes, so it works with a read-only root filesystem (give it an emptyDir on /tmp).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and build directory between builds (BuildKit); the binary is
# copied out because the target directory is a cache, not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin onramp \
    && install -D -m 0755 target/release/onramp /out/onramp

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates openssh-client \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 onramp \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin onramp
COPY --from=build /out/onramp /usr/local/bin/onramp
# ssh needs a passwd entry for its user (added above); it writes nothing when given
# StrictHostKeyChecking=yes and a pinned UserKnownHostsFile, which is how onramp calls it.
USER 65532:65532
ENV ONRAMP_LOG_FORMAT=json
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/onramp"]
CMD ["serve"]
