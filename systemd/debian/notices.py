#!/usr/bin/env python3
"""Third-party notices for flagpost's Debian package, written to standard output.

The binary links in every crate it depends on at run time, and the console serves a
copy of uPlot: their licences ask that their notices travel with the binary. The
crates are those `cargo metadata` resolves for this machine's target, reached from
flagpost through normal (not dev or build) dependencies; proc-macro crates run only
in the compiler and are left out, with what only they use. Each crate is listed with
its licence expression, then the licence files it ships; a text already given in
full is named rather than repeated. Run from the repository's root by build.sh.
"""

import json
import os
import subprocess
import sys

# The file names crates keep their licence and notice texts under.
LICENCE_PREFIXES = ("license", "licence", "copying", "notice", "copyright", "unlicense")
UPLOT = "src/http/console/static/vendor/uPlot.LICENSE"


def host_target():
    out = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("host: "):
            return line.split(" ", 1)[1]
    sys.exit("notices.py: rustc -vV names no host")


def metadata():
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked"]
    cmd += ["--filter-platform", host_target()]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def linked_crates(meta):
    """The packages compiled into the binary, flagpost itself excluded."""
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = meta["resolve"]["root"]
    seen, todo = set(), [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            normal = any(k["kind"] is None for k in dep["dep_kinds"])
            package = packages[dep["pkg"]]
            macro = any("proc-macro" in t["kind"] for t in package["targets"])
            if normal and not macro and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    crates = [packages[i] for i in seen]
    return sorted(crates, key=lambda p: (p["name"], p["version"]))


def licence_files(package):
    folder = os.path.dirname(package["manifest_path"])
    names = sorted(os.listdir(folder))
    found = [n for n in names if n.lower().startswith(LICENCE_PREFIXES)]
    if package.get("license_file"):
        found.append(package["license_file"])
    paths = []
    for name in dict.fromkeys(found):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            paths.append(path)
    return paths


def main():
    out = sys.stdout
    out.write("Third-party software in flagpost's binary and console\n")
    out.write("=" * 54 + "\n\n")
    out.write("uPlot (the console's charts, served from the binary):\n\n")
    with open(UPLOT, encoding="utf-8") as f:
        out.write(f.read().rstrip() + "\n\n")
    crates = linked_crates(metadata())
    out.write(f"The {len(crates)} Rust crates compiled into /usr/bin/flagpost:\n\n")
    for p in crates:
        out.write(f"  {p['name']} {p['version']}: {p.get('license') or 'see its files'}\n")
    given = {}
    for p in crates:
        label = f"{p['name']} {p['version']}"
        out.write(f"\n{'-' * 72}\n{label} ({p.get('license') or 'no SPDX expression'})\n")
        if p.get("repository"):
            out.write(f"{p['repository']}\n")
        paths = licence_files(p)
        if not paths:
            out.write("\n(the crate ships no licence file; its licence is named above)\n")
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as f:
                body = f.read().strip()
            name = os.path.basename(path)
            if body in given:
                out.write(f"\n{name}: the same text as {given[body]}\n")
                continue
            given[body] = f"{label}'s {name}"
            out.write(f"\n{name}:\n\n{body}\n")


if __name__ == "__main__":
    main()
