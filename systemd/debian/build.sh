#!/usr/bin/env bash
# Build flagpost's Debian package, flagpost_<version>_<arch>.deb, with Debian's own
# tools (dpkg-shlibdeps for the library dependencies, dpkg-deb to pack): the binary,
# the systemd unit (its ExecStart= pointed at /usr/bin), the system user (sysusers.d),
# the folders the service writes (tmpfiles.d), /etc/flagpost/flagpost.env as a
# conffile, the maintainer scripts of this folder, and the docs, the nginx site and the
# unit's network drop-ins as examples. Install with `sudo apt install ./flagpost_*.deb`.
#
# Usage: systemd/debian/build.sh [--bin FILE] [--out DIR] [--version VERSION] [--compression C]
#   --bin          the binary to package (default: `cargo build --release`'s)
#   --out          where to write the package (default: target/debian); an earlier
#                  build's flagpost_*.deb there is removed, so that
#                  `apt install ./target/debian/flagpost_*.deb` names one package
#   --version      the package's version (default: Cargo.toml's, then +git, the UTC
#                  time of the build and the commit, so that every rebuild is an upgrade
#                  to apt; a release build passes its own)
#   --compression  dpkg-deb's -Z: xz (the default, smallest) or gzip (several times
#                  faster to build; the tests use it)
# Needs dpkg-dev and binutils (strip). The maintainer is DEBFULLNAME <DEBEMAIL> when set.
set -euo pipefail
# The package's files are 0644 and folders 0755 whatever the caller's umask.
umask 022

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin=""
out="$repo/target/debian"
version=""
compression=xz
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --compression) compression="$2"; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for tool in dpkg-deb dpkg-shlibdeps strip python3; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (apt install dpkg-dev binutils)" >&2; exit 1; }
done
if [ -z "$version" ]; then
    # The time goes first so that dpkg --compare-versions orders rebuilds by it; the
    # commit only names where the build came from.
    version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)"
    version="$version+git$(date -u +%Y%m%d%H%M%S)"
    commit="$(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || true)"
    [ -z "$commit" ] || version="$version.$commit"
fi
if [ -z "$bin" ]; then
    (cd "$repo" && cargo build --release)
    bin="$repo/target/release/flagpost"
