#!/usr/bin/env python3
"""Idle-connection flood against one agent: agent RSS with N SPOP connections that said
HELLO and went idle, then the latency of GET /metrics with M idle metrics sockets open.

    tests/tools/idle_flood.py build/spoa-ratelimit [N=4096] [M=64]

The agent runs with store = "allow" on free loopback ports (no Redis needed); it is stopped
at the end. Needs N + M + a few file descriptors (ulimit -n)."""

import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
import spop_client as sc  # noqa: E402

CONFIG = """listen = "127.0.0.1:%d"; store = "allow"; log_level = "warn";
metrics = { listen = "127.0.0.1:%d"; };
limits = { l = { rate = 10; period = "1m"; }; };
tiers = { free = { limits = ["l"]; }; };
anonymous = { limits = ["l"]; };
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def hello(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(sc.haproxy_hello())
    head = s.recv(4)
    n = struct.unpack(">I", head)[0]
    while n:
        n -= len(s.recv(n))
    return s


def main():
    agent = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    m = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    port, mport = free_port(), free_port()
    d = tempfile.mkdtemp(prefix="idle-flood-")
    conf = os.path.join(d, "agent.conf")
    with open(conf, "w") as f:
        f.write(CONFIG % (port, mport))
    with open(os.path.join(d, "agent.log"), "wb") as log:
        p = subprocess.Popen([agent, "-f", conf], stdout=log, stderr=subprocess.STDOUT)
    socks = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        time.sleep(0.3)
        before = rss_kb(p.pid)
        for _ in range(n):
            socks.append(hello(port))
        time.sleep(0.5)
        after = rss_kb(p.pid)
        print("%d idle SPOP connections after HELLO: agent RSS %d -> %d kB (%+.1f kB each)"
              % (n, before, after, (after - before) / max(n, 1)))
        for s in socks:
            s.close()
        socks = [socket.create_connection(("127.0.0.1", mport)) for _ in range(m)]
        time.sleep(0.2)
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", mport), timeout=20) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    data += b
            status = data.split(b"\r\n", 1)[0].decode(errors="replace") or "closed, no reply"
        except OSError as e:
            status = "error: %s" % e
        print("GET /metrics with %d idle metrics sockets: %s in %.3f s"
              % (m, status, time.monotonic() - t0))
    finally:
        for s in socks:
            s.close()
        p.terminate()
        p.wait(10)


if __name__ == "__main__":
    main()
