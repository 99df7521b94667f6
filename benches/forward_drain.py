#!/usr/bin/env python3
"""Edge mode's forwarder, drained against a local upstream flagpost.

Starts an edge flagpost (`--upstream` pointing at a port nothing listens on yet),
captures N events into it in `/batch/` requests from a few threads (the backlog builds
while upstream is down), waits until the forwarder counts them all as its backlog, then
starts an upstream flagpost on that port and times how long the edge takes to forward
the backlog, from the first delivery to a backlog of 0, reading the edge's `/metrics`.
Prints the capture rate, the drain rate and the CPU time each server's threads took
during the drain (from /proc, by thread name).

    cargo build --release --bin flagpost
    python3 benches/forward_drain.py [--events 200000] [--binary target/release/flagpost]
        [--baseline OTHER_BUILD] [--sink flagpost,nice19,count] [--rounds N]

The events are small by default (four properties, 1000 a request, as before); with
`--payload pageview --batch 100` they are the load harness's: posthog-js `$pageview`s of
about 600 bytes, from 25,600 persons, in gzip'd batches of 100, so the two drains can
be told apart by what differs.

The databases go to a temporary directory, removed at the end.
"""

import argparse
import gzip
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid

KEY = "phc_forward_bench"
BATCH = 1000
THREADS = 4
# The load harness's pool of batches covers this many persons (256 batches of 100).
PERSONS = 25_600


def data_dir(root):
    os.makedirs(os.path.join(root, "data", "flags"))
    with open(os.path.join(root, "data", "projects.json"), "w") as f:
        json.dump({"projects": [{"id": 1, "name": "bench", "api_key": KEY}]}, f)
    with open(os.path.join(root, "data", "flags", "1.json"), "w") as f:
        f.write('{"flags": [], "group_type_mapping": {}, "cohorts": {}}')


def start(binary, root, listen, extra, env=None):
    p = subprocess.Popen(
        [binary, "serve", "--listen", listen, "--data-dir", os.path.join(root, "data"),
         "--db", os.path.join(root, "db")] + extra,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, FLAGPOST_LOG="info", **(env or {})))
    for line in p.stderr:
        m = re.search(r"listening on (\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, m.group(1)
    raise SystemExit("flagpost did not start")


def metric(addr, name):
    text = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def small(i, now):
    return {"event": "$pageview", "distinct_id": f"user-{i % 5000}",
            "uuid": str(uuid.uuid4()),
            "properties": {"$current_url": "https://example.com/pricing", "i": i,
                           "$browser": "Chrome", "$os": "Linux"}}


def pageview(n, now):
    """The load harness's event (benches/common `pageview_event`), without a uuid."""
    page = ["dashboard", "insights", "settings", "billing"][n % 4]
    who = f"user-{n % PERSONS:06}"
    return {"event": "$pageview", "distinct_id": who, "timestamp": now,
            "properties": {"$os": "Mac OS X", "$browser": "Chrome", "$browser_version": 124,
                           "$device_type": "Desktop",
                           "$current_url": f"https://app.example.com/project/{n % 7}/{page}?tab=overview",
                           "$host": "app.example.com", "$pathname": f"/project/{n % 7}/{page}",
                           "$lib": "web", "$lib_version": "1.130.2", "$referrer": "$direct",
                           "$device_id": str(uuid.uuid4()), "$session_id": str(uuid.uuid4()),
                           "token": KEY, "distinct_id": who}}


def post_batches(addr, first, n_batches, batch_size, make, zipped):
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    for b in range(n_batches):
        base = (first + b) * batch_size
        batch = [make(base + i, now) for i in range(batch_size)]
        body = json.dumps({"api_key": KEY, "batch": batch, "sent_at": now}).encode()
        headers = {"Content-Type": "application/json"}
        if zipped:
            body = gzip.compress(body, 6)
            headers["Content-Encoding"] = "gzip"
        req = urllib.request.Request(f"http://{addr}/batch/", body, headers)
        urllib.request.urlopen(req).read()


def cpu_by_thread(pid):
    """CPU seconds each thread name of `pid` used so far (numbered names summed)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        name = re.sub(r"[-_]?\d+$", "", name)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_used(before, after):
    """Threads' CPU seconds between two readings, largest first, and the total."""
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    used = {k: v for k, v in used.items() if v > 0.005}
    total = sum(used.values())
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1]))
    return total, parts


class Counting(http.server.BaseHTTPRequestHandler):
    """An upstream that only counts: each `/batch/` body gunzip'd, its events counted."""
    protocol_version = "HTTP/1.1"
    # The answer's headers and body are two writes: with Nagle's algorithm the second
    # waits for the edge's delayed ACK, 40 ms a request.
    disable_nagle_algorithm = True
    events = 0
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        n = body.count(b'"uuid":')
        with Counting.lock:
            Counting.events += n
        self.send_response(200)
        self.send_header("Content-Length", "10")
        self.end_headers()
        self.wfile.write(b'{"status":1}'[:10])

    def log_message(self, *args):
        pass