fi
[ -x "$bin" ] || { echo "build.sh: $bin is not an executable" >&2; exit 1; }
arch="$(dpkg --print-architecture)"
maintainer="${DEBFULLNAME:-flagpost maintainers} <${DEBEMAIL:-flagpost@example.org}>"
# Units live where this release's systemd looks for packaged ones (/lib before
# Debian 13's finished /usr merge, /usr/lib after); without pkg-config or systemd's
# .pc (package systemd-dev), the older place, which the newer systemd still reads.
unitdir="$(pkg-config --variable=systemd_system_unit_dir systemd 2>/dev/null || true)"
case "$unitdir" in
/*) ;;
*) unitdir=/lib/systemd/system ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
doc="$root/usr/share/doc/flagpost"
install -d "$root/DEBIAN" "$root/usr/bin" "$root$unitdir" "$root/usr/lib/sysusers.d" \
    "$root/usr/lib/tmpfiles.d" "$root/etc/flagpost" "$doc/examples" "$root/usr/share/man/man1" \
    "$root/usr/share/lintian/overrides"

# The binary without its debugging sections, as dh_strip leaves it.
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
    -o "$root/usr/bin/flagpost" "$bin"
chmod 0755 "$root/usr/bin/flagpost"

sed 's#^ExecStart=/usr/local/bin/flagpost #ExecStart=/usr/bin/flagpost #' \
    "$repo/systemd/flagpost.service" >"$root$unitdir/flagpost.service"
grep -q '^ExecStart=/usr/bin/flagpost serve ' "$root$unitdir/flagpost.service" || {
    echo "build.sh: systemd/flagpost.service has no 'ExecStart=/usr/local/bin/flagpost ' line" >&2
    exit 1
}
install -m 0644 "$here/flagpost.sysusers" "$root/usr/lib/sysusers.d/flagpost.conf"
install -m 0644 "$here/flagpost.tmpfiles" "$root/usr/lib/tmpfiles.d/flagpost.conf"
install -m 0644 "$here/flagpost.env" "$root/etc/flagpost/flagpost.env"
install -m 0644 "$here/copyright" "$doc/copyright"
# What the binary and the console carry of others' code, with their licences.
(cd "$repo" && python3 "$here/notices.py") | gzip -9n >"$doc/third-party-notices.gz"
sed "s#@UNITDIR@#${unitdir#/}#" "$here/lintian-overrides" >"$root/usr/share/lintian/overrides/flagpost"
chmod 0644 "$root/usr/share/lintian/overrides/flagpost"
install -m 0644 "$repo/systemd/nginx.conf" "$doc/examples/nginx.conf"
install -m 0644 "$repo/systemd/dropins/"*.conf "$doc/examples/"
for page in operating clickhouse console managing-flags faults; do
    gzip -9n <"$repo/docs/$page.md" >"$doc/$page.md.gz"
done
gzip -9n <"$here/flagpost.1" >"$root/usr/share/man/man1/flagpost.1.gz"
{
    printf 'flagpost (%s) unstable; urgency=medium\n\n' "$version"
    printf '  * Built from the flagpost repository%s.\n\n' \
        "$(cd "$repo" && git rev-parse --short HEAD 2>/dev/null | sed 's/^/, commit /')"
    printf ' -- %s  %s\n' "$maintainer" "$(date -R)"
} | gzip -9n >"$doc/changelog.gz"
chmod 0644 "$doc"/*.gz "$root/usr/share/man/man1/flagpost.1.gz"

for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
echo /etc/flagpost/flagpost.env >"$root/DEBIAN/conffiles"

# dpkg-shlibdeps reads debian/control from where it runs; a minimal one will do.
mkdir -p "$work/src/debian"
printf 'Source: flagpost\n\nPackage: flagpost\nArchitecture: any\n' >"$work/src/debian/control"
if ! substvars="$(cd "$work/src" && dpkg-shlibdeps -O "$root/usr/bin/flagpost" 2>"$work/shlibdeps.err")"; then
    echo "build.sh: dpkg-shlibdeps failed:" >&2
    cat "$work/shlibdeps.err" >&2
    exit 1
fi
shlibs="$(printf '%s\n' "$substvars" | sed -n 's/^shlibs:Depends=//p')"
[ -n "$shlibs" ] || { echo "build.sh: dpkg-shlibdeps found no libraries" >&2; exit 1; }
# systemd runs the service, and its systemd-sysusers and systemd-tmpfiles make the
# user and the folders at install.

cat >"$root/DEBIAN/control" <<EOF
Package: flagpost
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $shlibs, systemd
Suggests: nginx
Section: web
Priority: optional
Description: product analytics server speaking PostHog's client protocol
 flagpost captures events from PostHog's client libraries (posthog-js,
 posthog-python, posthog-node, ...) into a write-ahead log that is on disk
 before it answers, keeps persons and groups, and evaluates feature flags with
 the values PostHog would give, all in one process on one machine.
 .
 The package runs it as the systemd service flagpost.service on 127.0.0.1:8000
 in a tight sandbox, to be put behind nginx for TLS. Install, then
 run "systemctl enable --now flagpost".
EOF
# Conffiles stay out, as dh_md5sums leaves them: dpkg keeps their sums itself.
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '/%P\n' | sort |
    grep -vxF -f DEBIAN/conffiles | sed 's#^/##' | tr '\n' '\0' |
    xargs -0 md5sum >DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

mkdir -p "$out"
rm -f "$out"/flagpost_*_"$arch".deb
deb="$out/flagpost_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compression" --build "$root" "$deb" >/dev/null
echo "$deb"
