# The flexinfer-proxy image (docker or podman). The Helm chart deploys it as
# ghcr.io/flexinfer/flexinfer-proxy:<chart appVersion>; `cargo xtask image` builds and tags it.
#
#   docker build -t ghcr.io/flexinfer/flexinfer-proxy:0.1.0 .      # everything from source
#   podman build -t ghcr.io/flexinfer/flexinfer-proxy:0.1.0 .
#
# The default target (the last stage, `runtime`) compiles the eBPF object and the proxy in the
# builder stage, profile-guided: `cargo xtask pgo` builds an instrumented proxy, trains it on the
# benches' proxy rows against nginx upstreams on the builder's loopback (apt brings nginx,
# haproxy and wrk into the builder only; the eBPF-gauge row needs BPF, which a build has not),
# and builds again with the profile: about 20 min on 2 cores. `--build-arg PGO=0` builds the
# plain release binary (whole-program LTO) in about 7. The `runtime-prebuilt` target packages a
# binary built outside instead:
#
#   docker build --target runtime-prebuilt --build-arg BINARY=flexinfer-proxy -f Dockerfile DIR
#
# where DIR holds that binary (`cargo xtask image --prebuilt` does this). The runtime stages
# hold the binary only: no shell, no package manager. It runs as root because loading BPF
# programs needs it (the chart makes the container privileged; with eBPF off it runs as 65532).

# Pinned toolchains: stable builds the proxy, this nightly (LLVM 22) the eBPF object with
# bpf-linker linked against the nightly's own LLVM.
ARG RUST_IMAGE=docker.io/library/rust:1.95.0-bookworm
ARG NIGHTLY=nightly-2026-05-20
ARG BPF_LINKER_VERSION=0.13.0
# glibc and libgcc only, from the same Debian release as the builder.
ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12

FROM ${RUNTIME_BASE} AS runtime-base
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="flexinfer-proxy" \
      org.opencontainers.image.description="L7 request router for OpenAI-compatible LLM servers, eBPF load gauge" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/flexinfer/flexinfer-proxy" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# SIGTERM drains requests in flight (--drain-timeout, 30 s), within the chart's 60 s grace.
STOPSIGNAL SIGTERM
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/flexinfer-proxy"]
CMD ["serve"]

# A binary built outside the image (BINARY is relative to the build context).
FROM runtime-base AS runtime-prebuilt
ARG BINARY=flexinfer-proxy
COPY ${BINARY} /usr/local/bin/flexinfer-proxy

FROM ${RUST_IMAGE} AS builder
ARG NIGHTLY
ARG BPF_LINKER_VERSION
ENV FLEXINFER_NIGHTLY=${NIGHTLY}
# The nightly with rust-src (-Z build-std=core), then bpf-linker linked against that nightly's
# libLLVM (Debian's LLVM is too old). A layer of its own: source changes do not redo it.
RUN rustup component add llvm-tools \
 && rustup toolchain install "${NIGHTLY}" --profile minimal --component rust-src \
 && sysroot="$(rustc "+${NIGHTLY}" --print sysroot)" \
 && libllvm="$(ls "${sysroot}"/lib/libLLVM.so.* | head -n 1)" \
 && major="$(basename "${libllvm}" | sed 's/^libLLVM\.so\.\([0-9]*\).*/\1/')" \
 && mkdir -p /opt/rust-llvm/lib \
 && ln -sf "${libllvm}" /opt/rust-llvm/lib/libLLVM.so \
 && LLVM_PREFIX=/opt/rust-llvm cargo "+${NIGHTLY}" install bpf-linker \
      --version "${BPF_LINKER_VERSION}" --locked --no-default-features --features "llvm-${major}" \
 && rm -rf "${CARGO_HOME}/registry"
WORKDIR /src
COPY . .
ARG PGO=1
# The eBPF object first: routing-userspace's build script embeds target/bpf/routing-ebpf.o.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo xtask build-ebpf \
 && if [ "${PGO}" = 1 ]; then \
      cargo xtask pgo && built=target/pgo/flexinfer-proxy; \
    else \
      cargo build --release --locked -p routing-userspace --bin flexinfer-proxy \
      && built=target/release/flexinfer-proxy; \
    fi \
 && objcopy --strip-debug "${built}" /flexinfer-proxy \
 && /flexinfer-proxy --version

FROM runtime-base AS runtime
COPY --from=builder /flexinfer-proxy /usr/local/bin/flexinfer-proxy
