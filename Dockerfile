# syntax=docker/dockerfile:1
#
# replicad container image: a static-ish release build on Debian bookworm.
#
#   docker build -t replicad .
#   docker run --rm -v /srv/app:/data -v ./replicad.yml:/etc/replicad.yml:ro replicad
#
# The default command replicates the databases of /etc/replicad.yml; override it for a
# one-off restore, e.g.:
#   docker run --rm -v /srv/app:/data replicad restore --config /etc/replicad.yml \
#       --if-db-not-exists --if-replica-exists /data/app.db

# --- Build stage ---------------------------------------------------------------------------
FROM rust:1.95-bookworm AS builder

WORKDIR /src

# Dependencies first, so that a source change does not rebuild every crate: build a stub
# crate against the locked dependency set, then the real sources.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/ltx_codec.rs \
    && cargo build --release --locked \
    && rm -rf src benches

COPY src ./src
COPY benches ./benches
# Make cargo notice the real sources are newer than the stub build.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin replicad \
    && install -m 0755 target/release/replicad /usr/local/bin/replicad

# --- Runtime stage -------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates: TLS to S3 endpoints. tzdata is not needed (replicad logs in UTC).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# An unprivileged user (the "nonroot" uid/gid of distroless images).
RUN groupadd --system --gid 65532 replicad \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent \
       --no-create-home --shell /usr/sbin/nologin replicad \
    && mkdir -p /data \
    && chown 65532:65532 /data

COPY --from=builder /usr/local/bin/replicad /usr/local/bin/replicad

USER 65532:65532
WORKDIR /data
# The metrics/health endpoint (`addr: ":9090"` in the configuration).
EXPOSE 9090
# replicad does a final sync and drains pending uploads on SIGTERM (see
# shutdown-sync-timeout); give `docker stop -t` more than that timeout.
STOPSIGNAL SIGTERM

ENTRYPOINT ["replicad"]
CMD ["replicate", "--config", "/etc/replicad.yml"]
