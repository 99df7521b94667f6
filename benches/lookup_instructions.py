#!/usr/bin/env python3
"""What the scale scenario's lookups cost the server, on a kept database, in
instructions (which the machine's load does not move) or in wall clock and CPU.

Each binary given serves a fresh copy of a kept data dir and database (made by
`cargo bench --bench load -- --scenario scale ... --scale-keep DIR`, which keeps
DIR/flagpost and DIR/baseline), in turn. Once the server is ready and nothing but
itself runs in it (its threads' CPU below 2 % over --settle seconds: a migration, an
index build or a fold after the start is over), the scale scenario's lookups are made
one after another over one keep-alive connection, each kind for the same persons the
scenario asks for ((n * 7919 + 13) % persons):

- `--mode callgrind`: under `valgrind --tool=callgrind --instr-atstart=no
  --separate-threads=yes`, instrumentation switched on once settled; per kind,
  --warmup lookups, then --lookups counted and dumped; prints the instructions of
  the whole process a lookup, and of each thread that ran. Last, --idle seconds of
  nothing asked, dumped the same way: what runs in the background.
- `--mode native`: p50 / p99 of each kind and the CPU each thread name used
  meanwhile (`/proc/<pid>/task/*/stat`); then --idle seconds of nothing asked.

    cargo bench --bench load -- --scenario scale --scale-events 1000000 \\
        --scale-persons 200000 --baseline <older build> --scale-keep /tmp/kept
    python3 benches/lookup_instructions.py --kept /tmp/kept/baseline \\
        --binary <older build> --binary target/release/flagpost --mode callgrind

or each build on the database it wrote (`--kept /tmp/kept/baseline --kept
/tmp/kept/flagpost`, in the order of the binaries): a migrated database keeps the
older build's run files until they are next written.

A database an older build wrote is migrated by a newer one when it opens it (and
cannot be opened by the older one afterwards), so each run copies the kept one.
"""

import argparse
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

API_KEY = "phc_load_test_project"
PERSONAL_KEY = "phx_load_test_project"
STRIDE = 7_919
KINDS = [
    "person by distinct id",
    "a person's events",
    "/decide, stored person",
    "events, newest 100",
    "events named $pageview",
    "events named $identify",
    "events named $create_alias",
    "a person's $identify",
    "console events, $create_alias",
    "events of a name none has",
    "persons, first 100",
    "console persons, newest",
    "console insights, 7 days",
    "console top events, 7 days",
]
REQUEST_THREADS = "tokio-rt-worker"
# Function names that tell which of the server's threads a callgrind part is, first
# match wins.
THREAD_MARKS = [
    ("compactor", "compactor::worker"),
    ("event-index", "event_index::worker"),
    ("wal-writer", "log::writer"),
    ("wal-segments", "log::spares"),
    ("blocking pool", "blocking::pool::Inner::run"),
    ("runtime worker", "scheduler::multi_thread::worker"),
    ("sled", "sled::"),
]


def user_id(person):
    return f"user-{person:07d}"


def request(kind, uid, cookie):
    """Method, path, headers and body of one lookup, as the scale scenario sends it."""
    api = {"Authorization": f"Bearer {PERSONAL_KEY}"}
    console = {"Cookie": cookie}
    events = "/api/projects/1/events/?"
    table = {
        "person by distinct id": ("GET", f"/api/projects/1/persons/?distinct_id={uid}", api),
        "a person's events": ("GET", f"{events}distinct_id={uid}&limit=100", api),
        "events, newest 100": ("GET", f"{events}limit=100", api),
        "events named $pageview": ("GET", f"{events}event=%24pageview&limit=100", api),
        "events named $identify": ("GET", f"{events}event=%24identify&limit=100", api),
        "events named $create_alias": ("GET", f"{events}event=%24create_alias&limit=100", api),
        "a person's $identify": (
            "GET", f"{events}distinct_id={uid}&event=%24identify&limit=100", api),
        "console events, $create_alias": (
            "GET", "/console/api/events?event=%24create_alias&limit=50", console),
        "events of a name none has": ("GET", f"{events}event=none-has-it&limit=100", api),
        "persons, first 100": ("GET", "/api/projects/1/persons/?limit=100", api),
        "console persons, newest": ("GET", "/console/api/persons?limit=50", console),
        "console insights, 7 days": (
            "GET", "/console/api/insights/counts?event=$pageview&interval=day&hours=168",
            console),
        "console top events, 7 days": ("GET", "/console/api/insights/top?hours=168", console),
    }
    if kind == "/decide, stored person":
        body = json.dumps({"token": API_KEY, "distinct_id": uid})
        return "POST", "/decide/?v=3", {"Content-Type": "application/json"}, body
    method, path, headers = table[kind]
    return method, path, headers, None


