#!/usr/bin/env bash
# Install what the SDK tests (tests/integration/sdk/) run: Debian's Chromium, one
# Python venv per posthog-python line, and the pinned npm packages (posthog-node 4.x
# and 5.x, posthog-js, posthog-js-lite, playwright-core, and @posthog/agent-toolkit with
# the AI SDK it runs in); and a venv with chdb-core,
# current ClickHouse in-process, for the sink's current-shape test
# (tests/integration/sink/current.rs); and tests/sdk/rust, an app on posthog-rs 0.30
# from crates.io, built with cargo into target/sdk-rust (no cmake: aws-lc-sys builds
# with the C compiler).
# Idempotent and cheap when nothing changed: a venv or node_modules is rebuilt only
# when its pinned list changed.
#
# Caches to keep between CI runs: tests/sdk/.deps/, tests/sdk/node/node_modules/,
# ~/.cargo/registry and target/sdk-rust/.
set -euo pipefail
cd "$(dirname "$0")"
deps=.deps
mkdir -p "$deps"

# Run as root, or through sudo when there is one.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# A file's content hash, to tell whether what was installed from it is current.
stamp_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

for tool in python3 node npm cargo; do
    command -v "$tool" >/dev/null || {
        echo "sdk: $tool is needed (Python >= 3.10, Node >= 20.20)" >&2
        exit 1
    }
done

# Debian's own Python needs python3-venv for `python3 -m venv`.
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "sdk: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# A venv in $deps/$1 with exactly the pinned packages of requirements file $2.
venv() {
    local venv="$deps/$1" req="$2" want
    want="$(stamp_of "$req")"
    if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ]; then
        echo "sdk: building $venv from $req"
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
        echo "$want" >"$venv/.stamp"
    fi
}
venv py3 python/requirements-3.txt
venv py7 python/requirements-7.txt
# A 181 MB wheel, fetched once while its pin stays.
venv chdb ../sink/requirements.txt

want="$(stamp_of node/package.json node/package-lock.json)"
if [ "$(cat node/node_modules/.stamp 2>/dev/null)" != "$want" ]; then
    echo "sdk: npm ci in tests/sdk/node"
    # No install scripts: none of these packages needs one (playwright-core downloads
    # no browser; Debian's Chromium is used).
    (cd node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    echo "$want" >node/node_modules/.stamp
fi

# The posthog-rs driver's three builds, into the target dir the tests build it in
# (tests/integration/sdk/posthog_rs.rs): done here, one after the other, the tests'
# own builds find them fresh. About 3 minutes on two cores the first time.
for build in async blocking v1; do
    CARGO_TARGET_DIR="$(cd ../.. && pwd)/target/sdk-rust" \
        cargo build --locked --quiet --features "$build" --manifest-path rust/Cargo.toml
done

echo "sdk: $(/usr/bin/chromium --version 2>/dev/null | head -1);" \
    "posthog-python $("$deps/py3/bin/python" -c 'import posthog; print(posthog.VERSION)')" \
    "and $("$deps/py7/bin/python" -c 'import posthog; print(posthog.VERSION)');" \
    "posthog-node $(node -p 'require("./node/node_modules/posthog-node-v4/package.json").version')" \
    "and $(node -p 'require("./node/node_modules/posthog-node/package.json").version');" \
    "posthog-js $(node -p 'require("./node/node_modules/posthog-js/package.json").version');" \
    "posthog-js-lite $(node -p 'require("./node/node_modules/posthog-js-lite/package.json").version')" \
    "(@posthog/core $(node -p 'require("./node/node_modules/@posthog/core/package.json").version'));" \
    "playwright-core $(node -p 'require("./node/node_modules/playwright-core/package.json").version');" \
    "@posthog/agent-toolkit $(node -p 'require("./node/node_modules/@posthog/agent-toolkit/package.json").version')" \
    "(ai $(node -p 'require("./node/node_modules/ai/package.json").version'));" \
    "chdb-core $("$deps/chdb/bin/python" -c 'import chdb; print(chdb.__version__, "(ClickHouse", chdb.engine_version + ")")');" \
    "posthog-rs $(grep -A1 '^name = "posthog-rs"$' rust/Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')"
