# Railhook: one image, every role (`railhook ingest | relay | worker | migrate | slot …`).
# Multi-stage: the build stage compiles against the committed .sqlx/ query data (no database
# needed at build time); the runtime stage is Debian slim with CA certificates and a non-root
# user, nothing else.
#
#   docker build -t railhook --build-arg RAILHOOK_GIT_SHA=$(git rev-parse HEAD) .
FROM rust:1.95-bookworm AS build
WORKDIR /src
# librdkafka is built from source by rdkafka-sys (make, gcc, zlib: all in the rust image).
COPY . .
ENV SQLX_OFFLINE=true
# Shown as the `commit` label of railhook_build_info.
ARG RAILHOOK_GIT_SHA=unknown
ENV RAILHOOK_GIT_SHA=${RAILHOOK_GIT_SHA}
RUN cargo build --release --locked --bin railhook \
    && strip target/release/railhook

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin railhook
COPY --from=build /src/target/release/railhook /usr/local/bin/railhook
USER 10001:10001
# Listen on all interfaces inside the container (the defaults are loopback-only).
ENV RAILHOOK_HTTP_ADDR=0.0.0.0:8080 \
    RAILHOOK_METRICS_ADDR=0.0.0.0:9464 \
    RAILHOOK_LOG_FORMAT=json
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/railhook"]
CMD ["all"]
