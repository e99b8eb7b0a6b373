#!/usr/bin/python3
"""spoa-ratelimit under attack: the attacks of the threat model as a repeatable suite.

`make attack` runs, on loopback, two gateways (two HAProxy instances running the sample
haproxy/haproxy.cfg, each with its own agent) in front of one Redis and one stand-in
application, and plays each attack while two steady clients send traffic through both
gateways: a **victim** key that sends 4x its limit (tier `victim`: 10/s, burst 10) and an
**honest** key well below its limit (tier `pro`). One row per attack:

  victim adm/allowed   requests the victim got through (HTTP 200) / what one exact limiter
                       admits over the same span (burst + rate x span)
  honest ok            the honest client's share of HTTP 200 answers
  degraded             decisions Redis could not make, counted by the agents themselves
                       (spoa_ratelimit_degraded_total, every reason, both agents)
  unprot               answers seen by our clients that let a request through unchecked:
                       HTTP 200 with X-RateLimit-Degraded or X-RateLimit-Agent-Error
  redis dMB / dkeys    growth of Redis INFO used_memory and DBSIZE over the row
  rss MB               the larger of the two agents' VmRSS at the end of the row
  check / result       the bound the row must hold (issue "Protection that holds under
                       attack and overload") and PASS/FAIL against it

The attacks (rows), in the order they run:

  burst     1,000 distinct clients at once through HAProxy (500 connections per gateway,
            each from its own source address with its own key of tier pro; fresh keys each
            time), every second for 8 s.
            victim <= 1.05 x allowed and degraded <= 1% of decisions, counted both by the
            agents (spoa_ratelimit_degraded_total of their decisions) and by the gateways
            (requests answered with X-RateLimit-Degraded, or X-RateLimit-Agent-Error because
            the agent did not answer within the processing budget, of all requests): the
            check column shows agents/gateways.
  flood     100,000 random unknown API keys from 100 source addresses, half per gateway,
            as SPOP NOTIFYs straight to the agents (what HAProxy sends for such requests;
            answers later than RL_SPOE_TIMEOUT count as unanswered), Redis at `maxmemory`
            (used memory + 8 MB, noeviction) for the row.
            victim <= 1.05 x; Redis growth <= --flood-bytes-per-address x 100; no OOM-induced
            fail-open (Redis reported OOM errors and the agents allowed requests with no limit
            at all: spoa_ratelimit_decisions_total{result="degraded",rule="-"}).
  smuggle   through HAProxy: the key as "K, other", "other, K", two X-API-Key headers, and
            the endpoint /v1/search spelled /v1//search, //v1/search, /v1/%73earch,
            /v1/./search, /v1/x/../search, /V1/search, method `get`; each variant with its own
            key of tier `probe` (10 per minute), 20 requests.
            every variant admitted <= the plain form.
  stall     wrk through both gateways at ~2,000 req/s for 20 s; Redis stalled every second
            by DEBUG SLEEP 5, 20, 50 ms in turn (a separate connection).
            unprotected answers <= 2 x the requests sent during the stalls (measured stall
            time x measured request rate).
  sigstop   wrk at ~2,000 req/s; gateway A's agent SIGSTOPped 3 s, then SIGCONT.
            <= 10 degraded answers on gateway A to requests sent after SIGCONT
            (X-RateLimit-Degraded or X-RateLimit-Agent-Error).
  step      load step 0 -> saturation on a healthy Redis: capacity measured first (16
            NOTIFYs in flight per agent, 2 s), then a paced load of 2 x capacity (at least
            20,000/s in all; up to 1,024 in flight per agent) for 6 s, straight to the
            agents.
            Answers count only within RL_SPOE_TIMEOUT, as in HAProxy.
            0 breaker openings in the row (spoa_ratelimit_redis_breaker_opened_total); answers
            the agents could not fit (degraded + not answered in time) <= offered - capacity
            x span.
  idle      10,000 connections to agent A that send HELLO and go idle, 64 idle sockets on
            its metrics port, held 12 s.
            a fresh SPOP connection is answered (HELLO and NOTIFY), HAProxy sees the agent UP
            (its health checks connect: `show servers state`), gateway A's requests over the
            last 11 s (~300) lack the agent's verdict no more often than over 11 s of the
            same traffic just before the connections opened (the control: a machine that
            stalls its processes for 10 ms now and then fails a few requests in any row),
            + 1% of the requests + twice the noise of two counts (2 x sqrt(hold + control
            failures)), GET /metrics answers within 2 s, RSS growth <= --idle-rss-mb.
  outage    both agents stopped; one key at 2 x RL_FALLBACK_RATE per gateway for 5 s.
            that key admitted at RL_FALLBACK_RATE +- 10% per gateway (RL_FALLBACK_RATE from
            the environment, else haproxy.cfg's presetenv).

Options: --agent (binary), --samples (the directory with haproxy.cfg, spoe-ratelimit.conf,
tiers.map: measured as they are), --config (agent configuration template, default
contrib/spoa-ratelimit.conf: its limits, tiers, fallback and timeouts are kept; `listen`,
`redis.address` and `metrics.listen` are rewritten and the tiers `victim` and `probe` added),
--attacks (a subset), --time-limit (watchdog).

Counts that depend on the agent's version are read from its /metrics (families absent in an
older agent count as 0 and are named in the details). The machine's load is printed: on a
shared machine the timing rows (stall, sigstop, step) are noisy.

Exit status: 0 whatever the numbers (1 with --strict when a row fails); 2 when something
could not be set up (a process did not start, the run exceeded its time bound).
"""

import argparse
import math
import os
import re
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlharness as rh  # noqa: E402

LH = rh.LOCALHOST
ATTACKS = ["burst", "flood", "smuggle", "stall", "sigstop", "step", "idle", "outage"]

VICTIM_RATE, VICTIM_BURST = 10, 10        # tier victim: 10/s, burst 10
VICTIM_SEND = 40.0                        # the victim sends 4x its limit (both gateways)
HONEST_SEND = 10.0                        # the honest key (tier pro, 100/s) sends 10/s
LOAD_KEYS = 1000                          # keys attack-load-N (tier pro) for wrk
BURST_CLIENTS, BURST_ROUNDS = 1000, 8     # keys attack-burst-N (tier pro)
IDLE_HOLD = 12.0                          # seconds the idle connections are held
STEP_FLOOR = 20000.0                      # step: NOTIFYs per second offered at least

EXTRA_LIMITS = """
  attack_victim = { rate = %d; period = "1s"; burst = %d; };
  attack_probe  = { rate = 10; period = "1m"; burst = 10; };
""" % (VICTIM_RATE, VICTIM_BURST)
EXTRA_TIERS = """
  victim = { limits = [ "attack_victim" ]; };
  probe  = { limits = [ "attack_probe" ]; };
"""


# ---------------------------------------------------------------------------------------
# Small clients: HTTP/1.1 on a raw socket (duplicate headers, raw paths and methods, a
# chosen source address), Prometheus text, Redis INFO, SPOP frames.