def start_counting(port):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Counting)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def perf(pid, out):
    return subprocess.Popen(["perf", "record", "-g", "-q", "-o", out, "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_once(binary, events, sink, perf_dir, tag, batch_size, payload):
    """One drain; returns the events/s forwarded from the first delivery."""
    n = events // batch_size * batch_size
    tmp = tempfile.mkdtemp(prefix="flagpost-forward-")
    procs, recorders, server = [], [], None
    try:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        up_port = sock.getsockname()[1]
        sock.close()
        edge_root, up_root = os.path.join(tmp, "edge"), os.path.join(tmp, "upstream")
        data_dir(edge_root)
        data_dir(up_root)
        edge, edge_addr = start(binary, edge_root, "127.0.0.1:0",
                                ["--upstream", f"http://127.0.0.1:{up_port}"])
        procs.append(edge)
        started = time.monotonic()
        per_thread = n // batch_size // THREADS
        make, zipped = (pageview, True) if payload == "pageview" else (small, False)
        threads = [threading.Thread(target=post_batches,
                                    args=(edge_addr, t * per_thread, per_thread, batch_size,
                                          make, zipped))
                   for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        n = per_thread * THREADS * batch_size
        captured = time.monotonic() - started
        while metric(edge_addr, "flagpost_upstream_forward_backlog_events") < n:
            time.sleep(0.2)
        built = time.monotonic() - started
        if perf_dir:
            recorders.append(perf(edge.pid, os.path.join(perf_dir, f"edge-{tag}.data")))
        cpu = {"edge": (edge.pid, cpu_by_thread(edge.pid))}
        if sink == "count":
            Counting.events = 0
            server = start_counting(up_port)
        else:
            # `nice19`: PostHog's ingestion runs on other machines; an upstream flagpost
            # whose compactor yields the shared cores stands in for that.
            env = {"FLAGPOST_COMPACTOR_NICE": "19"} if sink == "nice19" else None
            upstream, _ = start(binary, up_root, f"127.0.0.1:{up_port}", [], env)
            procs.append(upstream)
            cpu["upstream"] = (upstream.pid, cpu_by_thread(upstream.pid))
            if perf_dir:
                recorders.append(perf(upstream.pid,
                                      os.path.join(perf_dir, f"upstream-{tag}.data")))
        first = None
        while True:
            backlog = metric(edge_addr, "flagpost_upstream_forward_backlog_events")
            now = time.monotonic()
            if first is None and backlog < n:
                first = (now, backlog)
            if backlog == 0:
                break
            time.sleep(0.05)
        used = {name: cpu_used(before, cpu_by_thread(pid)) for name, (pid, before) in cpu.items()}
        drained = now - first[0]
        rate = first[1] / drained if drained > 0 else float("inf")
        print(f"[{tag}] events: {n}")
        print(f"[{tag}] captured in {captured:.1f} s ({n / captured:,.0f} events/s, this client's pace)")
        print(f"[{tag}] stored and counted as backlog after {built:.1f} s ({n / built:,.0f} events/s)")
        print(f"[{tag}] forwarded {first[1]:,.0f} events in {drained:.1f} s: {rate:,.0f} events/s")
        if sink == "count":
            print(f"[{tag}] the counting sink took {Counting.events:,} events")
        text = urllib.request.urlopen(f"http://{edge_addr}/metrics").read().decode()
        answers = [line.split("{", 1)[1] for line in text.splitlines()
                   if line.startswith("flagpost_upstream_requests_total{")]
        print(f"[{tag}] upstream's answers: " + ", ".join(answers))
        print(f"[{tag}] drain vs build: {rate / (n / built):.1f}x")
        for name, (total, parts) in used.items():
            print(f"[{tag}] {name}'s CPU from upstream's start to the drain's end: {total:.2f} s ({parts})")
        return rate
    finally:
        for r in recorders:
            r.send_signal(2)
            r.wait()
        if server:
            server.shutdown()
            server.server_close()
        for p in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=BATCH, help="events a capture request")
    ap.add_argument("--payload", choices=["small", "pageview"], default="small",
                    help="four-property events, or the load harness's $pageviews")
    ap.add_argument("--binary", default="target/release/flagpost")
    ap.add_argument("--baseline", help="another build, drained the same way in turn")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sink", default="flagpost",
                    help="what upstream is, several comma-separated to drain into each in turn: "
                         "flagpost (as it runs by default), nice19 (its compactor at nice 19), "
                         "count (a sink that only counts)")
    ap.add_argument("--perf", help="record perf profiles of edge and upstream into this dir")
    args = ap.parse_args()
    if args.perf:
        os.makedirs(args.perf, exist_ok=True)
    sinks = args.sink.split(",")
    if not set(sinks) <= {"flagpost", "nice19", "count"}:
        raise SystemExit(f"--sink: flagpost, nice19 or count, not {args.sink}")
    builds = [("new", args.binary)] + ([("base", args.baseline)] if args.baseline else [])
    rates = {(name, sink): [] for sink in sinks for name, _ in builds}
    print(f"load average before: {load_average()}")
    for r in range(args.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for sink in sinks:
            for name, binary in order:
                tag = f"{name}-{sink}-{r + 1}"
                rates[(name, sink)].append(run_once(binary, args.events, sink, args.perf, tag,
                                                    args.batch, args.payload))
                print(f"load average: {load_average()}", flush=True)
    print(f"load average after: {load_average()}")
    for (name, sink), got in rates.items():
        print(f"{name} into {sink}: " + ", ".join(f"{x:,.0f}" for x in got) + " events/s")


if __name__ == "__main__":
    main()
