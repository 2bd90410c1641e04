# koala-rs: one image for the coordinator, the workers and state servers (docs/deploy.md).
#   docker build -t koala .
#   docker run --rm koala --help
# Multi-stage: a release build in the Rust image, then the binary alone on a slim Debian.
# Checked without a Docker daemon (none runs where it was written): hadolint, see docs/deploy.md.

# Keep in step with rust-toolchain.toml.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# The image's gcc builds mimalloc and SQLite (bundled, rusqlite); nothing links a system library.
COPY . .
RUN cargo build --release --locked -p koala \
    && cp target/release/koala /usr/local/bin/koala

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/koala --create-home koala
COPY --from=build /usr/local/bin/koala /usr/local/bin/koala
COPY examples /usr/share/koala/examples
USER 10001
WORKDIR /var/lib/koala
# The coordinator's control port and HTTP API (the ports used in docs/deploy.md and
# deploy/k8s); workers' data ports are chosen by the OS.
EXPOSE 7000 7001
ENTRYPOINT ["/usr/local/bin/koala"]
CMD ["--help"]
