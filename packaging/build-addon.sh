#!/usr/bin/env bash
# Build the Home Assistant add-on's image for this machine's architecture from this checkout:
#
#   packaging/build-addon.sh [--base IMAGE] [--tag TAG]   prints the image's tag
#   packaging/build-addon.sh --vendor                     a release: wheels/ for the Supervisor
#
# The build context is a copy of packaging/homeassistant/edgeasr, as the Supervisor builds that
# folder, with wheels/ made by wheelhouse.sh from this checkout: edgeasr's wheel and every
# runtime wheel (Home Assistant's sentences too), so the image installs offline (nothing of edgeasr is downloaded). --base names
# the image for BUILD_FROM (default: build.yaml's, Home Assistant's Debian base, from its
# registry); packaging/local-base-image.sh makes one where no registry can be reached. The tag
# defaults to edgeasr/<arch>-addon-edgeasr:<version>, the version pyproject.toml's.
#
# --vendor writes packaging/homeassistant/edgeasr/wheels/ for a release commit: edgeasr's wheel
# and the lock for both architectures (each wheel's sha256 for amd64 and for arm64), so that the
# Supervisor, which builds from that folder alone, installs this release and takes the other
# wheels from PyPI, checked against the lock.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
ADDON=$HERE/homeassistant/edgeasr

# Home Assistant's sentences for the home's commands (pyproject.toml's extra): an add-on serves
# Assist alone, and the tests compare it with the daemon that has them
EXTRAS=sentences

die() { echo "build-addon.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 [--base IMAGE] [--tag TAG] | --vendor" >&2; exit 64; }

base="" tag="" vendor=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) [ $# -ge 2 ] || usage; base=$2; shift 2 ;;
        --tag) [ $# -ge 2 ] || usage; tag=$2; shift 2 ;;
        --vendor) vendor=1; shift ;;
        *) usage ;;
    esac
done

VERSION=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$REPO/pyproject.toml")
[ -n "$VERSION" ] || die "no version = \"...\" in pyproject.toml"
ADDON_VERSION=$(sed -n 's/^version: "\([^"]*\)"$/\1/p' "$ADDON/config.yaml")
[ "$ADDON_VERSION" = "$VERSION" ] || die "the add-on's config.yaml says $ADDON_VERSION, pyproject.toml $VERSION"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgeasr-addon.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

if [ "$vendor" = 1 ]; then
    for arch in amd64 arm64; do
        "$HERE/wheelhouse.sh" "$arch" "$WORK/$arch" "$EXTRAS" >&2
    done
    rm -rf "$ADDON/wheels"
    mkdir -p "$ADDON/wheels"
    cp "$WORK"/amd64/edgeasr-*.whl "$ADDON/wheels/"
    # one line per wheel, with every architecture's sha256 (pip takes any one of them); edgeasr's
    # own wheel is the amd64 run's, the one copied
    { cat "$WORK"/amd64/requirements.txt; grep -v '^edgeasr==' "$WORK"/arm64/requirements.txt; } | sort | awk '
        { key = $1; sub(/^[^ ]+ /, ""); if (!(key in hashes)) order[++n] = key;
          if (index(hashes[key], $0) == 0) hashes[key] = hashes[key] " " $0 }
        END { for (i = 1; i <= n; i++) print order[i] hashes[order[i]] }' > "$ADDON/wheels/requirements.txt"
    echo "$ADDON/wheels"
    exit 0
fi

case "$(dpkg --print-architecture)" in
    amd64) ARCH=amd64 HASS_ARCH=amd64 ;;
    arm64) ARCH=arm64 HASS_ARCH=aarch64 ;;
    *) die "unsupported architecture $(dpkg --print-architecture) (amd64 or arm64)" ;;
esac
if [ -z "$base" ]; then
    base=$(sed -n "s/^  $HASS_ARCH: \(.*\)$/\1/p" "$ADDON/build.yaml")
    [ -n "$base" ] || die "build.yaml names no base image for $HASS_ARCH"
fi
tag=${tag:-edgeasr/$HASS_ARCH-addon-edgeasr:$VERSION}

echo "build-addon.sh: edgeasr $VERSION for $HASS_ARCH on $base" >&2
cp -r "$ADDON" "$WORK/context"
rm -rf "$WORK/context/wheels"
"$HERE/wheelhouse.sh" "$ARCH" "$WORK/context/wheels" "$EXTRAS" >&2
# the build arguments the Supervisor gives (its builder also labels the image); --network host:
# the build's apt runs where the machine's network is (no bridge on CI's machines)
if ! docker build --network host --tag "$tag" \
        --build-arg BUILD_FROM="$base" --build-arg BUILD_VERSION="$VERSION" \
        --build-arg BUILD_ARCH="$HASS_ARCH" --build-arg PIP_NO_INDEX=1 \
        --label io.hass.version="$VERSION" --label io.hass.arch="$HASS_ARCH" --label io.hass.type=addon \
        "$WORK/context" > "$WORK/build.log" 2>&1; then
    tail -40 "$WORK/build.log" >&2
    die "docker build failed"
fi
echo "$tag"
