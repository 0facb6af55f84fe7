#!/usr/bin/env bash
# The Raspberry Pi's own package, checked where it will live: `packaging/build-deb.sh arm64` from
# a clone of HEAD, installed with apt into an emulated Debian bookworm arm64 root (debootstrap,
# qemu-user-static through binfmt_misc) with the network cut, then, still offline, as the
# service's user: the embedded default on the ALSA prompt "Front Center", `edgeasr transcribe` on
# a dev clip, `edgeasr check` with the packaged configuration, `edgeasr self-test`; the unit
# checked with systemd-analyze (verify, security --offline) inside the root; purge, and nothing
# of the package left. Prints each step's wall time and a summary.
#
#   sudo bash packaging/arm64-install-check.sh [OPTIONS] [WORKDIR]   (default /var/tmp/edgeasr-arm64)
#
#   --bundle native    (default) the default model bundle, plain ONNX and JSON and the same on
#                      every architecture, is built on this machine (cached by the source tree's
#                      hash) and carried into the state directory before the install: the
#                      postinst finds it prepared and only opens its graphs
#   --bundle emulated  the postinst builds it under the emulator, as a Pi would (tens of minutes)
#   --break WHAT       a package that must NOT install: the check passes when apt fails with a
#                      message naming onnxruntime. onnxruntime-missing: its wheel and lock line
#                      taken out of the wheelhouse; onnxruntime-corrupt: its extension module
#                      truncated inside the wheel (the lock re-hashed, as a bad upstream build would
#                      be); cpuinfo: the root keeps the emulator's x86 /proc/cpuinfo, on which
#                      onnxruntime's import crashes
#   --clip ID          a dev clip (../shared/eval/dev) for `edgeasr transcribe`, repeatable
#                      (default ljs_LJ001-0009)
#   --speed N          also run packaging/speed-probe.py N times natively and emulated, in turns
#   --refresh          build the cached root again (debootstrap)
#
# The root is cached as a tarball under WORKDIR/cache (with apt's downloaded packages), so that a
# rerun needs no network until the install's own offline step. Run it before a release and put its
# figures in docs/development.md ("The arm64 install check"). Needs: root, binfmt_misc, and for
# --bundle native a Python with edgeasr's dependencies and the bench extra (jiwer; $EDGEASR_PYTHON,
# default the repository's .venv) to build the bundle and score the transcripts.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "arm64-install-check: run as root (debootstrap, chroot, unshare)" >&2; exit 77; }

bundle=native breaks="" speed=0 refresh=0 work="" clips=()
default_clip=ljs_LJ001-0009  # 7.6 s, one window: a window costs a minute or more emulated
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle=$2; shift 2 ;;
        --break) breaks=$2; shift 2 ;;
        --speed) speed=$2; shift 2 ;;
        --refresh) refresh=1; shift ;;
        --clip) clips+=("$2"); shift 2 ;;
        -*) echo "arm64-install-check: unknown option $1" >&2; exit 64 ;;
        *) work=$1; shift ;;
    esac
done
case "$bundle" in native|emulated) ;; *) echo "arm64-install-check: --bundle native|emulated" >&2; exit 64 ;; esac
case "$breaks" in ""|onnxruntime-missing|onnxruntime-corrupt|cpuinfo) ;;
    *) echo "arm64-install-check: --break onnxruntime-missing|onnxruntime-corrupt|cpuinfo" >&2; exit 64 ;; esac

