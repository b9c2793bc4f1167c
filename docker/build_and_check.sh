#!/usr/bin/env bash
# Build the onnx2tf_alt Docker image, run its CLI on the shipped model and check that it
# writes the same files, with the same TFLite outputs, as the pip-installed CLI.
#
#   bash docker/build_and_check.sh            (as root; the test tests/cli/test_docker.py runs it)
#
# Environment:
#   ONNX2TF_ALT_CLI  the pip-installed CLI to compare with (default: onnx2tf-alt on PATH)
#   IMAGE            tag of the image to build (default onnx2tf_alt:check)
#   KEEP_IMAGE=1     keep the built image afterwards (it is removed by default: 2.5 GB)
#
# What it does, in order:
#  1. Installs docker.io (and debootstrap) with apt-get when dockerd is missing.
#  2. Starts a Docker daemon when none answers (no bridge, no iptables: what works inside
#     these sandboxed machines; overlay2 storage, else vfs), and stops it again at the end.
#  3. Base image: the registries that serve base images (Docker Hub) are unreachable here,
#     so when the Dockerfile's FROM image (python:3.11-slim) is not on the daemon, this
#     script BUILDS A STAND-IN LOCALLY with debootstrap from Debian's packages (bookworm,
#     whose python3 is 3.11, the FROM's version; TF 2.21 has cp311 wheels) plus a venv with
#     pip on PATH, and `docker import`s it under the FROM tag. It carries this machine's CA
#     bundle and sets PIP_CERT, because PyPI is only reachable through that bundle.
#  4. `docker build --network host` with a context holding only the files the image needs.
#  5. Runs the image's CLI and the pip-installed CLI on tests/data/mobilenet_block.onnx and
#     compares the two output folders with docker/compare_outputs.py.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
image="${IMAGE:-onnx2tf_alt:check}"
host_cli="${ONNX2TF_ALT_CLI:-onnx2tf-alt}"
model="tests/data/mobilenet_block.onnx"
ca_bundle="/etc/ssl/certs/ca-certificates.crt"
work="$(mktemp -d /tmp/onnx2tf_alt_docker.XXXXXX)"
started_daemon=""

log() { printf '[build_and_check] %s\n' "$*"; }

cleanup() {
    if [[ -z "${KEEP_IMAGE:-}" ]] && docker image inspect "$image" >/dev/null 2>&1; then
        docker rmi -f "$image" >/dev/null || true
    fi
    if [[ -n "$started_daemon" ]]; then
        kill "$started_daemon" 2>/dev/null || true
        wait "$started_daemon" 2>/dev/null || true
    fi
    # An interrupted debootstrap can leave proc/sys mounted in the rootfs: never delete
    # across into them.
    umount -R "$work/rootfs/proc" "$work/rootfs/sys" 2>/dev/null || true
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ensure_docker() {
    if command -v dockerd >/dev/null && command -v docker >/dev/null; then
        return
    fi
    log "dockerd not found: installing docker.io and debootstrap from Debian's packages"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap
}

ensure_daemon() {
    if docker info >/dev/null 2>&1; then
        return
    fi
    # overlay2 where the kernel allows it (it does here); vfs, which copies every layer in
    # full (minutes per 2.5 GB container), where it does not.
    local driver
    for driver in overlay2 vfs; do
        log "starting dockerd, $driver storage (log: $work/dockerd.log)"
        dockerd --iptables=false --bridge=none --storage-driver="$driver" \
            >"$work/dockerd.log" 2>&1 &
        started_daemon=$!
        for _ in $(seq 60); do
            docker info >/dev/null 2>&1 && return
            kill -0 "$started_daemon" 2>/dev/null || break
            sleep 1
        done
        kill "$started_daemon" 2>/dev/null || true
        wait "$started_daemon" 2>/dev/null || true
        started_daemon=""
    done
    log "dockerd did not start; its log:"
    cat "$work/dockerd.log"
    exit 1
}

# The Debian release whose python3 has the version in the FROM tag (python:X.Y-slim).
debian_suite_for() {
    case "$1" in
        python:3.11-slim) echo bookworm ;;
        python:3.13-slim) echo trixie ;;
        *)
            log "no Debian release known for base image '$1'; extend debian_suite_for()"
            exit 1
            ;;
    esac
}

