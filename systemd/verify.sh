#!/usr/bin/env bash
# Check systemd/flagpost.service with systemd-analyze: `verify` must print nothing
# (it exits 0 even for unknown keys, so any output is a failure), alone and with each
# drop-in of systemd/dropins/ (the network a configured feature needs), and the
# offline `security` exposure score must be at most MAX_EXPOSURE (default 2.0, "OK").
#
# The unit runs /usr/local/bin/flagpost, which need not exist here, and verify
# insists that ExecStart= is executable. So verify reads a copy whose ExecStart=
# points at FLAGPOST_BIN (a built binary, or a stub by default); nothing else
# changes. The security score is taken from the unit as shipped.
#
# Usage: systemd/verify.sh   (tests/integration/ops.rs runs it with the test binary)
set -euo pipefail

unit="$(cd "$(dirname "$0")" && pwd)/flagpost.service"
max="${MAX_EXPOSURE:-2.0}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

bin="${FLAGPOST_BIN:-}"
if [ -z "$bin" ]; then
    bin="$tmp/flagpost"
    printf '#!/bin/sh\nexit 0\n' >"$bin"
    chmod +x "$bin"
fi
sed "s#^ExecStart=/usr/local/bin/flagpost #ExecStart=$bin #" "$unit" >"$tmp/flagpost.service"
if ! grep -q "^ExecStart=$bin " "$tmp/flagpost.service"; then
    echo "verify.sh: $unit has no 'ExecStart=/usr/local/bin/flagpost ' line" >&2
    exit 1
fi

# verify reads drop-ins only from the unit search path, so the copy's folder is put
# first on it (the trailing colon keeps the built-in path after it).
verify() {
    local out status=0
    out="$(cd "$tmp" && SYSTEMD_UNIT_PATH="$tmp:" \
        systemd-analyze verify --man=no "$tmp/flagpost.service" 2>&1)" || status=$?
    if [ "$status" -ne 0 ] || [ -n "$out" ]; then
        echo "systemd-analyze verify failed ($1):" >&2
        echo "$out" >&2
        return 1
    fi
}
verify "the unit"
echo "systemd-analyze verify: ok"

dropins="$(dirname "$unit")/dropins"
mkdir "$tmp/flagpost.service.d"
# A broken drop-in must fail, or the ones below would pass unread.
printf '[Service]\nIPAddressAllow=not-an-address\n' >"$tmp/flagpost.service.d/broken.conf"
if verify "a broken drop-in" 2>/dev/null; then
    echo "systemd-analyze verify did not read a broken drop-in" >&2
    exit 1
fi
rm "$tmp/flagpost.service.d/broken.conf"
for dropin in "$dropins"/*.conf; do
    cp "$dropin" "$tmp/flagpost.service.d/"
    verify "with $(basename "$dropin")"
    rm "$tmp/flagpost.service.d/$(basename "$dropin")"
    echo "systemd-analyze verify with dropins/$(basename "$dropin"): ok"
done

# --threshold takes the score times ten and makes the command fail above it.
threshold="$(awk -v m="$max" 'BEGIN { printf "%d", m * 10 + 0.5 }')"
report="$(systemd-analyze security --offline=true --no-pager --threshold="$threshold" "$unit" 2>&1)" ||
    status=$?
score="$(printf '%s\n' "$report" | sed -n 's/^.*Overall exposure level for //p')"
if [ -z "$score" ]; then
    echo "systemd-analyze security gave no score:" >&2
    echo "$report" >&2
    exit 1
fi
if [ "${status:-0}" -ne 0 ]; then
    echo "$report" >&2
    echo "systemd-analyze security: above $max: $score" >&2
    exit 1
fi
echo "systemd-analyze security: at most $max: $score"
