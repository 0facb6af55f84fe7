#!/usr/bin/env bash
# The newcomer's check: README's two commands, exactly as written, on a freshly bootstrapped
# Debian bookworm root (debootstrap; as root; nothing added but git and ca-certificates), with
# the repository cloned into it and ../shared copied beside the clone. Prints each command's
# exit code, wall time and the bytes it downloaded (what the network interfaces received
# meanwhile: an upper bound if something else on this machine downloads at the same time).
#
#   sudo bash packaging/fresh-machine-check.sh [WORKDIR]     (default /var/tmp/edgeasr-fresh)
#
# Too slow for CI (a whole Debian system is downloaded and the full test suite runs in it):
# run it before a release and put its figures in docs/development.md ("The fresh-machine check"). It clones
# the committed state of this repository (HEAD), as CI does.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-check: run as root (debootstrap, chroot)" >&2; exit 77; }
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
shared=$(cd "$repo/../shared" && pwd)
work=${1:-/var/tmp/edgeasr-fresh}
root=$work/bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v debootstrap >/dev/null || apt-get install -y -q -o DPkg::Lock::Timeout=600 debootstrap

cleanup() {
    for m in run dev sys proc; do
        umount -lR "$root/$m" 2>/dev/null || true
    done
    umount -l "$root" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
rm -rf "$root"
mkdir -p "$work"
echo "== debootstrap bookworm into $root"
debootstrap bookworm "$root" "$mirror" > "$work/debootstrap.log"
# the root a mount point of its own, as a machine's / is: dockerd (the add-on image's tests)
# remounts / when it unpacks an image, which fails on a plain directory
mount --bind "$root" "$root"
for m in proc sys dev run; do mkdir -p "$root/$m"; done
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# A machine behind a TLS-inspecting egress proxy (as the ones this project is built on) trusts
# the proxy's CA: the new root gets the same local CAs and the variables that make pip and
# Python use the system's bundle. Nothing else of this machine enters the new root.
bundle_env=()
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
    bundle_env=(PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
                REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt)
fi
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    TERM=dumb "${bundle_env[@]}" bash -c "$1"; }
in_root "DEBIAN_FRONTEND=noninteractive apt-get -q update && DEBIAN_FRONTEND=noninteractive apt-get install -y -q git ca-certificates" > "$work/base.log" 2>&1
if [ ${#bundle_env[@]} -gt 0 ]; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    in_root "update-ca-certificates" > /dev/null
fi
in_root "apt-get clean"
git clone -q "$repo" "$root/root/edgeasr"
cp -a "$shared" "$root/root/shared"

readme=$root/root/edgeasr/README.md
first=$(awk '/^```bash$/{getline; print; exit}' "$readme")
tests=$(cd "$root/root/edgeasr" && bash .ci/run --print-command)

downloaded() {  # bytes received by this machine's network interfaces so far (pip keeps no
    # copy of what it downloads through some proxies, so its cache cannot tell); anything else
    # downloading on this machine meanwhile would count too: an upper bound
    awk -F'[: ]+' 'NR > 2 && $2 != "lo" {s += $3} END {printf "%.0f\n", s}' /proc/net/dev
}

report=()
for name in first tests; do
    cmd=${!name}
    echo "== $name command: $cmd"
    before=$(downloaded)
    start=$(date +%s)
    set +e
    in_root "cd /root/edgeasr && $cmd" > "$work/$name.log" 2>&1
    code=$?
    set -e
    seconds=$(( $(date +%s) - start ))
    mb=$(( ($(downloaded) - before) / 1000000 ))
    tail -n 3 "$work/$name.log"
    report+=("$name command: exit $code, ${seconds} s, ${mb} MB downloaded (log: $work/$name.log)")
done
echo "== fresh bookworm root, $(date -u +%Y-%m-%d), $(uname -m)"
printf '%s\n' "${report[@]}"
