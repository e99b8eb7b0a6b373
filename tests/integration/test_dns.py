"""Host names in redis.address, resolved on the agent's loop (src/net/resolve.c, c-ares):
against a real DNS server on loopback (Debian's dnsmasq, on its own port, its records
in a hosts file the test rewrites and reloads with SIGHUP), real Redis servers on
127.0.0.1 and 127.0.0.2, and the agent's own SPOP answers.

- a name resolves and decisions are exact;
- the record moves to another address under load: the agent follows it within the
  TTL plus one reconnect, every NOTIFY answered meanwhile;
- a name that does not resolve: a clear error in the log, failure-ladder answers;
- a DNS server that never answers: the loop is not blocked (NOTIFYs answered on time
  while the lookup waits), where a blocking getaddrinfo() would stall every decision;
- the configuration accepts names and nameservers, and refuses garbage."""
import os
import shutil
import signal
import socket
import threading
import time

import pytest

import spop_client as sc
from conftest import (Redis, agent_config, check_config, free_port, key_principal, redis_cmd,
                      wait_port, wait_until)

DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
pytestmark = pytest.mark.skipif(not os.path.exists(DNSMASQ),
                                reason="dnsmasq not installed (make deps installs it)")


class Dns:
    """dnsmasq on 127.0.0.1:<port>, answering only from <tmp>/hosts (TTL <ttl> s)."""

    def __init__(self, procs, tmp, records, ttl=1):
        self.port = free_port()
        self.hosts = tmp / "dns-hosts"
        self.set(records, reload=False)
        self.proc = procs.spawn("dnsmasq", [
            DNSMASQ, "--no-daemon", "--conf-file=/dev/null", "--port=%d" % self.port,
            "--listen-address=127.0.0.1", "--bind-interfaces", "--no-resolv", "--no-hosts",
            "--addn-hosts=%s" % self.hosts, "--local-ttl=%d" % ttl, "--pid-file=",
            "--log-queries"]
            # as root it would switch to nobody, who cannot read the test's directory
            + (["--user=root"] if os.geteuid() == 0 else []))
        wait_until(lambda: "read %s" % self.hosts in self.proc.log_text(), 10, 0.05,
                   "dnsmasq up")

    def set(self, records, reload=True):
        """records: {name: [ip, ...]}; reload: SIGHUP dnsmasq (it re-reads the file)."""
        self.hosts.write_text("".join("%s %s\n" % (ip, name)
                                      for name, ips in records.items() for ip in ips))
        if reload:
            n = self.proc.log_text().count("read %s" % self.hosts)
            os.kill(self.proc.p.pid, signal.SIGHUP)
            wait_until(lambda: self.proc.log_text().count("read %s" % self.hosts) > n, 5,
                       0.02, "dnsmasq reloaded")

    @property
    def nameserver(self):
        return "127.0.0.1:%d" % self.port


class RedisOn(Redis):
    """A Redis on another loopback address (127.0.0.2), same harness as Redis."""

    def __init__(self, procs, tmp, host, port):
        self.host = host
        self.fixed_port = port
        super().__init__(procs, tmp)

    def argv(self):
        a = super().argv()
        a[a.index("--port") + 1] = str(self.port)
        a[a.index("--bind") + 1] = self.host
        return a

    def start(self):
        self.port = self.fixed_port
        if self.proc is None:
            self.proc = self.procs.spawn("redis-%s" % self.host, self.argv())
        else:
            self.proc.start()
        wait_port(self.host, self.port, 10, self.proc)

    def cmd(self, *args, timeout=2.0):
        return redis_cmd(self.port, *args, timeout=timeout, host=self.host)


def keys_in(r):
    """The limits' keys in Redis <r>, but the harness's readiness probe's (its API key is
    hashed into the key: wait_store() in conftest.py)."""
    probe = key_principal("__harness_probe__")
    return [k for k in r.cmd("KEYS", "rl:*") if probe not in k]


def decide(c, sid, key):
    return c.request(sid, 1, [sc.rl_message(key=key)])


def test_name_resolves_and_decisions_are_exact(procs, tmp, redis, agent):
    dns = Dns(procs, tmp, {"redis.test": ["127.0.0.1"]})
    a = agent(redis, redis_cfg={"address": "redis.test:%d" % redis.port,
                                "nameservers": [dns.nameserver]})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        verdicts = [decide(c, 2 * i + 1, "dns-exact") for i in range(7)]
    assert [v["allow"] for v in verdicts] == [1] * 5 + [0] * 2, verdicts
    assert not any(v.get("degraded") for v in verdicts)
    assert keys_in(redis)                                   # the counts live in Redis
    assert "redis.test" in dns.proc.log_text()              # asked our DNS server
    assert "redis redis.test:%d connected (127.0.0.1)" % redis.port in a.proc.log_text()


