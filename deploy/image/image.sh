#!/bin/sh
# The watcher image (deploy/image/Containerfile), tagged with the project's version.
#   deploy/image/image.sh tag      print the image reference (what the DaemonSet must name)
#   deploy/image/image.sh build    build it with podman (or ENGINE=docker), from a context
#                                  that holds only what the Containerfile copies
# IMAGE_REPO overrides the repository (default: the DaemonSet's, registry.example.com/stallscope).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$ROOT/pyproject.toml" | head -n 1)
[ -n "$VERSION" ] || { echo "image.sh: no version in $ROOT/pyproject.toml" >&2; exit 1; }
REF="${IMAGE_REPO:-registry.example.com/stallscope}:$VERSION"
case "${1:-tag}" in
    tag)
        echo "$REF" ;;
    build)
        ENGINE="${ENGINE:-podman}"
        CTX=$(mktemp -d)
        trap 'rm -rf "$CTX"' EXIT
        # the files the Containerfile copies, without caches
        tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' -cf - capture bpf | tar -C "$CTX" -xf -
        "$ENGINE" build -f "$HERE/Containerfile" --build-arg "VERSION=$VERSION" -t "$REF" "$CTX"
        echo "$REF" ;;
    *)
        echo "usage: $0 [tag|build]" >&2; exit 2 ;;
esac