[ ${#clips[@]} -gt 0 ] || clips=("$default_clip")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
shared=$(cd "$repo/../shared" && pwd)
work=${work:-/var/tmp/edgeasr-arm64}
python=${EDGEASR_PYTHON:-$repo/.venv/bin/python}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$work/root
cache=$work/cache
logs=$work/logs
# What Raspberry Pi OS has and our steps use beside the package: systemd (systemd-analyze),
# alsa-utils (/usr/share/sounds/alsa/Front_Center.wav), python3 and ca-certificates (set up
# emulated, byte-compiling the standard library and hashing the certificates take minutes). The
# package's other dependencies (python3-venv, python3-systemd, libportaudio2) come in the offline
# install, in the same apt run, as on a Pi.
root_packages=systemd,alsa-utils,python3,ca-certificates
root_tar=$cache/bookworm-arm64-${root_packages//,/-}.tar
# The Raspberry Pi 5's /proc/cpuinfo: qemu-user shows the host's x86 one, and onnxruntime's
# cpuinfo parser crashes on it (--break cpuinfo keeps it)
cpuinfo_a76() {
    for cpu in 0 1 2 3; do
        printf 'processor\t: %s\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\nCPU revision\t: 1\n\n' "$cpu"
    done
}
export QEMU_CPU=cortex-a76
max_wer=0.15

mkdir -p "$cache/archives" "$logs"
summary=()
# Each step is a function that returns non-zero on failure; bash ignores `set -e` inside a function
# whose status is tested, so the steps check their commands themselves.
step() {  # step NAME COMMAND...: run, time, record; stop the check on failure
    local name=$1 start code
    shift
    echo "== $name"
    start=$(date +%s.%N)
    set +e
    "$@"
    code=$?
    set -e
    local seconds
    seconds=$(awk -v start="$start" -v end="$(date +%s.%N)" 'BEGIN { printf "%.1f", end - start }')
    summary+=("$(printf '%-34s %7s s  %s' "$name" "$seconds" "$([ $code -eq 0 ] && echo ok || echo "FAILED ($code)")")")
    echo "   $name: ${seconds} s, exit $code"
    if [ $code -ne 0 ]; then
        report
        exit 1
    fi
}
report() {
    echo "== arm64 install check, $(date -u +%Y-%m-%d), commit $(git -C "$repo" rev-parse --short HEAD), bundle $bundle${breaks:+, break $breaks}"
    printf '%s\n' "${summary[@]}"
}

unmount_root() {
    for m in proc/cpuinfo proc sys dev run var/cache/apt/archives; do
        umount -lR "$root/$m" 2>/dev/null || true
    done
}
trap unmount_root EXIT

in_root() {  # in_root [--offline] COMMAND: a login-less shell in the root, the emulated CPU a Pi 5's
    local net=()
    if [ "$1" = --offline ]; then net=(unshare --net); shift; fi
    "${net[@]}" chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        TERM=dumb DEBIAN_FRONTEND=noninteractive QEMU_CPU="$QEMU_CPU" bash -c "$1"
}
as_service() {  # as_service COMMAND: as the edgeasr user, offline, from /
    in_root --offline "cd / && runuser -u edgeasr -- $1"
}

# --- the steps -------------------------------------------------------------------------------

emulator() {
    command -v qemu-aarch64-static >/dev/null && command -v debootstrap >/dev/null || \
        apt-get install -y -q -o DPkg::Lock::Timeout=600 qemu-user-static binfmt-support debootstrap >/dev/null
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
    # F: the interpreter is opened when registered, so it works inside the chroot
    grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64
}

build() {
    rm -rf "$work/src" "$work/dist"
    git clone -q "$repo" "$work/src"
    EDGEASR_DEB_OUT=$work/dist "$work/src/packaging/build-deb.sh" arm64 > "$logs/build.log" 2>&1 || {
        tail -n 20 "$logs/build.log"; return 1; }
    deb=$(tail -n 1 "$logs/build.log")
    echo "   $(basename "$deb"): $(du -m "$deb" | cut -f1) MB, $(dpkg-deb --fsys-tarfile "$deb" | tar -t | grep -c '\.whl$') wheels"
}

make_root_tarball() {
    local fresh=$work/bootstrap
    rm -rf "$fresh"
    debootstrap --arch=arm64 --include="$root_packages" bookworm "$fresh" "$mirror" > "$logs/debootstrap.log" 2>&1 || {
        tail -n 20 "$logs/debootstrap.log"; return 1; }
    chroot "$fresh" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get -q update > "$logs/apt-update.log" 2>&1 &&
        chroot "$fresh" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get clean &&
        tar -C "$fresh" -cf "$root_tar.partial" . &&
        mv "$root_tar.partial" "$root_tar" || return 1
    rm -rf "$fresh"
}

root_from_cache() {
    if [ "$refresh" = 1 ] || [ ! -f "$root_tar" ]; then
        echo "   no cached root: debootstrap --arch=arm64 bookworm (once; ~15 min emulated)"
        make_root_tarball || return 1
    fi
    unmount_root
    rm -rf "$root"
    mkdir -p "$root"
    tar -C "$root" -xf "$root_tar" &&
        mount -t proc proc "$root/proc" &&
        mount --rbind /sys "$root/sys" &&
        mount --rbind /dev "$root/dev" &&
        mount -t tmpfs tmpfs "$root/run" &&
        mount --bind "$cache/archives" "$root/var/cache/apt/archives" || return 1
    if [ "$breaks" != cpuinfo ]; then
        cpuinfo_a76 > "$work/cpuinfo"
        mount --bind "$work/cpuinfo" "$root/proc/cpuinfo" || return 1
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    in_root "uname -m; grep -m1 'CPU part' /proc/cpuinfo || true"
}

break_package() {  # a copy of the package with onnxruntime broken as asked
    local tree=$work/broken
    rm -rf "$tree"
    dpkg-deb --raw-extract "$deb" "$tree" || return 1
    local wheels=$tree/usr/lib/edgeasr/wheels wheel
    wheel=$(ls "$wheels"/onnxruntime-*.whl)
    if [ "$breaks" = onnxruntime-missing ]; then
        rm "$wheel"
        sed -i '/^onnxruntime==/d' "$wheels/requirements.txt"
    else
        local unpacked=$work/wheel
        rm -rf "$unpacked"
        mkdir -p "$unpacked"
        python3 -m zipfile -e "$wheel" "$unpacked" || return 1
        local module
        module=$(ls "$unpacked"/onnxruntime/capi/onnxruntime_pybind11_state*.so)
        truncate -s 4096 "$module" || return 1  # the ELF header stays, the rest is gone
        rm "$wheel"
        (cd "$unpacked" && python3 -m zipfile -c "$wheel" ./*) || return 1
        local digest
        digest=$(sha256sum "$wheel" | cut -d' ' -f1)
        sed -i "s/^\(onnxruntime==[^ ]*\) --hash=sha256:.*/\1 --hash=sha256:$digest/" "$wheels/requirements.txt"
    fi
    (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum > DEBIAN/md5sums)
    deb=$work/dist/edgeasr-broken-$breaks.deb
    dpkg-deb --root-owner-group -Zgzip -b "$tree" "$deb" >/dev/null || return 1
    rm -rf "$tree" "$work/wheel"
}

native_bundle() {  # the default bundle built here, named as the device names it
    local tree name
    tree=$(git -C "$work/src" rev-parse HEAD:edgeasr)
    local version
    version=$("$work/src/packaging/build-deb.sh" --print-version)
    name=$(cd / && PYTHONPATH=$work/src "$python" -c "
import edgeasr, pathlib
from edgeasr.models.default import default_dir
assert edgeasr.__version__ == '$version', f'{edgeasr.__version__} installed beside the checkout ($version): pip install -e . again'
print(default_dir(pathlib.Path('/')).name)") || return 1
    carried=$cache/bundles/$tree/$name
    if [ ! -f "$carried/manifest.json" ]; then
        rm -rf "$cache/bundles/$tree"
        mkdir -p "$cache/bundles/$tree"
        (cd / && PYTHONPATH=$work/src STATE_DIRECTORY=$cache/bundles/$tree.state "$python" -c "
import pathlib, shutil, sys
from edgeasr.models.default import prepare_default
built = prepare_default(pathlib.Path(sys.argv[1]))
shutil.move(built, sys.argv[2])" "$cache/bundles/$tree.state" "$carried") > "$logs/native-bundle.log" 2>&1 || {
            tail -n 20 "$logs/native-bundle.log"; return 1; }
        rm -rf "$cache/bundles/$tree.state"
    fi
    echo "   $name: $(du -sm "$carried" | cut -f1) MB"
}

snapshot() {  # every path in the root but the virtual file systems and apt's cache
    in_root "find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp \
        -o -path /var/cache/apt/archives \) -prune -o -print" | sort > "$1"
}

carry_bundle() {  # the service's user and its state directory, as the postinst makes them
    in_root "adduser --system --group --home /var/lib/edgeasr --no-create-home --quiet edgeasr &&
        install -d -o edgeasr -g edgeasr -m 0750 /var/lib/edgeasr /var/lib/edgeasr/models" || return 1
    cp -a "$carried" "$root/var/lib/edgeasr/models/" || return 1
    in_root "chown -R edgeasr:edgeasr /var/lib/edgeasr/models"
}

dependencies() {  # apt's own download of what the package depends on, while the network is there
    cp "$deb" "$root/tmp/edgeasr.deb"
    in_root "apt-get install -y -q --download-only /tmp/edgeasr.deb" > "$logs/dependencies.log" 2>&1 || {
        tail -n 20 "$logs/dependencies.log"; return 1; }
}

stamped() {  # each line of stdin after the seconds since the epoch
    local line
    while IFS= read -r line; do printf '%(%s)T %s\n' -1 "$line"; done
}

install_offline() {
    local code=0
    in_root --offline "apt-get install -y -q /tmp/edgeasr.deb" 2>&1 | stamped > "$logs/install-stamped.log"
    code=${PIPESTATUS[0]}
    awk '/ Setting up edgeasr / { start = $1 } start { end = $1 }
         END { if (start) printf "   edgeasr'"'"'s postinst: %d s of the install\n", end - start }' "$logs/install-stamped.log"
    sed 's/^[0-9]* //' "$logs/install-stamped.log" > "$logs/install.log"
    grep -E '^(build-venv|imports|weights|graphs|edgeasr):|INFO edgeasr' "$logs/install.log" | sed 's/^/   /' || true
    if [ -n "$breaks" ]; then  # must fail, naming the package
        grep -E '^edgeasr: self-test: cannot load onnxruntime' "$logs/install.log" | sed 's/^/   the message: /'
        [ "$code" -ne 0 ] && grep -q '^edgeasr: self-test: cannot load onnxruntime' "$logs/install.log"
        return
    fi
    [ "$code" -eq 0 ] || { tail -n 30 "$logs/install.log"; return 1; }
    in_root "du -sm /opt/edgeasr/venv /var/lib/edgeasr/models/* | sed 's/^/   /'"
}

embedded_default() {
    as_service "edgeasr --input /usr/share/sounds/alsa/Front_Center.wav" > "$logs/front-center.json" 2> "$logs/front-center.log" || {
        tail -n 20 "$logs/front-center.log"; return 1; }
    cat "$logs/front-center.json" | sed 's/^/   /'
    "$python" -c "
import json, sys
text = ' '.join(json.loads(line)['text'] for line in open(sys.argv[1]) if line.strip())
print('   heard:', repr(text))
sys.exit(0 if 'front center' in text.lower().replace(',', '') else 1)" "$logs/front-center.json"
}

transcribe() {
    local files=() clip
    for clip in "${clips[@]}"; do
        install -m 0644 "$shared/eval/dev/audio/$clip.wav" "$root/tmp/$clip.wav"
        files+=("/tmp/$clip.wav")
    done
    as_service "edgeasr transcribe --json ${files[*]}" > "$logs/transcribe.json" 2> "$logs/transcribe.log" || {
        tail -n 20 "$logs/transcribe.log"; return 1; }
    "$python" - "$shared/eval/dev/manifest.tsv" "$logs/transcribe.json" "$max_wer" <<'PY'
import csv, json, pathlib, sys

import jiwer
from whisper_normalizer.english import EnglishTextNormalizer

normalize = EnglishTextNormalizer()
with open(sys.argv[1], newline="") as f:
    references = {row["id"]: row["reference"] for row in csv.DictReader(f, delimiter="\t")}
worst = 0.0
for line in open(sys.argv[2]):
    result = json.loads(line)
    clip = pathlib.Path(result["file"]).stem
    wer = jiwer.wer(normalize(references[clip]), normalize(result["text"]))
    worst = max(worst, wer)
    print(f"   {clip}: WER {wer:.3f}: {result['text']!r}")
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
PY
}

check_and_self_test() {
    as_service "edgeasr check --config /etc/edgeasr/edgeasr.yaml --input /usr/share/sounds/alsa/Front_Center.wav" \
        > "$logs/check.log" 2>&1 || { cat "$logs/check.log"; return 1; }
    sed 's/^/   /' "$logs/check.log"
    grep -q '^state_dir: ok (/var/lib/edgeasr,' "$logs/check.log" &&
        grep -q '^model: ok (.*/var/lib/edgeasr/models/whisper-tiny.en-' "$logs/check.log" || return 1
    as_service "edgeasr self-test" > "$logs/self-test.log" 2>&1 || { cat "$logs/self-test.log"; return 1; }
    sed 's/^/   /' "$logs/self-test.log"
}

unit() {
    local verify
    verify=$(in_root "systemd-analyze verify --man=no edgeasr.service 2>&1")
    [ -z "$verify" ] || { echo "$verify"; return 1; }
    echo "   systemd-analyze verify: nothing to say"
    in_root "systemd-analyze security --offline=true /lib/systemd/system/edgeasr.service" > "$logs/security.log" 2>&1
    grep -E 'Overall exposure' "$logs/security.log" | sed 's/^/   /'
}

left_behind() {  # the package's own files and every path named edgeasr that appeared since the
    # install (its dependencies stay installed, as apt leaves them; the edgeasr user stays, as
    # Debian practice has it; dpkg and apt keep their records and logs)
    snapshot "$work/after.txt"
    dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -n 's|^\./|/|; /[^/]$/p' | sort > "$work/payload.txt"
    { comm -12 "$work/payload.txt" "$work/after.txt"
      comm -13 "$work/before.txt" "$work/after.txt" | grep -i edgeasr | grep -Ev '^/var/(lib/dpkg|log|cache/apt)/'
    } | sort -u > "$work/leftovers.txt"
    if [ -s "$work/leftovers.txt" ]; then
        echo "   left behind:"; sed 's/^/     /' "$work/leftovers.txt"; return 1
    fi
    echo "   nothing of the package left ($(wc -l < "$work/payload.txt") files shipped), no path named edgeasr"
}

purge() {
    in_root --offline "apt-get purge -y -q edgeasr" > "$logs/purge.log" 2>&1 || { tail -n 20 "$logs/purge.log"; return 1; }
    left_behind
}

cleanup_broken() {  # a failed configuration leaves a half-installed package: purge it
    in_root --offline "dpkg --purge edgeasr" > "$logs/purge.log" 2>&1 || { tail -n 20 "$logs/purge.log"; return 1; }
    left_behind
}

speed_probe() {  # the emulator's slowdown per kind of work, native and emulated runs in turns
    cp "$here/speed-probe.py" "$root/tmp/speed-probe.py"
    : > "$logs/speed.jsonl"
    for _ in $(seq "$speed"); do
        "$python" "$here/speed-probe.py" >> "$logs/speed.jsonl"
        in_root --offline "/opt/edgeasr/venv/bin/python /tmp/speed-probe.py" >> "$logs/speed.jsonl"
    done
    "$python" - "$logs/speed.jsonl" <<'PY'
import json, statistics, sys

runs = [json.loads(line) for line in open(sys.argv[1])]
for part in ("python", "numpy", "onnx", "onnxruntime"):
    native = statistics.median(r[part] for r in runs if r["machine"] == "x86_64")
    emulated = statistics.median(r[part] for r in runs if r["machine"] == "aarch64")
    print(f"   {part:12s} native {native:7.3f} s  emulated {emulated:8.3f} s  x{emulated / native:5.1f}")
PY
}

# --- the check -------------------------------------------------------------------------------

step "emulator (qemu-user-static, binfmt)" emulator
step "build-deb.sh arm64 (clone of HEAD)" build
if [ -n "$breaks" ] && [ "$breaks" != cpuinfo ]; then
    step "break: $breaks" break_package
fi
step "root (cached bookworm arm64)" root_from_cache
step "apt download of the dependencies" dependencies
snapshot "$work/before.txt"
if [ "$bundle" = native ] && [ -z "$breaks" ]; then
    step "default bundle built natively" native_bundle
    step "bundle carried into the state dir" carry_bundle
fi
step "apt install, network cut" install_offline
if [ -n "$breaks" ]; then
    step "purge the half-installed package" cleanup_broken
    report
    exit 0
fi
step "embedded default on Front_Center" embedded_default
step "transcribe ${clips[*]}" transcribe
step "check and self-test as edgeasr" check_and_self_test
step "unit: verify, security --offline" unit
if [ "$speed" -gt 0 ]; then
    step "speed probe x$speed, in turns" speed_probe
fi
step "apt purge" purge
report