def test_a_moved_record_is_followed_under_load(procs, tmp, agent):
    """The name moves from 127.0.0.1 to 127.0.0.2 (same port) with a 1 s TTL while a
    client sends ~200 decisions/s: within the TTL plus one reconnect the decisions land
    in the second Redis, every NOTIFY is answered, and the first Redis gets no more."""
    port = free_port()
    r1 = RedisOn(procs, tmp, "127.0.0.1", port)
    r2 = RedisOn(procs, tmp, "127.0.0.2", port)
    dns = Dns(procs, tmp, {"redis.test": ["127.0.0.1"]}, ttl=1)
    a = agent(None, store="redis", redis_cfg={"address": "redis.test:%d" % port,
                                              "nameservers": [dns.nameserver]})
    answered, unanswered, stop = [], [], threading.Event()

    def load():
        with sc.SpopClient(a.addr, timeout=2) as c:
            c.hello()
            sid = 1
            while not stop.is_set():
                try:
                    answered.append((time.monotonic(), decide(c, sid, "move-%d" % sid)))
                except (OSError, RuntimeError) as e:
                    unanswered.append(e)
                sid += 2
                time.sleep(0.005)
    t = threading.Thread(target=load)
    t.start()
    try:
        wait_until(lambda: len(answered) > 50, 10, 0.05, "load running")
        assert keys_in(r1) and not keys_in(r2)
        dns.set({"redis.test": ["127.0.0.2"]})
        moved_at = time.monotonic()
        wait_until(lambda: keys_in(r2), 10, 0.05, "decisions in the second Redis")
        followed = time.monotonic() - moved_at
        r1_keys = len(keys_in(r1))
        n = len(answered)
        wait_until(lambda: len(answered) > n + 100, 10, 0.05, "load after the move")
    finally:
        stop.set()
        t.join(10)
    assert not unanswered, unanswered[:3]
    print("followed the move in %.2f s" % followed)
    # TTL 1 s (checked by the agent's 100 ms housekeeping tick) + one reconnect
    assert followed < 3.0, followed
    assert len(keys_in(r1)) == r1_keys                     # nothing more went there
    late = [v for at, v in answered if at > moved_at + followed + 0.5]
    assert late and not any(v.get("degraded") for v in late), late[:3]
    assert "no longer among its addresses" in a.proc.log_text()


def test_a_name_that_does_not_resolve(procs, tmp, agent):
    dns = Dns(procs, tmp, {"other.test": ["127.0.0.1"]})
    a = agent(None, store="redis", wait_redis=False,
              redis_cfg={"address": "nowhere.test:6379", "nameservers": [dns.nameserver]})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = decide(c, 1, "nx")
        assert v.get("degraded") == 1 and "allow" in v, v      # the failure ladder
    wait_until(lambda: "redis nowhere.test:6379 down: cannot resolve nowhere.test:6379: "
               in a.proc.log_text(), 5, 0.05, "resolve error logged")
    assert a.alive()


def test_a_silent_dns_server_does_not_block_the_loop(procs, tmp, agent):
    """The nameserver is a UDP socket that reads queries and never answers: the lookup
    waits (2 s a try here), and meanwhile every NOTIFY is answered at once (degraded:
    Redis is not reachable yet). A blocking resolver would hold each one for seconds."""
    hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hole.bind(("127.0.0.1", 0))
    queries = []
    stop = threading.Event()

    def swallow():
        hole.settimeout(0.1)
        while not stop.is_set():
            try:
                queries.append(hole.recvfrom(4096))
            except socket.timeout:
                pass
    t = threading.Thread(target=swallow)
    t.start()
    try:
        a = agent(None, store="redis", wait_redis=False,
                  redis_cfg={"address": "slow.test:6379", "connect_timeout_ms": 5000,
                             "resolve_timeout_ms": 2000,
                             "nameservers": ["127.0.0.1:%d" % hole.getsockname()[1]]})
        wait_until(lambda: queries, 5, 0.02, "a DNS query sent")
        worst = 0.0
        with sc.SpopClient(a.addr) as c:
            c.hello()
            for i in range(40):
                t0 = time.monotonic()
                v = decide(c, 2 * i + 1, "silent-%d" % i)
                worst = max(worst, time.monotonic() - t0)
                assert "allow" in v, v
                time.sleep(0.02)
        assert worst < 0.25, worst              # a blocked loop: ~2 s
        assert a.alive()
    finally:
        stop.set()
        t.join(5)
        hole.close()


@pytest.mark.parametrize("redis_cfg, ok", [
    ({"address": "redis.example.com:6379"}, True),
    ({"address": "redis-1.internal:6380", "nameservers": ["10.0.0.2", "[::1]:5353"]}, True),
    ({"address": "redis.test:6379", "nameservers": "127.0.0.1:53"}, True),
    ({"address": "bad_host!:6379"}, False),
    ({"address": "-lead.example:6379"}, False),
    ({"address": "[redis.test]:6379"}, False),
    ({"address": "redis.test:6379", "nameservers": ["dns.example"]}, False),
    ({"address": "redis.test:6379", "nameservers": ["127.0.0.1,127.0.0.2"]}, False),
])
def test_config_names_and_nameservers(tmp, redis_cfg, ok):
    cfg = agent_config("127.0.0.1:1", "127.0.0.1:6379")
    cfg["redis"].update(redis_cfg)
    r = check_config(tmp, cfg)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    if not ok:
        assert "redis" in r.stderr and ("address" in r.stderr or "nameservers" in r.stderr)


def test_numeric_addresses_run_no_resolver(redis, agent):
    """A numeric address is dialled as it is: no c-ares socket, no lookup logged."""
    a = agent(redis)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert decide(c, 1, "numeric")["allow"] == 1
    assert "resolve" not in a.proc.log_text()
    assert "redis 127.0.0.1:%d connected, script" % redis.port in a.proc.log_text()

