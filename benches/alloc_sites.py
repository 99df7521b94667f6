#!/usr/bin/env python3
"""Where a server's live bytes were allocated, from the sites file that
`FLAGPOST_ALLOC_REPORT=FILE flagpost serve ...` writes to FILE.sites (docs/operating.md,
"Memory"): each stack resolved with addr2line against the binary that wrote it, the
allocator's, the standard library's and the collections' own frames left out, and the
stacks summed by what remains of them (--depth frames).

    FLAGPOST_ALLOC_REPORT=/tmp/alloc cargo bench --bench load -- --scenario scale ...
    python3 benches/alloc_sites.py --binary target/release/flagpost --sites /tmp/alloc.sites

--at picks a report by its index among those in the file (default -1, the last)."""

import argparse
import re
import subprocess
from collections import defaultdict

# Frames that say how, not who: the allocator, std, core, the collections, closures'
# trait shims. What is left is the code that asked for the memory.
PLUMBING = re.compile(
    r"^(<?(alloc|core|std|hashbrown)::|__rust|<?flagpost::cli::allocator|mi_|_mi|backtrace"
    r"|<(alloc|core|std|T|\[T\]|Q|I|F|&|\(|Option|Result|Vec|Box|u8)[ :<])"
)


def reports(path):
    """The reports in the file: lists of (bytes, blocks, [address])."""
    out = []
    for block in open(path).read().split("sites ")[1:]:
        rows = []
        for line in block.splitlines()[1:]:
            parts = line.split()
            rows.append((int(parts[0]), int(parts[1]), parts[2:]))
        out.append(rows)
    return out


def resolve(binary, addresses):
    """Each return address's frames, innermost first (inlined ones included)."""
    ordered = sorted(addresses)
    # A return address points after its call: look up the call itself.
    args = ["%x" % (int(a, 16) - 1) for a in ordered]
    text = subprocess.run(
        ["addr2line", "-a", "-f", "-C", "-i", "-e", binary] + args,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    names, current, i = {}, None, 0
    by_query = dict(zip(args, ordered))
    while i < len(text):
        line = text[i]
        if line.startswith("0x"):
            current = by_query.get(line[2:].lstrip("0") or "0")
            names.setdefault(current, [])
            i += 1
            continue
        names[current].append(re.sub(r"::h[0-9a-f]{16}$", "", line))
        i += 2
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--sites", required=True)
    parser.add_argument("--at", type=int, default=-1)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    rows = reports(args.sites)[args.at]
    names = resolve(args.binary, {a for _, _, stack in rows for a in stack})
    summed = defaultdict(lambda: [0, 0])
    for size, blocks, stack in rows:
        frames = [f for a in stack for f in names.get(a, []) if f != "??"]
        who = [f for f in frames if not PLUMBING.match(f)][: args.depth]
        key = " <- ".join(who) or "(no frame of the program)"
        summed[key][0] += size
        summed[key][1] += blocks
    total = sum(v[0] for v in summed.values())
    print(f"sampled live bytes: {total / 2**20:.1f} MiB")
    for key, (size, blocks) in sorted(summed.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{size / 2**20:8.1f} MiB {blocks:9d}  {key}")


if __name__ == "__main__":
    main()
