"""A misbehaving Redis: the agent stays up, answers, and keeps its memory.

A fake Redis (fake_redis.py) completes the agent's handshake like a real one, then answers
every decision's script call with one kind of misbehaviour for a few seconds (the breaker
set never to open, so that every decision meets it): a reply nested a
million deep, a bulk string announcing a terabyte and sent without end, an array announcing
2^31 - 1 elements followed by endless integers, the largest array a reply may hold
(built, then found to be no script reply), endless garbage, a line without its end, a
valid reply one byte a second, or silence. Meanwhile the test sends decisions over SPOP and
probes /healthz, and samples the agent's resident memory. The agent must stay alive, answer
every decision (degraded: the failure ladder) and every /healthz within 250 ms, keep its RSS
under 64 MB above its idle size, and decide with Redis again once Redis behaves.

Each case prints one line with what it measured (pytest -s shows them): decisions answered,
the worst SPOP and /healthz latencies, the RSS growth, the protocol errors logged.
"""
import os
import threading
import time

import pytest

import spop_client as sc
from conftest import http_request, vm_rss_kb, wait_until
from fake_redis import FakeRedis, script_reply

WINDOW_S = 4.0          # how long Redis misbehaves
CHUNK = b"\0" * 65536


def nested(fr):
    yield b"*1\r\n" * 1000000 + b":1\r\n"


def huge_bulk(fr):
    yield b"$1099511627776\r\n"
    chunk = b"x" * 65536
    while not fr.closing:
        yield chunk


def huge_array(fr):
    yield b"*2147483647\r\n"
    chunk = b":1\r\n" * 16384
    while not fr.closing:
        yield chunk


def largest_allowed(fr):
    """An array of as many elements as a reply may hold (the default limit), 1 MB of
    integers: read, built and refused as a script reply, every time."""
    yield b"*262144\r\n" + b":1\r\n" * 262144


def garbage(fr):
    rnd = os.urandom(1 << 20)
    while not fr.closing:
        yield rnd


def endless_line(fr):
    yield b"+"
    chunk = b"a" * 65536
    while not fr.closing:
        yield chunk


def byte_a_second(fr):
    for b in script_reply(1):
        if fr.closing:
            return
        yield bytes([b])
        time.sleep(1.0)


def silent(fr):
    while not fr.closing:
        time.sleep(0.05)
    yield b""


CASES = {
    "nested": (nested, True),
    "huge_bulk": (huge_bulk, True),
    "huge_array": (huge_array, True),
    "garbage": (garbage, True),
    "largest_allowed": (largest_allowed, False),
    "endless_line": (endless_line, True),
    "byte_a_second": (byte_a_second, False),
    "silent": (silent, False),
}


class BadRedis(FakeRedis):
    """A fake Redis whose script calls misbehave (with <kind>) while .bad is set."""

    def __init__(self, kind):
        self.bad = False
        super().__init__(script=self._script)
        self.kind = kind

    def _script(self, nkeys, argv):
        if self.bad:
            return self.kind(self)
        return script_reply(nkeys)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_misbehaving_redis_neither_stops_nor_bloats_the_agent(agent, case):
    kind, protocol_error = CASES[case]
    fr = BadRedis(kind)
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False,
                  redis_cfg={"command_timeout_ms": 50, "breaker_failures": 1000000})
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.05, "store ready")
        pid = a.proc.pid
        time.sleep(0.5)
        idle = vm_rss_kb(pid)
        stop = threading.Event()
        peak = [idle]
        health = []                     # (latency s, status)
        errors = []

        def sample():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], vm_rss_kb(pid))
                except (OSError, AssertionError):
                    return
                time.sleep(0.01)

        def probe():
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = http_request(a.metrics_addr, "/healthz", timeout=2.0)
                    health.append((time.monotonic() - t0, r.status))
                except OSError as e:
                    errors.append("healthz: %r" % e)
                    health.append((time.monotonic() - t0, 0))
                time.sleep(0.1)

        threads = [threading.Thread(target=f, daemon=True) for f in (sample, probe)]
        for t in threads:
            t.start()
        lat, degraded, sid = [], 0, 1
        try:
            fr.bad = True
            with sc.SpopClient(a.addr, timeout=2.0) as c:
                c.hello()
                end = time.monotonic() + WINDOW_S
                while time.monotonic() < end:       # ~100 decisions/s, bounded by the window
                    t0 = time.monotonic()
                    v = c.request(sid, 1, [sc.rl_message(key="bad-%d" % (sid % 50))])
                    lat.append(time.monotonic() - t0)
                    assert "allow" in v, v
                    degraded += v.get("degraded") == 1
                    sid += 2
                    time.sleep(0.01)
            fr.bad = False
        finally:
            stop.set()
            for t in threads:
                t.join(5)
        log = a.proc.log_text()
        perr = log.count("protocol error")
        worst_health = max(h[0] for h in health)
        print("\n%s: %d decisions (%d degraded), worst SPOP %.1f ms, worst /healthz %.1f ms "
              "(%d probes), RSS idle %d kB, peak +%d kB, protocol errors logged %d" % (
                  case, len(lat), degraded, max(lat) * 1e3, worst_health * 1e3, len(health),
                  idle, peak[0] - idle, perr))
        assert a.alive(), a.proc.log_tail()
        assert not errors, errors
        assert all(h[1] == 200 for h in health), health
        assert worst_health < 0.25, health
        assert max(lat) < 0.25, sorted(lat)[-5:]
        assert degraded > 0
        assert peak[0] - idle < 64 * 1024, (idle, peak[0])
        if protocol_error:
            assert perr > 0, a.proc.log_tail()
        # Redis behaves again: exact decisions come back
        a.wait_store(timeout=15)
    finally:
        fr.close()
