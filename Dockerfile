# syntax=docker/dockerfile:1
#
# queuegate container image.
#
#   docker build -t queuegate .
#   docker run --rm queuegate keygen                      # make a signing key
#   docker run --rm -p 8080:8080 -p 9901:9901 \
#     -e QUEUEGATE_KEY_K1=<key> \
#     -v "$PWD/queuegate.yaml:/etc/queuegate/queuegate.yaml:ro" queuegate
#
# The image ships deploy/docker/queuegate.yaml as its default config: listen on
# 0.0.0.0:8080, admin on 0.0.0.0:9901 (so probes from outside the container
# reach it), origin on 127.0.0.1:3000 (the app container in the same pod),
# memory store. Mount your own file over /etc/queuegate/queuegate.yaml.
# Check a file before shipping it:
#   docker run --rm -v "$PWD/q.yaml:/q.yaml:ro" queuegate check -c /q.yaml

ARG RUST_VERSION=1
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
WORKDIR /src

# Dependencies first. With only the manifest, the lock file and empty targets,
# this layer is rebuilt when Cargo.toml or Cargo.lock change, not on every
# source edit. Cargo.toml declares a bench target, so a placeholder for it
# is made as well. Afterwards the placeholder crate's own artifacts are
# removed so the real sources below are always compiled.
COPY Cargo.toml Cargo.lock ./
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/admission.rs \
    && cargo build --release --locked \
    && rm -rf src benches \
        target/release/queuegate target/release/queuegate.d \
        target/release/.fingerprint/queuegate-* \
        target/release/deps/queuegate-* target/release/deps/libqueuegate-*

# The real sources (.dockerignore keeps target/, .git and the like out).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    cargo build --release --locked --bin queuegate


FROM debian:${DEBIAN_RELEASE}-slim

# ca-certificates: for an https:// upstream and rediss:// stores.
# Versions are not pinned: the Debian release is pinned above and its
# point releases only carry security and grave fixes, which the image
# should pick up on rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 queuegate \
    && useradd --system --uid 10001 --gid queuegate \
        --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin queuegate

COPY --from=builder /src/target/release/queuegate /usr/local/bin/queuegate
COPY deploy/docker/queuegate.yaml /etc/queuegate/queuegate.yaml

# Numeric, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001

# 8080 public HTTP, 8443 public TLS (when the config has a tls listener),
# 9901 admin: /metrics /healthz /readyz /routes.
EXPOSE 8080 8443 9901

# SIGTERM drains: stop accepting, finish in-flight requests (at most
# limits.drain_timeout, 30s by default), then exit. Give `docker stop` a
# longer timeout than that: docker stop -t 40.
STOPSIGNAL SIGTERM

# Liveness from the admin listener's /healthz. The image has no curl; bash
# speaks the one HTTP/1.0 request over /dev/tcp and checks for a 200.
# 127.0.0.1:9901 is reached whether the admin listener is bound to 127.0.0.1
# (the default) or 0.0.0.0; change the port here if your config moves it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9901 && printf 'GET /healthz HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3 && IFS= read -r status <&3 && [[ $status == HTTP/1.?' 200 '* ]]"]

ENTRYPOINT ["queuegate"]
CMD ["run", "-c", "/etc/queuegate/queuegate.yaml"]
