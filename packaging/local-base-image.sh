#!/usr/bin/env bash
# Make a local Debian bookworm image to build the add-on on where no image registry can be
# reached (this project's CI): packaging/local-base-image.sh [TAG] (default edgeasr/bookworm-base).
# Prints the tag. Kept by Docker between runs: an existing TAG is reused as it is.
#
# debootstrap's minimal variant of the Debian release Home Assistant's base-debian images are
# built on, made slim as their parent, debian:<release>-slim, is (no documentation, manual pages
# or translations, dpkg told to install none), and imported as an image. The machine's CA bundle goes in at a path of its own with
# PIP_CERT pointing at it, so that pip inside a build trusts a proxy this machine trusts
# (Debian's ca-certificates would rewrite the usual bundle on install).
set -euo pipefail

TAG=${1:-edgeasr/bookworm-base}
SUITE=bookworm
HOST_CA=/etc/ssl/certs/ca-certificates.crt
# Debian's images (and Home Assistant's bases on them) set PATH; an imported root has none, and
# Docker's classic builder then expands the Dockerfile's $PATH to nothing
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() { echo "local-base-image.sh: $*" >&2; exit 1; }

if docker image inspect "$TAG" > /dev/null 2>&1; then
    echo "$TAG"
    exit 0
fi
command -v debootstrap > /dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/edgeasr-base.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
echo "local-base-image.sh: debootstrap --variant=minbase $SUITE" >&2
if ! debootstrap --variant=minbase "$SUITE" "$ROOT" > "$ROOT.log" 2>&1; then
    tail -20 "$ROOT.log" >&2
    rm -f "$ROOT.log"
    die "debootstrap failed"
fi
rm -f "$ROOT.log"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
cat > "$ROOT/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
CFG
find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$ROOT/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$ROOT"/usr/share/groff/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/man/*
if [ -f "$HOST_CA" ]; then
    cp "$HOST_CA" "$ROOT/etc/host-ca.pem"
    tar -C "$ROOT" -c . | docker import --change "ENV PATH=$BASE_PATH" --change 'ENV PIP_CERT=/etc/host-ca.pem' \
        - "$TAG" > /dev/null
else
    tar -C "$ROOT" -c . | docker import --change "ENV PATH=$BASE_PATH" - "$TAG" > /dev/null
fi
echo "$TAG"