class Http:
    """One keep-alive connection to a gateway, reopened when the server closed it."""

    def __init__(self, port, src=None, timeout=3.0):
        self.port, self.src, self.timeout = port, src, timeout
        self.s = None
        self.buf = b""

    def close(self):
        if self.s is not None:
            self.s.close()
            self.s = None
        self.buf = b""

    def _open(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        if self.src:
            s.bind((self.src, 0))
        s.connect((LH, self.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s = s

    def request(self, method="GET", path="/", headers=()):
        """Returns (status, {lower-case name: last value}); status 0 = no answer."""
        req = "%s %s HTTP/1.1\r\nHost: api.example\r\n%s\r\n" % (
            method, path, "".join("%s: %s\r\n" % kv for kv in headers))
        for attempt in (0, 1):
            try:
                if self.s is None:
                    self._open()
                self.s.sendall(req.encode())
                return self._response()
            except OSError:
                self.close()
                if attempt:
                    return 0, {}
        return 0, {}

    def _fill(self):
        d = self.s.recv(65536)
        if not d:
            raise ConnectionResetError("closed")
        self.buf += d

    def _response(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        n = int(hdrs.get("content-length", "0"))
        while len(self.buf) < n:
            self._fill()
        self.buf = self.buf[n:]
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return status, hdrs


def unprotected(status, hdrs):
    """A request let through without the agent's decision."""
    return status == 200 and ("x-ratelimit-degraded" in hdrs or
                              "x-ratelimit-agent-error" in hdrs)


def scrape(port, timeout=2.0):
    """The agent's /metrics as {(name, labels): value}; None when it does not answer."""
    try:
        with urllib.request.urlopen("http://%s:%d/metrics" % (LH, port),
                                    timeout=timeout) as r:
            text = r.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def fam(snap, name, **labels):
    """Sum of the samples of one family (optionally with these label values); None when
    the family is absent."""
    if snap is None:
        return None
    tot, seen = 0.0, False
    for (n, lab), v in snap.items():
        if n != name:
            continue
        if all('%s="%s"' % kv in lab for kv in labels.items()):
            tot += v
            seen = True
    return tot if seen else None


def redis_info(port):
    out = {}
    for sec in ("memory", "errorstats", "stats"):
        for line in rh.redis_cmd(port, "INFO", sec).splitlines():
            k, _, v = line.partition(":")
            out[k] = v.strip()
    out["dbsize"] = rh.redis_cmd(port, "DBSIZE")
    return out


def redis_oom(info):
    m = re.search(r"count=(\d+)", info.get("errorstat_OOM", ""))
    return int(m.group(1)) if m else 0


def family_pids(pid):
    """<pid> and its children (an agent's workers)."""
    pids = [pid]
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return pids


def signal_agent(proc, sig):
    """<sig> to the agent and its workers, by PID."""
    for p in family_pids(proc.pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def haproxy_cmd(path, cmd, timeout=2.0):
    """One command on an HAProxy stats socket; the answer text, or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(cmd.encode() + b"\n")
            out = b""
            while True:
                d = s.recv(65536)
                if not d:
                    return out.decode(errors="replace")
                out += d
    except OSError:
        return None


def agent_server_state(b, gw):
    """HAProxy's view of the agent server (the one on the agent's port, whatever its
    backend's name): UP, DOWN, ... from `show servers state`; ? when not found."""
    out = haproxy_cmd(b.h.tmp / ("haproxy-%s.sock" % gw.name), "show servers state") or ""
    for line in out.splitlines():
        f = line.split()
        # be_id be_name srv_id srv_name srv_addr srv_op_state ... (field 18: srv_port)
        if len(f) > 18 and f[0].isdigit() and f[4] == LH and f[18] == str(gw.agent_port):
            return {"0": "DOWN", "1": "STARTING", "2": "UP", "3": "STOPPING"}.get(
                f[5], f[5])
    return "?"


def rss_kb(pid):
    """VmRSS of <pid> and of its children (workers), in kB; 0 when it is gone."""
    tot = 0
    for p in family_pids(pid):
        try:
            with open("/proc/%d/status" % p) as f:
                m = re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M)
                tot += int(m.group(1)) if m else 0
        except OSError:
            pass
    return tot


def varint(v):
    if v < 240:
        return bytes([v])
    out = [0xF0 | (v & 0x0F)]
    v = (v - 240) >> 4
    while v >= 128:
        out.append(0x80 | (v & 0x7F))
        v = (v - 128) >> 7
    out.append(v)
    return bytes(out)


def spop_str(s):
    s = s.encode() if isinstance(s, str) else s
    return varint(len(s)) + s


def spop_frame(ftype, sid, fid, payload):
    body = bytes([ftype]) + struct.pack(">I", 1) + varint(sid) + varint(fid) + payload
    return struct.pack(">I", len(body)) + body


HELLO = spop_frame(1, 0, 0, spop_str("supported-versions") + b"\x08" + spop_str("2.0") +
                   spop_str("max-frame-size") + b"\x03" + varint(16380) +
                   spop_str("capabilities") + b"\x08" + spop_str("pipelining"))


def notify(sid, key):
    args = [("key", b"\x08" + spop_str(key)), ("ip", b"\x06" + bytes([127, 0, 0, 1])),
            ("method", b"\x08" + spop_str("GET")), ("path", b"\x08" + spop_str("/"))]
    payload = spop_str("rl-req") + bytes([len(args)])
    for k, v in args:
        payload += spop_str(k) + v
    return spop_frame(3, sid, 1, payload)


def spop_probe(port, timeout=2.0):
    """A fresh connection as HAProxy opens one: HELLO, then one NOTIFY. Returns None when
    both were answered, else what failed."""
    try:
        with socket.create_connection((LH, port), timeout=timeout) as s:
            deadline = time.monotonic() + timeout
            s.sendall(HELLO)
            buf = b""
            want = [101, 103]
            while want:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                d = s.recv(65536)
                if not d:
                    return "closed by the agent" + (" after HELLO" if want[0] == 103 else "")
                buf += d
                while len(buf) >= 5 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                    n = struct.unpack(">I", buf[:4])[0]
                    ftype = buf[4]
                    buf = buf[4 + n:]
                    if ftype == 102:
                        return "AGENT-DISCONNECT"
                    if want and ftype == want[0]:
                        want.pop(0)
                        if ftype == 101:
                            s.sendall(notify(1, "attack-probe-spop"))
    except socket.timeout:
        return "no answer within %.0f s" % timeout
    except OSError as e:
        return "error: %s" % e
    return None


# ---------------------------------------------------------------------------------------
# Steady clients

class Steady(threading.Thread):
    """One key at a fixed rate, alternating between the gateways; records every answer."""

    def __init__(self, key, rate, ports, stop):
        super().__init__(daemon=True)
        self.key, self.rate, self.ports, self.stop_evt = key, rate, ports, stop
        self.rec = []           # (t, gateway index, status, degraded, agent error)

    def run(self):
        clients = [Http(p, timeout=2.0) for p in self.ports]
        nxt = time.monotonic()
        i = 0
        while not self.stop_evt.is_set():
            now = time.monotonic()
            if now < nxt:
                self.stop_evt.wait(nxt - now)
                continue
            g = i % len(clients)
            st, hd = clients[g].request(headers=[("X-API-Key", self.key)])
            self.rec.append((now, g, st, "x-ratelimit-degraded" in hd,
                             "x-ratelimit-agent-error" in hd))
            i += 1
            nxt = max(nxt + 1.0 / self.rate, time.monotonic() - 0.25)
        for c in clients:
            c.close()


# ---------------------------------------------------------------------------------------
# The bench: Redis, the application, two gateways

class Gateway:
    def __init__(self, name):
        self.name = name
        self.agent = None
        self.agent_port = None
        self.metrics_port = None
        self.haproxy = None
        self.port = None


class Bench:
    def __init__(self, h, args):
        self.h = h
        self.args = args
        self.samples = Path(args.samples).resolve()
        self.template = Path(args.config).read_text()
        self.gws = [Gateway("A"), Gateway("B")]

    # -- configuration

    def agent_conf(self, gw):
        t = self.template
        listen = 'listen = "%s:%d";' % (LH, gw.agent_port)
        t, n = re.subn(r"(?m)^listen\s*=[^;]*;", listen, t, count=1)
        if not n:
            t = listen + "\n" + t
        addr = '"%s:%d"' % (LH, self.redis_port)
        t, n = re.subn(r'(?s)(^|\n)(redis\s*=\s*\{[^}]*?\baddress\s*=\s*)"[^"]*"',
                       lambda m: m.group(1) + m.group(2) + addr, t, count=1)
        if not n:
            t, n = re.subn(r"(?m)^(redis\s*=\s*\{)", r"\1\n  address = %s;" % addr, t, count=1)
        if not n:
            t += "\nredis = { address = %s; };\n" % addr
        mlisten = '"%s:%d"' % (LH, gw.metrics_port)
        t, n = re.subn(r'(?s)(^|\n)(metrics\s*=\s*\{[^}]*?\blisten\s*=\s*)"[^"]*"',
                       lambda m: m.group(1) + m.group(2) + mlisten, t, count=1)
        if not n:
            t, n = re.subn(r"(?m)^(metrics\s*=\s*\{)", r"\1\n  listen = %s;" % mlisten, t,
                           count=1)
        if not n:
            t += "\nmetrics = { listen = %s; };\n" % mlisten
        for group, extra in (("limits", EXTRA_LIMITS), ("tiers", EXTRA_TIERS)):
            t, n = re.subn(r"(?m)^(%s\s*=\s*\{)" % group, lambda m: m.group(1) + extra, t,
                           count=1)
            if not n:
                raise rh.SetupError("agent config template has no top-level `%s = {`" % group)
        return t

    def tier_map(self):
        lines = [self.samples.joinpath("tiers.map").read_text().rstrip("\n"), "# attack.py"]
        for a in ATTACKS:
            lines.append("attack-victim-%s victim" % a)
            lines.append("attack-honest-%s pro" % a)
        for i in range(40):
            lines.append("attack-probe-%d probe" % i)
        for i in range(LOAD_KEYS):
            lines.append("attack-load-%d pro" % i)
        for i in range(BURST_CLIENTS * BURST_ROUNDS):
            lines.append("attack-burst-%d pro" % i)
        lines.append("attack-outage pro")
        path = self.h.tmp / "tiers.map"
        path.write_text("\n".join(lines) + "\n")
        return path

    def spoe_timeout_ms(self):
        """The SPOE processing budget of the samples (RL_SPOE_TIMEOUT), in ms."""
        v = os.environ.get("RL_SPOE_TIMEOUT")
        if not v:
            m = re.search(r"presetenv\s+RL_SPOE_TIMEOUT\s+(\S+)",
                          self.samples.joinpath("haproxy.cfg").read_text())
            v = m.group(1) if m else "10ms"
        m = re.match(r"^(\d+)(us|ms|s|m)?$", v)
        if not m:
            return 10
        return int(m.group(1)) * {"us": 0.001, "ms": 1, None: 1, "s": 1000,
                                  "m": 60000}[m.group(2)]

    def fallback_rate(self):
        if os.environ.get("RL_FALLBACK_RATE"):
            return int(os.environ["RL_FALLBACK_RATE"])
        m = re.search(r"presetenv\s+RL_FALLBACK_RATE\s+(\d+)",
                      self.samples.joinpath("haproxy.cfg").read_text())
        return int(m.group(1)) if m else None

    # -- processes

    def start(self):
        h = self.h
        rver = subprocess.run([rh.which("redis-server", "REDIS_BIN"), "--version"],
                              capture_output=True, text=True, timeout=5).stdout
        m = re.search(r"v=(\d+)\.(\d+)", rver)
        self.redis_version = "%s.%s" % m.groups() if m else "?"
        extra = ("--enable-debug-command", "yes") if m and int(m.group(1)) >= 7 else ()
        self.redis, self.redis_port = rh.start_redis(h, extra=extra)
        self.upstream, self.upstream_port = rh.start_upstream(h)
        self.map = self.tier_map()
        for gw in self.gws:
            for attempt in range(3):    # the ports were free a moment ago: retry if taken
                gw.agent_port, gw.metrics_port = rh.free_ports(2)
                try:
                    self.start_agent(gw)
                    break
                except rh.SetupError:
                    if gw.agent is None or gw.agent.alive() or attempt == 2:
                        raise
                    self.h.stop(gw.agent)
        for gw in self.gws:
            self.start_gateway(gw)
        for gw in self.gws:             # the gateway gets the agent's verdicts
            c = Http(gw.port)

            def answered():
                st, hd = c.request(headers=[("X-API-Key", "demo-pro-key")])
                return st == 200 and "x-ratelimit-agent-error" not in hd and \
                    "x-ratelimit-degraded" not in hd
            rh.poll(answered, timeout=15, interval=0.2,
                    what="gateway %s answered by its agent" % gw.name)
            c.close()

    def start_agent(self, gw):
        h = self.h
        path = h.tmp / ("agent-%s.conf" % gw.name)
        path.write_text(self.agent_conf(gw))
        rc, out = h.run("agent-%s-check" % gw.name, [self.args.agent, "-c", "-f", path], 10)
        if rc != 0:
            raise rh.SetupError("agent config rejected by -c:\n%s" % rh.indent(out))
        gw.agent = h.spawn("agent-%s" % gw.name, [self.args.agent, "-f", path])
        h.wait_listening(gw.agent, gw.agent_port, 10)
        rh.poll(lambda: scrape(gw.metrics_port) is not None, timeout=10, interval=0.05,
                what="agent %s /metrics" % gw.name)

    def start_gateway(self, gw):
        haproxy_bin = rh.which("haproxy", "HAPROXY_BIN")

        def mk(port):
            env = dict(os.environ)
            env.update({
                "RL_FRONT_ADDR": "%s:%d" % (LH, port),
                "RL_AGENT_ADDR": "%s:%d" % (LH, gw.agent_port),
                "RL_UPSTREAM_ADDR": "%s:%d" % (LH, self.upstream_port),
                "RL_SPOE_CONF": str(self.samples / "spoe-ratelimit.conf"),
                "RL_TIER_MAP": str(self.map),
                "RL_STATS_SOCKET": str(self.h.tmp / ("haproxy-%s.sock" % gw.name)),
            })
            return [haproxy_bin, "-db", "-f", self.samples / "haproxy.cfg"], env
        gw.haproxy, gw.port = self.h.start_listening("haproxy-%s" % gw.name, mk, timeout=15)

    def ensure_agents(self):
        """An agent that died in a row is named in it and restarted for the next."""
        dead = []
        for gw in self.gws:
            if gw.agent is not None and not gw.agent.alive():
                dead.append("agent %s exited (%s)" % (gw.name, gw.agent.p.returncode))
                self.h.stop(gw.agent)
                self.start_agent(gw)
        return dead

    def snapshot(self):
        return {"metrics": [scrape(g.metrics_port) if g.agent and g.agent.alive() else None
                            for g in self.gws],
                "redis": redis_info(self.redis_port), "t": time.monotonic()}

    def load(self, name, argv):
        return self.h.spawn(name, [self.args.load] + [str(a) for a in argv])

    def load_result(self, proc, timeout):
        try:
            proc.p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.h.stop(proc, 1.0)
        line = next((l for l in proc.log_text().splitlines() if l.startswith("decisions=")),
                    None)
        if line is None:
            raise rh.SetupError("%s failed (exit %s):\n%s" % (proc.name, proc.rc,
                                                              rh.indent(proc.log_tail())))
        return {k: float(v) for k, _, v in (kv.partition("=") for kv in line.split())}


# ---------------------------------------------------------------------------------------
# wrk through the gateways, counting the answers that carry the failure headers

WRK_LUA = r"""
local threads = {}
local nthreads = 0
function setup(thread)
  thread:set("id", nthreads)
  nthreads = nthreads + 1
  table.insert(threads, thread)
end
function init(args)
  nkeys = tonumber(args[1]); prefix = args[2]; pause = tonumber(args[3])
  n = 0; ok = 0; denied = 0; other = 0; degraded = 0; agenterr = 0; unprot = 0
end
function request()
  n = n + 1
  return wrk.format("GET", "/", {["X-API-Key"] = prefix .. ((n * 7 + id * 131) % nkeys)})
end
function delay()
  return pause
end
function response(status, headers, body)
  local deg = headers["x-ratelimit-degraded"] or headers["X-RateLimit-Degraded"]
  local err = headers["x-ratelimit-agent-error"] or headers["X-RateLimit-Agent-Error"]
  if status == 200 then ok = ok + 1
  elseif status == 429 or status == 503 then denied = denied + 1
  else other = other + 1 end
  if deg then degraded = degraded + 1 end
  if err then agenterr = agenterr + 1 end
  if status == 200 and (deg or err) then unprot = unprot + 1 end
end
function done(summary, latency, requests)
  local t = {ok = 0, denied = 0, other = 0, degraded = 0, agenterr = 0, unprot = 0}
  for _, th in ipairs(threads) do
    for k, _ in pairs(t) do t[k] = t[k] + th:get(k) end
  end
  io.write(string.format("wrkcount ok=%d denied=%d other=%d degraded=%d agent_error=%d " ..
    "unprotected=%d requests=%d errors=%d\n", t.ok, t.denied, t.other, t.degraded,
    t.agenterr, t.unprot, summary.requests, summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.status + summary.errors.timeout))
end
"""


def start_wrk(b, name, gw, seconds, rate, conns=10):
    """~<rate> req/s (each of <conns> connections pauses conns/rate s between requests)."""
    script = b.h.tmp / "attack.lua"
    if not script.exists():
        script.write_text(WRK_LUA)
    pause = max(1, int(round(1000.0 * conns / rate)) - 1)     # ~1 ms per answer
    argv = [rh.which("wrk", "WRK_BIN"), "-t1", "-c%d" % conns, "-d%ds" % seconds,
            "--timeout", "2s", "-s", script, "http://%s:%d/" % (LH, gw.port), "--",
            LOAD_KEYS, "attack-load-", pause]
    return b.h.spawn(name, argv)


def wrk_result(b, proc, timeout):
    try:
        proc.p.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    b.h.stop(proc, 1.0)
    line = next((l for l in proc.log_text().splitlines() if l.startswith("wrkcount ")), None)
    if line is None:
        raise rh.SetupError("%s failed (exit %s):\n%s" % (proc.name, proc.rc,
                                                          rh.indent(proc.log_tail())))
    return {k: int(v) for k, _, v in (kv.partition("=") for kv in line.split()[1:])}


def wrk_sum(results):
    out = {}
    for r in results:
        for k, v in r.items():
            out[k] = out.get(k, 0) + v
    return out


# ---------------------------------------------------------------------------------------
# The attacks. Each returns (check text, passed, detail, extra unprotected answers seen).

class Crowd:
    """<n> keep-alive HTTP connections to one gateway that each send one request at the
    same instant: a burst of distinct clients (each its own key and source address)."""

    def __init__(self, port, n, first_addr):
        self.port = port
        self.srcs = ["127.0.%d.%d" % ((first_addr + i) // 250 + 1, (first_addr + i) % 250 + 1)
                     for i in range(n)]
        self.socks = [None] * n

    def _open(self, i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2.0)
        s.bind((self.srcs[i], 0))
        s.connect((LH, self.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        self.socks[i] = s

    def close(self):
        for s in self.socks:
            if s is not None:
                s.close()
        self.socks = [None] * len(self.socks)

    def fire(self, keys, timeout=5.0):
        """One request per connection, keys[i] on connection i. Returns a list of
        (status, degraded, agent error); status 0 = no answer."""
        for i in range(len(self.socks)):
            if self.socks[i] is None:
                self._open(i)
        out = [(0, False, False)] * len(self.socks)
        bufs = [b""] * len(self.socks)
        sel = selectors.DefaultSelector()
        try:
            for i, s in enumerate(self.socks):
                req = "GET / HTTP/1.1\r\nHost: api.example\r\nX-API-Key: %s\r\n\r\n" % keys[i]
                try:
                    s.send(req.encode())
                    sel.register(s, selectors.EVENT_READ, i)
                except OSError:
                    s.close()
                    self.socks[i] = None
            deadline = time.monotonic() + timeout
            while sel.get_map() and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=0.1):
                    i = key.data
                    try:
                        d = key.fileobj.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        d = b""
                    bufs[i] += d
                    done, close = self._parse(bufs[i], out, i)
                    if done or not d:
                        sel.unregister(key.fileobj)
                        if close or not d:
                            key.fileobj.close()
                            self.socks[i] = None
        finally:
            for key in list(sel.get_map().values()):    # no answer: reopen next time
                key.fileobj.close()
                self.socks[key.data] = None
            sel.close()
        return out

    @staticmethod
    def _parse(buf, out, i):
        if b"\r\n\r\n" not in buf:
            return False, False
        head, body = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").lower().split("\r\n")
        hd = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hd[k.strip()] = v.strip()
        if len(body) < int(hd.get("content-length", "0")):
            return False, False
        out[i] = (int(lines[0].split()[1]), "x-ratelimit-degraded" in hd,
                  "x-ratelimit-agent-error" in hd)
        return True, hd.get("connection") == "close"


def attack_burst(b, row):
    """1,000 distinct clients (500 per gateway) send one request each at the same instant,
    every second, 8 times: known keys (tier pro, fresh keys each burst), each connection
    from its own source address. Through HAProxy, so its processing budget applies."""
    per = BURST_CLIENTS // 2
    crowds = [Crowd(gw.port, per, g * per) for g, gw in enumerate(b.gws)]
    res = []
    try:
        for i in range(BURST_ROUNDS):
            t = time.monotonic()
            threads, outs = [], [None, None]
            for g, c in enumerate(crowds):
                keys = ["attack-burst-%d" % (i * BURST_CLIENTS + g * per + j)
                        for j in range(per)]

                def go(g=g, c=c, keys=keys):
                    outs[g] = c.fire(keys)
                threads.append(threading.Thread(target=go, daemon=True))
            for th in threads:
                th.start()
            for th in threads:
                th.join(10)
            for o in outs:
                res += o or []
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    finally:
        for c in crowds:
            c.close()
    return {"burst": res,
            "unprot": sum(1 for st, deg, err in res if st == 200 and (deg or err))}


def finish_burst(b, row, ctx):
    """Degraded counts both ways and must hold both: the agents' own count (decisions
    Redis could not make, of their decisions) and what the gateways answered (requests
    that carried X-RateLimit-Degraded, or X-RateLimit-Agent-Error because the agent did
    not answer within HAProxy's processing budget, or got no answer, of all requests of
    the row): an agent too slow to answer in time protects no one either."""
    res = ctx["burst"]
    dec, deg = row["decisions"], row["degraded"]
    ok_v = row["victim_ratio"] is not None and row["victim_ratio"] <= 1.05
    share = deg / dec if dec else 1.0
    steady = [r for s in row["steady"] for r in s.rec]
    n = len(res) + len(steady)
    undecided = sum(1 for st, d, e in res if d or e or st == 0) + \
        sum(1 for r in steady if r[3] or r[4] or r[2] == 0)
    gw_share = undecided / n if n else 1.0
    passed = ok_v and share <= 0.01 and gw_share <= 0.01
    check = "victim<=1.05, degraded %.1f%%/%.1f%%<=1%%" % (100 * share, 100 * gw_share)
    detail = "%d bursts x %d distinct clients through HAProxy: %d answered 200, %d denied, " \
             "%d X-RateLimit-Degraded, %d X-RateLimit-Agent-Error (processing budget " \
             "expired), %d no answer; degraded: agents %d of %d decisions (%.1f%%), " \
             "gateways %d of %d requests not decided by the agent (%.1f%%)" % (
                 BURST_ROUNDS, BURST_CLIENTS, sum(1 for r in res if r[0] == 200),
                 sum(1 for r in res if r[0] in (429, 503)), sum(1 for r in res if r[1]),
                 sum(1 for r in res if r[2]), sum(1 for r in res if r[0] == 0), deg, dec,
                 100 * share, undecided, n, 100 * gw_share)
    return check, passed, detail


def attack_flood(b, row):
    info = redis_info(b.redis_port)
    used0 = int(info["used_memory"])
    maxmem = used0 + b.args.flood_maxmemory_mb * 1024 * 1024
    rh.redis_cmd(b.redis_port, "CONFIG", "SET", "maxmemory-policy", "noeviction")
    rh.redis_cmd(b.redis_port, "CONFIG", "SET", "maxmemory", maxmem)
    try:
        procs = []
        for gw in b.gws:
            procs.append(b.load("flood-%s" % gw.name, [
                "-a", "%s:%d" % (LH, gw.agent_port), "-c", 4, "-p", 64, "-n", 50000,
                "-k", 50000, "-s", "-i", 100, "-r", 5000, "-d", 14,
                "-T", b.spoe_timeout_ms(),
                "-K", "attack-flood-%s-%d-" % (gw.name, os.getpid())]))
        res = [b.load_result(p, 20) for p in procs]
        info1 = redis_info(b.redis_port)
    finally:
        rh.redis_cmd(b.redis_port, "CONFIG", "SET", "maxmemory", 0)
    return {"flood": res, "maxmem_mb": maxmem / 1048576.0,
            "hit_max": int(info1["used_memory"]) >= maxmem}


def finish_flood(b, row, ctx):
    res = ctx["flood"]
    sent = sum(int(r.get("sent", r["decisions"])) for r in res)
    answered = sum(int(r["decisions"]) for r in res)
    allowed = sum(int(r["allowed"]) for r in res)
    bound = 100 * b.args.flood_bytes_per_address
    grow = row["redis_dmem"]
    ok_v = row["victim_ratio"] is not None and row["victim_ratio"] <= 1.05
    oom_open = row["oom"] > 0 and (row["agent_unprot"] or 0) > 0
    passed = ok_v and grow <= bound and not oom_open
    check = "victim<=1.05, %.1fMB<=%.1fMB, OOM-open %s" % (
        grow / 1048576.0, bound / 1048576.0, "yes" if oom_open else "no")
    detail = "%d random keys sent from 100 addresses, %d answered, %d allowed; Redis " \
             "maxmemory %.0f MB (noeviction): %s, %d OOM errors; %.0f B per attacking " \
             "address; agents: %d answers allowed with no limit (degraded, rule \"-\")" % (
                 sent, answered, allowed, ctx["maxmem_mb"],
                 "reached" if ctx["hit_max"] or row["oom"] else "not reached", row["oom"],
                 grow / 100.0, row["agent_unprot"] or 0)
    return check, passed, detail


KEY_VARIANTS = [
    ("plain", lambda k, j: [("X-API-Key", k)]),
    ("K, other", lambda k, j: [("X-API-Key", "%s, smuggled-%d" % (k, j))]),
    ("other, K", lambda k, j: [("X-API-Key", "smuggled-%d, %s" % (j, k))]),
    ("K + 2nd header", lambda k, j: [("X-API-Key", k), ("X-API-Key", "smuggled-%d" % j)]),
    ("2nd header + K", lambda k, j: [("X-API-Key", "smuggled-%d" % j), ("X-API-Key", k)]),
]
PATH_VARIANTS = [
    ("GET /v1/search", "GET", "/v1/search"),
    ("/v1//search", "GET", "/v1//search"),
    ("//v1/search", "GET", "//v1/search"),
    ("/v1/%73earch", "GET", "/v1/%73earch"),
    ("/v1/./search", "GET", "/v1/./search"),
    ("/v1/x/../search", "GET", "/v1/x/../search"),
    ("/V1/search", "GET", "/V1/search"),
    ("method get", "get", "/v1/search"),
]


def attack_smuggle(b, row):
    """Each variant: its own probe key (tier probe, 10/min) and its own source address
    (so a variant the agent treats as anonymous gets a fresh per-address bucket too)."""
    n = 20
    out = {"keys": [], "paths": []}
    unprot = 0
    idx = 0
    for kind, variants in (("keys", KEY_VARIANTS), ("paths", PATH_VARIANTS)):
        for v in variants:
            key = "attack-probe-%d" % idx
            src = "127.0.0.%d" % (10 + idx)
            idx += 1
            clients = [Http(gw.port, src=src) for gw in b.gws]
            adm = 0
            for j in range(n):
                if kind == "keys":
                    st, hd = clients[j % 2].request(headers=v[1](key, j))
                else:
                    st, hd = clients[j % 2].request(method=v[1], path=v[2],
                                                    headers=[("X-API-Key", key)])
                adm += st == 200
                unprot += unprotected(st, hd)
            for c in clients:
                c.close()
            out[kind].append((v[0], adm))
    out["n"] = n
    return {"smuggle": out, "unprot": unprot}


def finish_smuggle(b, row, ctx):
    s = ctx["smuggle"]
    worse = []
    parts = []
    for kind in ("keys", "paths"):
        base = s[kind][0][1]
        for name, adm in s[kind]:
            parts.append("%s %d" % (name, adm))
            if adm > base:
                worse.append(name)
    passed = not worse
    check = "all variants <= plain" + ("" if passed else " (%d over)" % len(worse))
    detail = "admitted of %d each: %s%s" % (s["n"], "; ".join(parts),
                                           "; over: " + ", ".join(worse) if worse else "")
    return check, passed, detail


def attack_stall(b, row):
    dur = 20
    wrks = [start_wrk(b, "wrk-stall-%s" % gw.name, gw, dur + 1, 1000.0) for gw in b.gws]
    time.sleep(1.0)
    windows = []
    t0 = time.monotonic()
    for i in range(dur):
        nxt = t0 + i + 0.5
        time.sleep(max(0.0, nxt - time.monotonic()))
        ms = (5, 20, 50)[i % 3]
        t = time.monotonic()
        rh.redis_cmd(b.redis_port, "DEBUG", "SLEEP", "%.3f" % (ms / 1000.0), timeout=5)
        windows.append(time.monotonic() - t)
    res = wrk_sum([wrk_result(b, w, dur + 10) for w in wrks])
    return {"wrk": res, "windows": windows, "span": dur + 1, "unprot": res["unprotected"]}


def finish_stall(b, row, ctx):
    res = ctx["wrk"]
    rate = res["requests"] / float(ctx["span"])
    stalled = sum(ctx["windows"])
    delayed = rate * stalled
    unprot = res["unprotected"]
    passed = unprot <= 2 * delayed
    check = "unprot %d<=2x%.0f delayed" % (unprot, delayed)
    detail = "wrk %d requests (%.0f/s), %d with X-RateLimit-Degraded, %d with " \
             "X-RateLimit-Agent-Error, %d denied; %d stalls, %.0f ms stalled in all " \
             "(measured DEBUG SLEEP round trips); agents: %d degraded, breaker opened %s" % (
                 res["requests"], rate, res["degraded"], res["agent_error"], res["denied"],
                 len(ctx["windows"]), stalled * 1000, row["degraded"], row["breaker_str"])
    return check, passed, detail


def attack_sigstop(b, row):
    a, bb = b.gws
    pre, stop, post = 3, 3, 5
    w_b = start_wrk(b, "wrk-sigstop-B", bb, pre + stop + post, 1000.0)
    w_a1 = start_wrk(b, "wrk-sigstop-A1", a, pre + stop, 1000.0)
    t0 = time.monotonic()
    time.sleep(pre)
    signal_agent(a.agent, signal.SIGSTOP)
    try:
        time.sleep(max(0.0, t0 + pre + stop - time.monotonic()))
    finally:
        signal_agent(a.agent, signal.SIGCONT)
    w_a2 = start_wrk(b, "wrk-sigstop-A2", a, post, 1000.0)
    r_a1 = wrk_result(b, w_a1, 5)
    r_a2 = wrk_result(b, w_a2, post + 5)
    r_b = wrk_result(b, w_b, 5)
    return {"a1": r_a1, "a2": r_a2, "b": r_b,
            "unprot": r_a1["unprotected"] + r_a2["unprotected"] + r_b["unprotected"]}


def finish_sigstop(b, row, ctx):
    """Degraded after SIGCONT: gateway A's answers to requests sent after the resume that
    carry X-RateLimit-Degraded or X-RateLimit-Agent-Error (a fresh request the resumed
    agent did not answer within the processing budget is let through just the same)."""
    a2 = ctx["a2"]
    bad = a2["degraded"] + a2["agent_error"]
    passed = bad <= 10
    check = "degraded after SIGCONT %d<=10" % bad
    detail = "gateway A after SIGCONT (5 s): %d requests, %d X-RateLimit-Degraded, %d " \
             "X-RateLimit-Agent-Error (no answer within the processing budget, or the " \
             "agent still DOWN for HAProxy); while stopped: %d requests, %d agent errors; " \
             "gateway B: %d requests, %d degraded; agents: %d degraded, breaker opened %s" % (
                 a2["requests"], a2["degraded"], a2["agent_error"], ctx["a1"]["requests"],
                 ctx["a1"]["agent_error"], ctx["b"]["requests"], ctx["b"]["degraded"],
                 row["degraded"], row["breaker_str"])
    return check, passed, detail


def attack_step(b, row):
    # capacity: a light closed loop (16 in flight per agent), non-degraded decisions/s
    cal = [b.load("step-cal-%s" % gw.name, [
        "-a", "%s:%d" % (LH, gw.agent_port), "-c", 2, "-p", 8, "-d", 2, "-k", LOAD_KEYS,
        "-t", "pro", "-K", "attack-load-", "-T", b.spoe_timeout_ms()]) for gw in b.gws]
    cres = [b.load_result(p, 8) for p in cal]
    cap = sum((r["decisions"] - r["degraded"]) / r["seconds"] for r in cres)
    time.sleep(1.0)
    # per agent: 2 x capacity in all, and at least STEP_FLOOR in all (a capacity measured
    # while the agents failed is an underestimate: the step still saturates them)
    rate = max(cap, STEP_FLOOR / 2.0)
    dur = 6
    step = [b.load("step-%s" % gw.name, [
        "-a", "%s:%d" % (LH, gw.agent_port), "-c", 4, "-p", 256, "-d", dur, "-k", LOAD_KEYS,
        "-t", "pro", "-K", "attack-load-", "-r", "%.0f" % rate,
        "-T", b.spoe_timeout_ms()]) for gw in b.gws]
    sres = [b.load_result(p, dur + 8) for p in step]
    return {"cap": cap, "cal": cres, "step": sres, "dur": dur,
            "rate": 2 * rate}


def finish_step(b, row, ctx):
    s = ctx["step"]
    sent = sum(int(r.get("sent", r["decisions"])) for r in s)
    deg = sum(int(r["degraded"]) for r in s)
    unans = sum(int(r.get("unanswered", 0)) for r in s)
    span = max(r["seconds"] for r in s)
    excess = max(0.0, sent - ctx["cap"] * span)
    unfit = deg + unans
    opened = row["breaker"]
    passed = (opened or 0) == 0 and unfit <= excess
    check = "breaker %s==0, unfit %d<=%.0f" % (row["breaker_str"], unfit, excess)
    cal_deg = sum(int(r["degraded"]) for r in ctx["cal"])
    expired = sum(int(r.get("expired", 0)) for r in s)
    cal_all = sum(int(r["decisions"]) for r in ctx["cal"])
    detail = "capacity %.0f/s (non-degraded answers within %g ms, 16 in flight per agent; " \
             "%d of %d answers there degraded%s); step at %.0f/s: %d sent in %.1f s " \
             "(%.0f/s), %d degraded, %d unanswered (%d not within %g ms), excess over " \
             "capacity %.0f; agents (calibration and step): degraded by reason %s" % (
                 ctx["cap"], b.spoe_timeout_ms(), cal_deg, cal_all,
                 ": capacity underestimated" if cal_deg > 0.01 * cal_all else "",
                 ctx["rate"], sent, span, sent / span if span else 0, deg, unans, expired,
                 b.spoe_timeout_ms(), excess, row["degraded_by"])
    return check, passed, detail


def open_idle(port, n, payload, deadline):
    """<n> connections to <port>, each sending <payload> once connected. Returns (sockets,
    how many connected)."""
    socks, connected = [], 0
    sel = selectors.DefaultSelector()
    try:
        i = 0
        while (i < n or sel.get_map()) and time.monotonic() < deadline:
            while i < n and len(sel.get_map()) < 512:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex((LH, port))
                socks.append(s)
                sel.register(s, selectors.EVENT_WRITE)
                i += 1
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                sel.unregister(s)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected += 1
                    if payload:
                        try:
                            s.send(payload)
                        except OSError:
                            pass
    finally:
        sel.close()
    return socks, connected


def still_open(socks):
    n = 0
    for s in socks:
        try:
            d = s.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            n += len(d) > 0
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def attack_idle(b, row):
    a = b.gws[0]
    want = b.args.idle_conns
    ctl_from = time.monotonic()         # the control: the same traffic, no attack
    time.sleep(IDLE_HOLD - 1.0)
    ctl_to = time.monotonic()
    rss0 = rss_kb(a.agent.pid)
    t0 = time.monotonic()
    socks, conn = open_idle(a.agent_port, want, HELLO, time.monotonic() + 20)
    msocks, mconn = open_idle(a.metrics_port, 64, b"", time.monotonic() + 5)
    try:
        t_open = time.monotonic() - t0
        # > 2 health checks of HAProxy (inter 1 s); long enough that gateway A's steady
        # traffic (~27/s) makes a 1% share a count of requests, not a single one
        time.sleep(IDLE_HOLD)
        hold_from = time.monotonic() - (IDLE_HOLD - 1.0)
        probe = spop_probe(a.agent_port)
        t = time.monotonic()
        m = scrape(a.metrics_port, timeout=2.0)
        mlat = time.monotonic() - t
        rss1 = rss_kb(a.agent.pid)
        kept = still_open(socks)
        state = agent_server_state(b, a)
    finally:
        for s in socks + msocks:
            s.close()
    return {"want": want, "conn": conn, "mconn": mconn, "kept": kept, "t_open": t_open,
            "probe": probe, "metrics_ok": m is not None, "mlat": mlat, "rss0": rss0,
            "rss1": rss1, "hold_from": hold_from, "hold_to": time.monotonic(),
            "ctl_from": ctl_from, "ctl_to": ctl_to, "state": state}


def finish_idle(b, row, ctx):
    def window(t0, t1):
        recs = [r for s in row["steady"] for r in s.rec if r[1] == 0 and t0 <= r[0] <= t1]
        return recs, sum(1 for r in recs if r[4] or r[2] == 0)
    a_recs, errs = window(ctx["hold_from"], ctx["hold_to"])
    c_recs, c_errs = window(ctx["ctl_from"], ctx["ctl_to"])
    c_share = c_errs / len(c_recs) if c_recs else 0.0
    grow_mb = (ctx["rss1"] - ctx["rss0"]) / 1024.0
    # failures the idle connections may add: the control's share of as many requests,
    # + 1% of them, + 2 sigma of the difference of two Poisson counts
    allowed = (c_share + 0.01) * len(a_recs) + 2 * math.sqrt(errs + c_errs)
    ok_gw = a_recs and errs <= allowed
    passed = (ctx["probe"] is None and ctx["metrics_ok"] and ctx["mlat"] <= 2.0 and
              grow_mb <= b.args.idle_rss_mb and ok_gw and ctx["state"] == "UP")
    check = "spop %s, /metrics %s, agent %s, RSS +%.0fMB<=%d, no verdict %d<=%.1f" % (
        "ok" if ctx["probe"] is None else "FAIL",
        "%.2fs" % ctx["mlat"] if ctx["metrics_ok"] else "none",
        ctx["state"], grow_mb, b.args.idle_rss_mb, errs, allowed)
    detail = "%d/%d SPOP connections opened with HELLO in %.1f s, %d still open after %.0f s " \
             "(the rest closed by the agent); %d/64 metrics sockets; fresh SPOP connection: " \
             "%s; GET /metrics %s; gateway A during the hold: %d requests, %d without the " \
             "agent's verdict (before the connections opened: %d, %d), agent server %s for " \
             "HAProxy; agent A RSS %.0f -> %.0f MB" % (
                 ctx["conn"], ctx["want"], ctx["t_open"], ctx["kept"], IDLE_HOLD, ctx["mconn"],
                 ctx["probe"] or "answered", "%.2f s" % ctx["mlat"] if ctx["metrics_ok"]
                 else "no answer within 2 s", len(a_recs), errs, len(c_recs), c_errs,
                 ctx["state"],
                 ctx["rss0"] / 1024.0,
                 ctx["rss1"] / 1024.0)
    return check, passed, detail


def attack_outage(b, row):
    rate = b.fallback_rate()
    if rate is None:
        raise rh.SetupError("RL_FALLBACK_RATE not found in haproxy.cfg nor the environment")
    for gw in b.gws:
        gw.agent.p.send_signal(signal.SIGTERM)
    for gw in b.gws:
        b.h.stop(gw.agent, 5.0)
    time.sleep(1.0)
    dur = 5.0
    stop = threading.Event()
    offs = [Steady("attack-outage", 2.0 * rate, [gw.port], stop) for gw in b.gws]
    for o in offs:
        o.start()
    time.sleep(dur)
    stop.set()
    for o in offs:
        o.join(5)
    per = []
    for o in offs:
        span = (o.rec[-1][0] - o.rec[0][0] + 1.0 / o.rate) if o.rec else dur
        per.append((len(o.rec), sum(1 for r in o.rec if r[2] == 200), span))
    unprot = sum(1 for o in offs for r in o.rec if r[2] == 200 and r[4])
    return {"rate": rate, "per": per, "unprot": unprot, "agents_stopped": True}


def finish_outage(b, row, ctx):
    rate = ctx["rate"]
    got = [adm / span for _, adm, span in ctx["per"]]
    passed = all(abs(g - rate) <= 0.1 * rate for g in got)
    check = "%s/s per gw = %d+-10%%" % ("/".join("%.0f" % g for g in got), rate)
    detail = "both agents stopped; RL_FALLBACK_RATE %d; one key at %d/s per gateway: " % (
        rate, 2 * rate) + "; ".join(
        "gateway %s %d sent, %d admitted in %.1f s" % (gw.name, n, adm, span)
        for gw, (n, adm, span) in zip(b.gws, ctx["per"]))
    return check, passed, detail


ROWS = {
    "burst": ("distinct-client burst (1000 at once, x8)", attack_burst, finish_burst),
    "flood": ("random-key flood (100k keys, 100 addrs)", attack_flood, finish_flood),
    "smuggle": ("key smuggling and path variants", attack_smuggle, finish_smuggle),
    "stall": ("Redis stall 5/20/50 ms each s, 20 s", attack_stall, finish_stall),
    "sigstop": ("agent SIGSTOP 3 s, SIGCONT", attack_sigstop, finish_sigstop),
    "step": ("load step 0 -> saturation", attack_step, finish_step),
    "idle": ("10k idle SPOP + 64 idle metrics conns", attack_idle, finish_idle),
    "outage": ("agent outage, key at 2x fallback rate", attack_outage, finish_outage),
}


# ---------------------------------------------------------------------------------------
# One row: steady clients around the attack, counters before and after

def delta(after, before, name, **labels):
    a, b0 = fam(after, name, **labels), fam(before, name, **labels)
    if a is None:
        return None
    return a - (b0 or 0.0)


def sum_agents(s0, s1, name, **labels):
    vals = [delta(a, b0, name, **labels) for a, b0 in zip(s1, s0) if a is not None]
    vals = [v for v in vals if v is not None]
    return int(sum(vals)) if vals else None


def degraded_by(s0, s1):
    out = {}
    for a, b0 in zip(s1, s0):
        if a is None:
            continue
        for (n, lab), v in a.items():
            if n != "spoa_ratelimit_degraded_total":
                continue
            m = re.search(r'reason="([^"]*)"', lab)
            d = v - (b0.get((n, lab), 0.0) if b0 else 0.0)
            if d:
                out[m.group(1) if m else lab] = out.get(m.group(1) if m else lab, 0) + int(d)
    return ",".join("%s=%d" % kv for kv in sorted(out.items())) or "none"


def other_counters(s0, s1):
    """Counters of a newer agent that say a request was shed, dropped or refused: named in
    the details (their meaning is the agent's, the tool only reports them)."""
    out = {}
    for a, b0 in zip(s1, s0):
        if a is None:
            continue
        for (n, lab), v in a.items():
            short = n.replace("spoa_ratelimit_", "", 1)
            if not short.endswith("_total") or not re.search(
                    r"shed|drop|stale|overload|reject|refus|evict|expire|conn_limit", short):
                continue
            d = v - (b0.get((n, lab), 0.0) if b0 else 0.0)
            if d:
                k = short + lab
                out[k] = out.get(k, 0) + int(d)
    return out


def run_row(b, key):
    title, attack, finish = ROWS[key]
    if key == "idle" and b.args.idle_conns != 10000:
        title = title.replace("10k", str(b.args.idle_conns))
    stop = threading.Event()
    ports = [gw.port for gw in b.gws]
    victim = Steady("attack-victim-%s" % key, VICTIM_SEND, ports, stop)
    honest = Steady("attack-honest-%s" % key, HONEST_SEND, ports, stop)
    s0 = b.snapshot()
    rss = []
    victim.start()
    honest.start()
    t = time.monotonic()
    try:
        time.sleep(1.0)                 # the victim is over its limit before the attack
        ctx = attack(b, {}) or {}
        time.sleep(0.5)
    finally:
        stop.set()
        victim.join(5)
        honest.join(5)
    took = time.monotonic() - t
    for gw in b.gws:
        if gw.agent is not None and gw.agent.alive():
            rss.append(rss_kb(gw.agent.pid))
    s1 = b.snapshot()
    m0, m1 = s0["metrics"], s1["metrics"]
    row = {"key": key, "title": title, "took": took, "steady": [victim, honest]}
    v = victim.rec
    adm = sum(1 for r in v if r[2] == 200)
    span = v[-1][0] - v[0][0] if v else 0.0
    allowed = min(len(v), VICTIM_BURST + VICTIM_RATE * span)
    row["victim_ratio"] = adm / allowed if allowed else None
    row["victim_text"] = "%d/%.0f" % (adm, allowed)
    hr = honest.rec
    row["honest"] = sum(1 for r in hr if r[2] == 200) / len(hr) if hr else None
    row["decisions"] = sum_agents(m0, m1, "spoa_ratelimit_decisions_total") or 0
    row["degraded"] = sum_agents(m0, m1, "spoa_ratelimit_degraded_total") or 0
    # allowed with no limit at all (fail-open; a `local` fallback names its limit)
    row["agent_unprot"] = sum_agents(m0, m1, "spoa_ratelimit_decisions_total",
                                     result="degraded", rule="-")
    row["degraded_by"] = degraded_by(m0, m1)
    br = sum_agents(m0, m1, "spoa_ratelimit_redis_breaker_opened_total")
    row["breaker"] = br
    row["breaker_str"] = "n/a" if br is None else str(br)
    row["unprot"] = sum(1 for s in (victim, honest) for r in s.rec
                        if r[2] == 200 and (r[3] or r[4])) + ctx.get("unprot", 0)
    r0, r1 = s0["redis"], s1["redis"]
    row["redis_dmem"] = int(r1["used_memory"]) - int(r0["used_memory"])
    row["redis_dkeys"] = int(r1["dbsize"]) - int(r0["dbsize"])
    row["oom"] = redis_oom(r1) - redis_oom(r0)
    row["rss"] = max(rss) / 1024.0 if rss else None
    if ctx.get("agents_stopped"):
        row["rss"] = None
        row["degraded_by"] = "agents stopped"
    row["check"], row["passed"], row["detail"] = finish(b, row, ctx)
    extra = other_counters(m0, m1)
    if extra:
        row["detail"] += "; other agent counters: " + ", ".join(
            "%s +%d" % kv for kv in sorted(extra.items()))
    if key != "step" and row["degraded_by"] not in ("none", "agents stopped") and \
            "degraded by reason" not in row["detail"]:
        row["detail"] += "; degraded by reason: " + row["degraded_by"]
    dead = b.ensure_agents() if not ctx.get("agents_stopped") else []
    if dead:
        row["detail"] += "; " + ", ".join(dead) + " (restarted)"
        row["passed"] = False
    return row


# ---------------------------------------------------------------------------------------
# Output

def fmt(v, f):
    return "-" if v is None else f % v


def print_table(rows):
    head = "%-41s %12s %7s %8s %6s %7s %7s %6s  %-40s %s" % (
        "attack", "victim", "honest", "degraded", "unprot", "redis", "redis", "rss",
        "check", "result")
    head2 = "%-41s %12s %7s %8s %6s %7s %7s %6s" % (
        "", "adm/allowed", "ok", "(agents)", "(http)", "dMB", "dkeys", "MB")
    print(head)
    print(head2)
    print("-" * len(head))
    for r in rows:
        vt = "%s=%s" % (r["victim_text"], fmt(r["victim_ratio"], "%.2f"))
        print("%-41s %12s %7s %8d %6d %7.1f %7d %6s  %-40s %s" % (
            r["title"], vt, fmt(r["honest"], "%.3f"), r["degraded"], r["unprot"],
            r["redis_dmem"] / 1048576.0, r["redis_dkeys"], fmt(r["rss"], "%.0f"),
            r["check"], "PASS" if r["passed"] else "FAIL"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"))
    ap.add_argument("--load", default=str(rh.REPO / "build" / "spop-load"))
    ap.add_argument("--samples", default=str(rh.HAPROXY_DIR),
                    help="directory with haproxy.cfg, spoe-ratelimit.conf, tiers.map")
    ap.add_argument("--config", default=str(rh.REPO / "contrib" / "spoa-ratelimit.conf"),
                    help="agent configuration template (libconfig)")
    ap.add_argument("--attacks", default=",".join(ATTACKS),
                    help="comma-separated subset of: " + ",".join(ATTACKS))
    ap.add_argument("--flood-maxmemory-mb", type=int, default=8,
                    help="flood row: Redis maxmemory = used memory + this (8; 100k random"
                         " keys take ~16 MB when every one is stored)")
    ap.add_argument("--flood-bytes-per-address", type=int, default=65536,
                    help="flood row: allowed Redis growth per attacking address (65536)")
    ap.add_argument("--idle-conns", type=int, default=10000)
    ap.add_argument("--idle-rss-mb", type=int, default=64,
                    help="idle row: allowed agent RSS growth (64)")
    ap.add_argument("--time-limit", type=int, default=420, help="watchdog, seconds (420)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a row fails")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    rh.setup_stdout()

    args.agent = os.path.abspath(args.agent)
    args.load = os.path.abspath(args.load)
    for p in (args.agent, args.load):
        if not os.access(p, os.X_OK):
            print("%s not found: run `make` first" % p, file=sys.stderr)
            return 2
    for f in ("haproxy.cfg", "spoe-ratelimit.conf", "tiers.map"):
        if not os.path.isfile(os.path.join(args.samples, f)):
            print("%s has no %s" % (args.samples, f), file=sys.stderr)
            return 2
    keys = [k for k in args.attacks.split(",") if k]
    bad = [k for k in keys if k not in ROWS]
    if bad or not keys:
        print("unknown attack(s): %s (known: %s)" % (",".join(bad), ",".join(ATTACKS)),
              file=sys.stderr)
        return 2
    keys = [k for k in ATTACKS if k in keys]        # always in the canonical order

    # 10,000 idle connections need the descriptors (the agent inherits the limit)
    need = args.idle_conns + 2048
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), max(hard, need)))
    except (ValueError, OSError):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if "idle" in keys and nofile < need:
            args.idle_conns = max(100, nofile - 2048)
            print("note: file descriptor limit %d: idle row with %d connections" % (
                nofile, args.idle_conns))

    h = rh.Harness("rl-attack-", args.time_limit)
    h.keep = args.keep
    return rh.run_guarded(h, lambda: run(h, args, keys), lambda h: h.dump_logs(nlines=15))


def run(h, args, keys):
    t_start = time.monotonic()
    b = Bench(h, args)
    b.start()
    load = os.getloadavg()
    print("spoa-ratelimit under attack: 2 gateways (HAProxy %s + one agent each), one Redis "
          "%s, %d cores, load average %.1f" % (rh.haproxy_version(), b.redis_version,
                                               os.cpu_count() or 0, load[0]))
    print("agent %s; samples %s; agent config from %s (+ tiers victim, probe)" % (
        args.agent, args.samples, args.config))
    print("steady traffic in every row: victim key at %.0f/s (limit %d/s, burst %d), honest "
          "key at %.0f/s (tier pro), alternating gateways" % (
              VICTIM_SEND, VICTIM_RATE, VICTIM_BURST, HONEST_SEND))
    print()
    rows = []
    for k in keys:
        r = run_row(b, k)
        rows.append(r)
        print("  %-8s %-41s %s (%.0f s)" % (k, r["title"], "PASS" if r["passed"] else "FAIL",
                                            r["took"]))
        time.sleep(0.5)
    print()
    print_table(rows)
    print()
    print("details")
    for r in rows:
        print("  %-8s %s" % (r["key"], r["detail"]))
    print()
    print("victim adm/allowed: HTTP 200 / (burst + rate x span). degraded: the agents' "
          "spoa_ratelimit_degraded_total (all reasons).")
    print("unprot: answers our clients saw that let a request through unchecked (200 with "
          "X-RateLimit-Degraded or X-RateLimit-Agent-Error).")
    print("Timing rows (stall, sigstop, step) depend on the machine's load: load average "
          "%.1f at the start, %.1f at the end." % (load[0], os.getloadavg()[0]))
    print("done in %.0f s" % (time.monotonic() - t_start))
    if args.strict and not all(r["passed"] for r in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
