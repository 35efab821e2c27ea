# leasehold: one static binary in an otherwise empty image.
#
#   docker build -t leasehold/leasehold:0.1.0 .
#
# The build stage links against musl, so the final image needs no libc, no
# shell and no package manager: only the binary and the CA bundle that
# rediss:// connections check servers against.

FROM rust:1.95-slim-bookworm AS build
# The musl target of the build platform's architecture (x86_64 or aarch64).
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
# Cache mounts keep the registry and the dependencies' build between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target "$(uname -m)-unknown-linux-musl" -p leasehold --bin leasehold \
 && cp "target/$(uname -m)-unknown-linux-musl/release/leasehold" /leasehold

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /leasehold /leasehold
# A numeric user, so runAsNonRoot can verify it without an /etc/passwd.
USER 65532:65532
# 8080: controller probes and metrics; 4040: the agent's local API.
EXPOSE 8080 4040
ENTRYPOINT ["/leasehold"]
