#!/bin/sh
# Seed fuzz/corpus/<target>/ from the repository's fixtures: captured client bodies,
# LZ-String vectors, the demo flag file, and the regression inputs under
# tests/fixtures/fuzz/. Run from anywhere; needs jq, gzip, base64 and iconv.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
fx="$root/tests/fixtures"
corpus="$here/corpus"
for t in decode_body lz64 capture_parse decide_request flag_definitions property_match block; do
    mkdir -p "$corpus/$t"
    # property_match keeps JSON cases, not raw inputs; the others' files are inputs.
    if [ "$t" != property_match ] && [ -d "$fx/fuzz/$t" ]; then cp "$fx/fuzz/$t"/* "$corpus/$t/"; fi
done

# Event bodies as clients send them, decoded.
events="$corpus/events"
mkdir -p "$events"
n=0
for vector in $(jq -r '.vectors[] | select(.plain | length < 8192) | .name' "$fx/lz64_vectors.json"); do
    jq -j --arg n "$vector" '.vectors[] | select(.name == $n) | .compressed' "$fx/lz64_vectors.json" > "$events/$vector.lz64"
    jq -j --arg n "$vector" '.vectors[] | select(.name == $n) | .plain' "$fx/lz64_vectors.json" > "$events/$vector.txt"
done
for path in $(jq -r 'keys[]' "$fx/lz64_capture.json"); do
    n=$((n + 1))
    jq -j --arg p "$path" '.[$p]' "$fx/lz64_capture.json" > "$events/capture$n.lz64"
done
cat > "$events/event.json" <<'JSON'
{"event":"$pageview","distinct_id":"user-1","api_key":"phc_demo_project_key_change_me","uuid":"0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01","timestamp":"2024-01-02T03:04:05.678Z","properties":{"$current_url":"https://example.com/","$ignore_sent_at":true,"distinct_id":42}}
JSON
cat > "$events/batch.json" <<'JSON'
{"api_key":"phc_demo_project_key_change_me","historical_migration":true,"sent_at":"2024-01-02T03:04:06Z","batch":[{"event":"a","properties":{"distinct_id":"d","token":"phc_x"},"offset":250},{"event":"$identify","$set":{"plan":"pro"},"distinct_id":"\u0000long","timestamp":"2024-01-02 03:04:05"}]}
JSON
printf '[{"event":"e","$distinct_id":1.5e300,"$token":"k"},{"event":"e","distinct_id":"x","token":null}]' > "$events/array.json"

for f in "$events"/*.json "$events"/*.txt; do
    b=$(basename "$f")
    # capture_parse: plain, /engage with a send time.
    { printf '\000'; cat "$f"; } > "$corpus/capture_parse/$b"
    { printf '\003'; cat "$f"; } > "$corpus/capture_parse/engage-$b"
    # decode_body: plain with no hint; gzip by header; base64 in a form; data= in the query.
    { printf '\070\204\000'; cat "$f"; } > "$corpus/decode_body/plain-$b"
    { printf '\040\204\000'; gzip -c "$f"; } > "$corpus/decode_body/gzip-$b"
    { printf '\024\203\000'; base64 -w0 "$f"; } > "$corpus/decode_body/form-$b"
    { printf '\064\200\000'; base64 -w0 "$f"; } > "$corpus/decode_body/query-$b"
    # lz64: round trip of the text as UTF-16.
    { printf '\001'; iconv -f UTF-8 -t UTF-16LE "$f" 2>/dev/null || true; } > "$corpus/lz64/utf16-$b"
done
for f in "$events"/*.lz64; do
    b=$(basename "$f")
    { printf '\002\204\000'; cat "$f"; } > "$corpus/decode_body/lz64-$b"
    { printf '\200'; cat "$f"; } > "$corpus/lz64/$b"
done

# Decide requests.
d="$corpus/decide_request"
printf '{"token":"phc_k","distinct_id":"user-1","groups":{"org":"o"},"person_properties":{"plan":"pro"},"group_properties":{"org":{"size":5}},"$anon_distinct_id":"anon","disable_flags":false}' > "$d/full.json"
printf '{"api_key":"phc_k","distinct_id":12345678901234567890}' > "$d/number.json"

# Flag definitions: the demo file.
cp "$root/data/flags/1.json" "$corpus/flag_definitions/demo.json"
rm -r "$events"
echo "seeded $(find "$corpus" -type f | wc -l) inputs under $corpus"
