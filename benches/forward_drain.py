#!/usr/bin/env python3
"""Edge mode's forwarder, drained against a local upstream flagpost.

Starts an edge flagpost (`--upstream` pointing at a port nothing listens on yet),
captures N events into it in 1000-event `/batch/` requests from a few threads (the
backlog builds while upstream is down), waits until the forwarder counts them all as
its backlog, then starts an upstream flagpost on that port and times how long the
edge takes to forward the backlog, from the first delivery to a backlog of 0, reading
the edge's `/metrics`. Prints the capture rate and the drain rate.

    cargo build --release --bin flagpost
    python3 benches/forward_drain.py [--events 200000] [--binary target/release/flagpost]

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


def data_dir(root):
    os.makedirs(os.path.join(root, "data", "flags"))
    with open(os.path.join(root, "data", "projects.json"), "w") as f:
        json.dump({"projects": [{"id": 1, "name": "bench", "api_key": KEY}]}, f)
    with open(os.path.join(root, "data", "flags", "1.json"), "w") as f:
        f.write('{"flags": [], "group_type_mapping": {}, "cohorts": {}}')


def start(binary, root, listen, extra):
    p = subprocess.Popen(
        [binary, "serve", "--listen", listen, "--data-dir", os.path.join(root, "data"),
         "--db", os.path.join(root, "db")] + extra,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, FLAGPOST_LOG="info"))
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


def post_batches(addr, n_batches):
    for _ in range(n_batches):
        batch = [{"event": "$pageview", "distinct_id": f"user-{i % 5000}",
                  "uuid": str(uuid.uuid4()),
                  "properties": {"$current_url": "https://example.com/pricing", "i": i,
                                 "$browser": "Chrome", "$os": "Linux"}}
                 for i in range(BATCH)]
        body = json.dumps({"api_key": KEY, "batch": batch}).encode()
        req = urllib.request.Request(f"http://{addr}/batch/", body,
                                     {"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()


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


def run_once(binary, events, sink, perf_dir, tag):
    """One drain; returns (events forwarded, seconds from the first delivery, build rate)."""
    n = events // BATCH * BATCH
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
        threads = [threading.Thread(target=post_batches, args=(edge_addr, n // BATCH // THREADS))
                   for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        n = n // BATCH // THREADS * THREADS * BATCH
        captured = time.monotonic() - started
        while metric(edge_addr, "flagpost_upstream_forward_backlog_events") < n:
            time.sleep(0.2)
        built = time.monotonic() - started
        if perf_dir:
            recorders.append(perf(edge.pid, os.path.join(perf_dir, f"edge-{tag}.data")))
        if sink == "count":
            Counting.events = 0
            server = start_counting(up_port)
        else:
            upstream, _ = start(binary, up_root, f"127.0.0.1:{up_port}", [])
            procs.append(upstream)
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
    ap.add_argument("--binary", default="target/release/flagpost")
    ap.add_argument("--baseline", help="another build, drained the same way in turn")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sink", choices=["flagpost", "count"], default="flagpost")
    ap.add_argument("--perf", help="record perf profiles of edge and upstream into this dir")
    args = ap.parse_args()
    if args.perf:
        os.makedirs(args.perf, exist_ok=True)
    builds = [("new", args.binary)] + ([("base", args.baseline)] if args.baseline else [])
    rates = {name: [] for name, _ in builds}
    print(f"load average before: {load_average()}")
    for r in range(args.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for name, binary in order:
            rates[name].append(run_once(binary, args.events, args.sink, args.perf, f"{name}-{r + 1}"))
    print(f"load average after: {load_average()}")
    for name, got in rates.items():
        print(f"{name}: " + ", ".join(f"{x:,.0f}" for x in got) + " events/s")


if __name__ == "__main__":
    main()