build_base_image() {
    local base="$1" suite rootfs
    suite="$(debian_suite_for "$base")"
    rootfs="$work/rootfs"
    command -v debootstrap >/dev/null || {
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
    }
    log "building a local stand-in for $base: debootstrap $suite (registries are unreachable)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$suite" "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log"
        exit 1
    }
    # pip in the image must trust the same CA as this machine's pip does (pip config: cert).
    cp "$ca_bundle" "$rootfs$ca_bundle"
    printf '[global]\ncert = %s\ntimeout = 180\n' "$ca_bundle" >"$rootfs/etc/pip.conf"
    # Like the official image: a Python whose pip installs without PEP 668 complaints.
    chroot "$rootfs" python3 -m venv /opt/python
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change "ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV PIP_CERT=$ca_bundle SSL_CERT_FILE=$ca_bundle LANG=C.UTF-8" \
        --change 'CMD ["python3"]' - "$base" >/dev/null
    rm -rf --one-file-system "$rootfs"
}

command -v "$host_cli" >/dev/null || {
    log "the pip-installed CLI '$host_cli' is not on PATH: pip install . or set ONNX2TF_ALT_CLI"
    exit 2
}
ensure_docker
ensure_daemon

base="$(awk 'toupper($1) == "FROM" { print $2; exit }' docker/Dockerfile)"
if docker image inspect "$base" >/dev/null 2>&1; then
    log "base image $base is present"
else
    build_base_image "$base"
fi
log "base image $base: $(docker image inspect -f '{{.Size}}' "$base" | awk '{printf "%.0f MB", $1/1e6}')"

log "building $image"
previous="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
start=$SECONDS
# Only what the Dockerfile copies goes into the context (not .venv or saved models).
tar -c --exclude=__pycache__ pyproject.toml README.md onnx2tf_alt ops calibration \
    docker/Dockerfile | docker build --network host -q -f docker/Dockerfile -t "$image" - \
    >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log"
    exit 1
}
log "build time: $((SECONDS - start)) s"
if [[ -n "$previous" && "$previous" != "$(docker image inspect -f '{{.Id}}' "$image")" ]]; then
    docker rmi "$previous" >/dev/null 2>&1 || true # the kept image of an earlier run
fi
log "image size: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.2f GB", $1/1e9}')"

mkdir -p "$work/docker_out" "$work/host_out"
log "converting $model with the image's CLI"
docker run --rm --network none --user "$(id -u):$(id -g)" -e HOME=/tmp \
    -v "$repo/tests/data:/data:ro" -v "$work/docker_out:/out" \
    "$image" -i "/data/$(basename "$model")" -o /out/saved_model -osm -n
log "converting $model with the pip-installed CLI ($host_cli)"
"$host_cli" -i "$model" -o "$work/host_out/saved_model" -osm -n

log "comparing the two output folders"
host_python="$(dirname "$(command -v "$host_cli")")/python"
[[ -x "$host_python" ]] || host_python=python3
if ! "$host_python" docker/compare_outputs.py "$work/docker_out/saved_model" \
    "$work/host_out/saved_model"; then
    # Different outputs usually mean different dependency versions: show both sides'.
    versions() { grep -E '^(tensorflow|tf_keras|numpy|onnx|onnxruntime) ' | tr -s ' ' | paste -sd, -; }
    log "image has: $(docker run --rm --network none --entrypoint pip "$image" list | versions)"
    log "pip-installed CLI has: $("$host_python" -m pip list 2>/dev/null | versions)"
    exit 1
fi
