# syntax=docker/dockerfile:1

# solveonce container image: a static Go binary on distroless, run as a
# non-root user, with both ports exposed and a HEALTHCHECK that needs no
# shell (`solveonce healthcheck`).
#
#   docker build -t solveonce .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9090:9090 -v solveonce-data:/data solveonce
#
# Configuration: SOLVEONCE_<SECTION>_<KEY> environment variables, or a TOML
# file mounted anywhere and named by SOLVEONCE_CONFIG (environment variables
# win over the file; the listen addresses below are set that way). The MITM
# CA (ca.pem, ca-key.pem) and the pingback queue live in /data: mount a
# volume there, or mount the CA as secrets and point SOLVEONCE_PROXY_CA_CERT
# and SOLVEONCE_PROXY_CA_KEY at them.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/solveonce . \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="solveonce" \
      org.opencontainers.image.description="Deduplicating caching proxy in front of the CaptchaAI API"
COPY --from=build /out/solveonce /usr/local/bin/solveonce
# An empty /data owned by the runtime user: a named volume mounted there
# starts with this ownership, so solveonce can create its CA in it.
COPY --from=build --chown=65532:65532 /out/data /data
ENV SOLVEONCE_DATA_DIR=/data \
    SOLVEONCE_PROXY_LISTEN=0.0.0.0:8080 \
    SOLVEONCE_ADMIN_LISTEN=0.0.0.0:9090 \
    SOLVEONCE_LOG_FORMAT=json
VOLUME ["/data"]
# 8080: the proxy (base URL and HTTP(S)_PROXY); 9090: /metrics, /healthz,
# /readyz, /stats and the status page.
EXPOSE 8080 9090
USER 65532:65532
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/solveonce", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/solveonce"]