class Server:
    def __init__(self, binary, kept, root, wrap):
        self.data = os.path.join(root, "data")
        self.db = os.path.join(root, "db")
        shutil.copytree(os.path.join(kept, "data"), self.data)
        shutil.copytree(os.path.join(kept, "db"), self.db)
        args = [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", self.data,
                "--db", self.db]
        env = dict(os.environ, FLAGPOST_LOG="info", NO_COLOR="1")
        self.proc = subprocess.Popen(wrap + args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on (\S+)", line)
            if m:
                host, port = m.group(1).rsplit(":", 1)
                self.addr = (host, int(port))
                break
        else:
            raise SystemExit("the server did not start:\n" + "".join(self.log[-20:]))
        threading.Thread(target=self._drain, daemon=True).start()
        self.conn = http.client.HTTPConnection(*self.addr, timeout=600)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def ask(self, method, path, headers=None, body=None):
        try:
            return self._ask(method, path, headers, body)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closes a keep-alive connection left idle (the settling).
            self.conn.close()
            self.conn = http.client.HTTPConnection(*self.addr, timeout=600)
            return self._ask(method, path, headers, body)

    def _ask(self, method, path, headers, body):
        self.conn.request(method, path, body=body, headers=headers or {})
        r = self.conn.getresponse()
        data = r.read()
        return r.status, r.getheader("Set-Cookie"), data

    def metric(self, name):
        _, _, text = self.ask("GET", "/metrics")
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def sign_in(self):
        host = f"{self.addr[0]}:{self.addr[1]}"
        status, cookie, _ = self.ask(
            "POST", "/console/api/session",
            {"Content-Type": "application/json", "Origin": f"http://{host}", "Host": host},
            json.dumps({"key": PERSONAL_KEY}))
        if status != 200 or not cookie:
            raise SystemExit(f"console sign-in answered {status}")
        return cookie.split(";")[0]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def threads(pid):
    """{tid: (name, ticks)} of the process now."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(os.path.join(task, "stat")) as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 1:].split()
        out[int(os.path.basename(task))] = (name, int(fields[11]) + int(fields[12]))
    return out


def used(before, after):
    """CPU seconds by thread name between two samples, busiest first."""
    hz = os.sysconf("SC_CLK_TCK")
    by = {}
    for tid, (name, ticks) in after.items():
        by[name] = by.get(name, 0) + ticks - before.get(tid, (name, 0))[1]
    return sorted(((n, t / hz) for n, t in by.items() if t > 0), key=lambda x: -x[1])


def settle(server, seconds, limit=3600):
    """Wait until the log is empty and the process used under 2 % of a core over
    `seconds`; returns how long that took."""
    started = time.monotonic()
    while server.metric("flagpost_log_depth") not in (0.0, None):
        time.sleep(0.5)
    while time.monotonic() - started < limit:
        before = threads(server.proc.pid)
        time.sleep(seconds)
        busy = sum(s for _, s in used(before, threads(server.proc.pid)))
        if busy < 0.02 * seconds:
            return time.monotonic() - started
    raise SystemExit(f"the server did not settle in {limit} s")


def lookups(server, kind, cookie, first, count, persons):
    times = []
    host = f"{server.addr[0]}:{server.addr[1]}"
    for n in range(first, first + count):
        method, path, headers, body = request(kind, user_id((n * STRIDE + 13) % persons), cookie)
        headers = dict(headers, Host=host)
        began = time.perf_counter()
        status, _, _ = server.ask(method, path, headers, body)
        times.append((time.perf_counter() - began) * 1e3)
        if status != 200:
            raise SystemExit(f"{kind}: {path} answered {status}")
    return times


def quantile(sorted_times, q):
    return sorted_times[min(int(len(sorted_times) * q), len(sorted_times) - 1)]


def callgrind_parts(files):
    """[(label, instructions)] of the dump's files, one a thread."""
    out = []
    for path in sorted(files):
        with open(path, errors="replace") as f:
            text = f.read()
        m = re.search(r"^(?:totals|summary):\s+(\d+)", text, re.M)
        total = int(m.group(1)) if m else 0
        label = next((l for l, mark in THREAD_MARKS if mark in text), "other")
        thread = re.search(r"^thread:\s*(\d+)", text, re.M)
        out.append((f"{label} #{thread.group(1) if thread else '?'}", total))
    return out


def run_callgrind(binary, args, root):
    out_dir = os.path.join(root, "callgrind")
    os.makedirs(out_dir)
    base = os.path.join(out_dir, "cg.out")
    wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            f"--callgrind-out-file={base}"]
    server = Server(binary, args.kept, root, wrap)
    try:
        took = settle(server, args.settle)
        cookie = server.sign_in()
        control = ["callgrind_control"]
        subprocess.run(control + ["-i", "on", str(server.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        results = []
        dumps = [0]

        def dump(hint):
            # Each dump writes one file a thread, `<base>.<dump>-<thread>`; callgrind
            # writes them after the command returns.
            dumps[0] += 1
            # callgrind_control hands the hint to a shell: a quote in it ("a person's
            # events") would end the command, and the dump never come.
            hint = re.sub(r"[^A-Za-z0-9 ,$]", "", hint)
            subprocess.run(control + ["-d", hint, str(server.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            pattern, files = f"{base}.{dumps[0]}-*", []
            while not files or len(glob.glob(pattern)) != len(files):
                files = glob.glob(pattern)
                time.sleep(2)
            return callgrind_parts(files)

        for kind in args.kinds:
            lookups(server, kind, cookie, 0, args.warmup, args.persons)
            subprocess.run(control + ["-z", str(server.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            lookups(server, kind, cookie, args.warmup, args.lookups, args.persons)
            results.append((kind, dump(kind)))
        subprocess.run(control + ["-z", str(server.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        time.sleep(args.idle)
        idle = dump("idle")
        kept = os.path.join(args.out, os.path.basename(binary)) if args.out else None
        if kept:
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(out_dir, kept)
    finally:
        server.stop()
    print(f"\n{binary} (callgrind; settled after {took:.0f} s)")
    print(f"{'lookup':<30} {'instr/lookup':>13}  threads that ran (instructions a lookup)")
    for kind, parts in results:
        total = sum(n for _, n in parts)
        busy = ", ".join(f"{l} {n / args.lookups:,.0f}" for l, n in parts
                         if n / args.lookups >= 1000)
        print(f"{kind:<30} {total / args.lookups:>13,.0f}  {busy}")
    busy = ", ".join(f"{l} {n:,}" for l, n in idle if n) or "none"
    print(f"idle {args.idle} s, instructions: {busy}")
    if kept:
        print(f"callgrind files in {kept}")


def run_native(binary, args, root):
    server = Server(binary, args.kept, root, [])
    try:
        took = settle(server, args.settle)
        cookie = server.sign_in()
        pid = server.proc.pid
        rows = []
        for kind in args.kinds:
            lookups(server, kind, cookie, 0, args.warmup, args.persons)
            before = threads(pid)
            times = sorted(lookups(server, kind, cookie, args.warmup, args.lookups,
                                   args.persons))
            beside = [(n, s) for n, s in used(before, threads(pid)) if n != REQUEST_THREADS]
            rows.append((kind, quantile(times, 0.5), quantile(times, 0.99), beside))
        before = threads(pid)
        time.sleep(args.idle)
        idle = used(before, threads(pid))
    finally:
        server.stop()
    print(f"\n{binary} (native; settled after {took:.0f} s; load {os.getloadavg()[0]:.2f})")
    print(f"{'lookup':<30} {'p50 ms':>8} {'p99 ms':>8}  other threads' CPU meanwhile")
    for kind, p50, p99, beside in rows:
        line = ", ".join(f"{n} {s:.2f} s" for n, s in beside) or "none"
        print(f"{kind:<30} {p50:>8.2f} {p99:>8.2f}  {line}")
    line = ", ".join(f"{n} {s:.2f} s" for n, s in idle) or "none"
    print(f"idle {args.idle} s, CPU: {line}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kept", action="append", required=True,
                    help="a kept DIR/<target> (data and db): one for every binary, or "
                         "one a binary in the same order (each build on the database "
                         "it wrote itself)")
    ap.add_argument("--binary", action="append", required=True)
    ap.add_argument("--mode", choices=["callgrind", "native"], default="native")
    ap.add_argument("--persons", type=int, default=200_000)
    ap.add_argument("--lookups", type=int, default=None,
                    help="counted lookups a kind [callgrind 100, native 500]")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--idle", type=float, default=15.0)
    ap.add_argument("--kind", action="append", dest="kinds",
                    help="only this kind of lookup (repeat for several) [all]")
    ap.add_argument("--out", help="keep each binary's callgrind files under this dir")
    args = ap.parse_args()
    args.kinds = args.kinds or KINDS
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}; known: {KINDS}")
    if args.lookups is None:
        args.lookups = 100 if args.mode == "callgrind" else 500
    if len(args.kept) not in (1, len(args.binary)):
        raise SystemExit("give one --kept, or one for each --binary")
    kept = args.kept * len(args.binary) if len(args.kept) == 1 else args.kept
    for binary, args.kept in zip(args.binary, kept):
        root = tempfile.mkdtemp(prefix="flagpost-lookups-",
                                dir=os.path.dirname(os.path.abspath(args.kept)))
        try:
            (run_callgrind if args.mode == "callgrind" else run_native)(binary, args, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
