#!/usr/bin/env python3
"""How this machine's disk takes concurrent fdatasyncs on one file.

Each thread writes 512 bytes at its own offset of a preallocated 64 MiB file and calls
fdatasync, 2,000 times in all, with 1, 2 and 4 threads. If concurrent syncs share the
disk's flushes, throughput grows with threads and latency does not: a log writer could
then run the next group's sync while the previous one is in flight.

Run from a directory on the disk to measure (it writes and removes fsync_probe.bin):
    cd target/tmp && python3 ../../benches/fsync_probe.py
"""
import os
import threading
import time

PATH = "fsync_probe.bin"
SIZE = 64 * 1024 * 1024
TOTAL = 2000


def main():
    fd = os.open(PATH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, SIZE)
        os.fsync(fd)
        for threads in (1, 2, 4):
            latencies = []

            def worker(tid):
                buf = b"x" * 512
                for i in range(TOTAL // threads):
                    start = time.perf_counter()
                    os.pwrite(fd, buf, ((i * threads + tid) * 4096) % SIZE)
                    os.fdatasync(fd)
                    latencies.append(time.perf_counter() - start)

            workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
            began = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            took = time.perf_counter() - began
            latencies.sort()
            print(
                f"{threads} thread(s): {len(latencies) / took:.0f} write+fdatasync/s, "
                f"median {latencies[len(latencies) // 2] * 1e3:.3f} ms, "
                f"p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.3f} ms"
            )
    finally:
        os.close(fd)
        os.remove(PATH)


if __name__ == "__main__":
    main()
