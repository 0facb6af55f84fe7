#!/usr/bin/env bash
# The wheelhouse edgeasr runs from, for Debian bookworm's python3 (3.11, glibc 2.36) on amd64 or
# arm64: packaging/wheelhouse.sh ARCH DEST [EXTRAS]. build-deb.sh packs it into the .deb; build-addon.sh
# into the add-on's image. DEST receives:
#
#   edgeasr-<version>-py3-none-any.whl   built from this checkout
#   every runtime dependency, those of EXTRAS (pyproject.toml's, comma-separated; none by default)
#   and the embedded default's weights, binary wheels for ARCH
#   requirements.txt                      name==version --hash=sha256:... for each of them
#
# The versions are packaging/constraints.txt's (what the tests ran with), except numpy and
# ml_dtypes: HailoRT 4.x (Hailo-8) requires numpy<2 and builds with pybind11 2.10, which predates
# numpy 2, so the wheelhouse stays on the last 1.x, with the last ml_dtypes (onnx's) that runs on
# it. Downloads come from PyPI here, never at install or run time.
#
# Environment:
#   EDGEASR_PIP_ISOLATE  1 (default): pip ignores pip.conf and PIP_* variables and uses PyPI
#                        only; 0: keep the machine's pip configuration (mirrors, proxies)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

die() { echo "wheelhouse.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 amd64|arm64 DEST [EXTRAS]" >&2; exit 64; }
ARCH=$1
DEST=$2
EXTRAS=${3:-}

# Debian bookworm and Raspberry Pi OS bookworm: python3 3.11, glibc 2.36.
PY_VERSION=3.11
PY_ABI=cp311
GLIBC_MINORS=(17 24 26 27 28 31 34 35 36)
NUMPY_1_PINS="numpy==1.26.4
ml_dtypes==0.5.4"
# The offline weights of the embedded default (pyproject.toml's `weights` extra).
WEIGHTS=$(sed -n 's/^weights = \["\(.*\)"\]$/\1/p' "$REPO/pyproject.toml")
# The workstation-only export stack must never reach the device.
FORBIDDEN_WHEELS='^(torch|transformers|onnxscript|onnxsim)-'

case "$ARCH" in
    amd64) MACHINE=x86_64 ;;
    arm64) MACHINE=aarch64 ;;
    *) echo "wheelhouse.sh: unsupported architecture '$ARCH' (amd64 or arm64)" >&2; exit 64 ;;
esac
[ -n "$WEIGHTS" ] || die "pyproject.toml has no one-line weights extra"

if [ "${EDGEASR_PIP_ISOLATE:-1}" = 1 ]; then
    while read -r var; do unset "$var"; done < <(compgen -e | grep '^PIP_' || true)
    export PIP_CONFIG_FILE=/dev/null
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgeasr-wheels.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DEST" "$WORK/src"

# Debian's own python3 and pip do the work, as on the device.
/usr/bin/python3 -m venv "$WORK/tools"
PIP=("$WORK/tools/bin/python" -m pip --quiet)

# 1. edgeasr's wheel, built from a copy so that build/ and *.egg-info stay out of the checkout.
cp "$REPO/pyproject.toml" "$WORK/src/"
for f in README.md LICENSE; do
    if [ -f "$REPO/$f" ]; then cp "$REPO/$f" "$WORK/src/"; fi
done
cp -r "$REPO/edgeasr" "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
"${PIP[@]}" wheel --no-deps --wheel-dir "$DEST" "$WORK/src"

# 2. Its runtime dependencies (and its EXTRAS') as binary wheels for the target, and the tiny.en
# weights: the embedded default is imported on the device at its first run, offline.
platforms=()
for minor in "${GLIBC_MINORS[@]}"; do
    platforms+=(--platform "manylinux_2_${minor}_${MACHINE}")
done
platforms+=(--platform "manylinux2014_${MACHINE}")
{ grep -Ev '^(numpy|ml_dtypes)==' "$HERE/constraints.txt"; echo "$NUMPY_1_PINS"; } > "$WORK/constraints.txt"
"${PIP[@]}" download --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp --abi "$PY_ABI" "${platforms[@]}" \
    --constraint "$WORK/constraints.txt" --dest "$DEST" "$(echo "$DEST"/edgeasr-*.whl)${EXTRAS:+[$EXTRAS]}" "$WEIGHTS"

if ls "$DEST" | grep -Eq "$FORBIDDEN_WHEELS"; then
    die "the wheelhouse pulled in the export stack: $(ls "$DEST" | grep -E "$FORBIDDEN_WHEELS")"
fi

# The Raspberry Pi 5 kernel uses 16 KiB pages: a shared library whose LOAD segments are
# aligned to less than that cannot be mapped there.
if [ "$ARCH" = arm64 ]; then
    "$WORK/tools/bin/python" - "$DEST" <<'PY' || die "a wheel is unusable with 16 KiB pages"
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

# 3. The lock file the venv is installed from: exact versions and sha256 sums.
(
    cd "$DEST"
    for wheel in *.whl; do
        name=${wheel%%-*}
        rest=${wheel#*-}
        printf '%s==%s --hash=sha256:%s\n' "$name" "${rest%%-*}" "$(sha256sum "$wheel" | cut -d' ' -f1)"
    done
) > "$DEST/requirements.txt"
