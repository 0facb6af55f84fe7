#!/usr/bin/env bash
# Build the edgeasr Debian package: packaging/build-deb.sh [amd64|arm64]
# (no argument: this machine's architecture). Prints the path of the .deb.
# packaging/build-deb.sh --print-version: the version it would build (pyproject.toml's, checked
# against debian/changelog's top entry).
#
# The package carries a wheelhouse for the target (edgeasr's wheel and its runtime
# dependencies, downloaded from PyPI here, never at install time) and builds
# /opt/edgeasr/venv from it in the postinst. See packaging/README.md.
#
# Environment:
#   EDGEASR_DEB_OUT      where the .deb goes (default: packaging/dist)
#   EDGEASR_PIP_ISOLATE  as wheelhouse.sh takes it (1, the default: PyPI only)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

die() { echo "build-deb.sh: $*" >&2; exit 1; }

# The version has one home, pyproject.toml; debian/changelog's top entry must name it.
VERSION=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$REPO/pyproject.toml")
[ -n "$VERSION" ] || die "no version = \"...\" in pyproject.toml"
CHANGELOG_VERSION=$(sed -n '1s/^edgeasr (\([^)]*\)).*/\1/p' "$HERE/debian/changelog")
[ "$CHANGELOG_VERSION" = "$VERSION" ] || \
    die "debian/changelog's top entry is $CHANGELOG_VERSION, pyproject.toml says $VERSION: add an entry"
if [ "${1:-}" = --print-version ]; then echo "$VERSION"; exit 0; fi

ARCH=${1:-$(dpkg --print-architecture)}
OUT_DIR=${EDGEASR_DEB_OUT:-$HERE/dist}

case "$ARCH" in
    amd64|arm64) ;;
    *) echo "build-deb.sh: unsupported architecture '$ARCH' (amd64 or arm64)" >&2; exit 64 ;;
esac

for f in pyproject.toml config/edgeasr.yaml systemd/edgeasr.service; do
    [ -f "$REPO/$f" ] || die "missing $f"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgeasr-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/edgeasr-$VERSION
WHEELS=$STAGE/wheels
mkdir -p "$STAGE/config"

echo "build-deb.sh: edgeasr $VERSION for $ARCH" >&2

# 1-3. edgeasr's wheel, its runtime dependencies for the target and the lock file.
"$HERE/wheelhouse.sh" "$ARCH" "$WHEELS"

# 4. Each wheel's declared license, for /usr/share/doc/edgeasr (see debian/copyright).
/usr/bin/python3 - "$WHEELS" > "$STAGE/wheel-licenses.txt" <<'PY'
import email.parser, pathlib, sys, zipfile

print("Wheels in /usr/lib/edgeasr/wheels and the licenses their metadata declare.")
print("Full license texts are in each wheel's *.dist-info directory.\n")
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode("utf-8"))
    expression = meta.get("License-Expression")
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::")]
    first_line = (meta.get("License") or "").strip().split("\n")[0]
    named = [expression] if expression else classifiers or ([first_line] if 0 < len(first_line) <= 60 else [])
    licence = "; ".join(named) or "see the wheel's dist-info"
    print(f"{meta['Name']} {meta['Version']}: {licence}")
PY

# 5. The Debian source tree, then the binary package.
cp -r "$HERE/debian" "$STAGE/debian"
cp "$REPO/systemd/edgeasr.service" "$STAGE/debian/edgeasr.service"
cp "$REPO/config/edgeasr.yaml" "$STAGE/config/edgeasr.yaml"
if ! (cd "$STAGE" && dpkg-buildpackage --build=binary --host-arch="$ARCH" -us -uc) \
        > "$WORK/dpkg-buildpackage.log" 2>&1; then
    cat "$WORK/dpkg-buildpackage.log" >&2
    die "dpkg-buildpackage failed"
fi

DEB=edgeasr_${VERSION}_${ARCH}.deb
mkdir -p "$OUT_DIR"
mv "$WORK/$DEB" "$OUT_DIR/$DEB"
echo "$OUT_DIR/$DEB"
