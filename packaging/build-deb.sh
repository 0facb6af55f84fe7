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
#   EDGEASR_PIP_ISOLATE  1 (default): pip ignores pip.conf and PIP_* variables and uses
#                        PyPI only; 0: keep the machine's pip configuration (mirrors, proxies)
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

# Debian bookworm and Raspberry Pi OS bookworm: python3 3.11, glibc 2.36.
PY_VERSION=3.11
PY_ABI=cp311
GLIBC_MINORS=(17 24 26 27 28 31 34 35 36)
# The versions the tests ran with (packaging/constraints.txt), so that a new release upstream
# cannot change what the package does; but numpy: HailoRT 4.x (Hailo-8) requires numpy<2 and
# builds with pybind11 2.10, which predates numpy 2; the venv shadows Debian's numpy, so the
# wheelhouse stays on the last 1.x, with the last ml_dtypes (onnx's) that runs on it.
NUMPY_1_PINS="numpy==1.26.4
ml_dtypes==0.5.4"
# The offline weights of the embedded default (pyproject.toml's `weights` extra).
WEIGHTS=$(sed -n 's/^weights = \["\(.*\)"\]$/\1/p' "$REPO/pyproject.toml")
# The workstation-only export stack must never reach the device.
FORBIDDEN_WHEELS='^(torch|transformers|onnxscript|onnxsim)-'

case "$ARCH" in
    amd64) MACHINE=x86_64 ;;
    arm64) MACHINE=aarch64 ;;
    *) echo "build-deb.sh: unsupported architecture '$ARCH' (amd64 or arm64)" >&2; exit 64 ;;
esac

[ -n "$WEIGHTS" ] || die "pyproject.toml has no one-line weights extra"
for f in pyproject.toml config/edgeasr.yaml systemd/edgeasr.service; do
    [ -f "$REPO/$f" ] || die "missing $f"
done

if [ "${EDGEASR_PIP_ISOLATE:-1}" = 1 ]; then
    while read -r var; do unset "$var"; done < <(compgen -e | grep '^PIP_' || true)
    export PIP_CONFIG_FILE=/dev/null
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgeasr-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/edgeasr-$VERSION
WHEELS=$STAGE/wheels
mkdir -p "$WHEELS" "$STAGE/config" "$WORK/src"

# Debian's own python3 and pip do the work, as on the device.
/usr/bin/python3 -m venv "$WORK/tools"
PIP=("$WORK/tools/bin/python" -m pip --quiet)

echo "build-deb.sh: edgeasr $VERSION for $ARCH" >&2

# 1. edgeasr's wheel, built from a copy so that build/ and *.egg-info stay out of the repo.
cp "$REPO/pyproject.toml" "$WORK/src/"
for f in README.md LICENSE; do
    if [ -f "$REPO/$f" ]; then cp "$REPO/$f" "$WORK/src/"; fi
done
cp -r "$REPO/edgeasr" "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
"${PIP[@]}" wheel --no-deps --wheel-dir "$WHEELS" "$WORK/src"

# 2. Its runtime dependencies (no extras) as binary wheels for the target, and the tiny.en
# weights: the embedded default is imported on the device at its first run, offline.
platforms=()
for minor in "${GLIBC_MINORS[@]}"; do
    platforms+=(--platform "manylinux_2_${minor}_${MACHINE}")
done
platforms+=(--platform "manylinux2014_${MACHINE}")
{ grep -Ev '^(numpy|ml_dtypes)==' "$HERE/constraints.txt"; echo "$NUMPY_1_PINS"; } > "$WORK/constraints.txt"
"${PIP[@]}" download --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp --abi "$PY_ABI" "${platforms[@]}" \
    --constraint "$WORK/constraints.txt" --dest "$WHEELS" "$WHEELS"/edgeasr-*.whl "$WEIGHTS"

if ls "$WHEELS" | grep -Eq "$FORBIDDEN_WHEELS"; then
    die "the wheelhouse pulled in the export stack: $(ls "$WHEELS" | grep -E "$FORBIDDEN_WHEELS")"
fi

# The Raspberry Pi 5 kernel uses 16 KiB pages: a shared library whose LOAD segments are
# aligned to less than that cannot be mapped there.
if [ "$ARCH" = arm64 ]; then
    "$WORK/tools/bin/python" - "$WHEELS" <<'PY' || die "a wheel is unusable with 16 KiB pages"
import pathlib, struct, sys, zipfile

PT_LOAD, PAGE = 1, 16384
bad = []
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if not (member.endswith(".so") or ".so." in member):
                continue
            elf = zf.read(member)
            if elf[:4] != b"\x7fELF" or elf[4] != 2:  # ELF64 only (aarch64)
                continue
            phoff, = struct.unpack_from("<Q", elf, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
            for i in range(phnum):
                p_type, = struct.unpack_from("<I", elf, phoff + i * phentsize)
                p_align, = struct.unpack_from("<Q", elf, phoff + i * phentsize + 0x30)
                if p_type == PT_LOAD and p_align < PAGE:
                    bad.append(f"{wheel.name}:{member} LOAD alignment {p_align:#x}")
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
fi

# 3. The lock file build-venv installs from: exact versions and sha256 sums.
(
    cd "$WHEELS"
    for wheel in *.whl; do
        name=${wheel%%-*}
        rest=${wheel#*-}
        printf '%s==%s --hash=sha256:%s\n' "$name" "${rest%%-*}" "$(sha256sum "$wheel" | cut -d' ' -f1)"
    done
) > "$WHEELS/requirements.txt"

# 4. Each wheel's declared license, for /usr/share/doc/edgeasr (see debian/copyright).
"$WORK/tools/bin/python" - "$WHEELS" > "$STAGE/wheel-licenses.txt" <<'PY'
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
