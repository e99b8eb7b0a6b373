"""Redis Sentinel (redis.sentinel): real `redis-server --sentinel` processes (three), a
master and a replica, the agent finding the master through them.

- the master found by asking the Sentinels (a dead one in the list is passed over),
  confirmed with ROLE; decisions exact;
- the master killed (SIGKILL) under 2,000 decisions/s: every NOTIFY answered (the failure
  ladder meanwhile), exact decisions again within 2 s of the Sentinels' +switch-master,
  and the increments the old master acknowledged but never replicated measured;
- the configuration's forms and errors.

The failover timeline and the lost increments are printed (pytest -s) for the docs."""
import os
import re
import socket
import subprocess
import threading
import time

import pytest

import spop_client as sc
from conftest import (REDIS_BIN, SPOA_BIN, _resp_read, agent_config, check_config, free_port,
                      redis_cmd, spawn_redis, wait_until)

MASTER = "rlmaster"
LIMITS = {"big": {"rate": 1000000, "period": "1d", "algorithm": "fixed_window"}, "anon_rpm": {"rate": 3, "period": "1m"}}
TIERS = {"free": {"limits": ["big"]}}
LOAD = os.environ.get("SPOP_LOAD") or str(SPOA_BIN.parent / "spop-load")


class Cluster:
    """A master, a replica and three Sentinels (quorum 2, down after 1 s)."""

    def __init__(self, procs, tmp, sentinel_pass=None):
        self.procs = procs
        self.sentinel_pass = sentinel_pass
        self.master, self.master_port = self.server("master")
        self.replica, self.replica_port = self.server(
            "replica", "--replicaof", "127.0.0.1", str(self.master_port))
        self.sentinels = []
        self.sentinel_ports = []
        for i in range(3):
            d = tmp / ("sentinel-%d" % i)
            d.mkdir()
            conf = d / "sentinel.conf"

            def argv(port, d=d, conf=conf):
                conf.write_text(
                    "port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\nprotected-mode no\n"
                    "sentinel monitor %s 127.0.0.1 %d 2\n"
                    "sentinel down-after-milliseconds %s 1000\n"
                    "sentinel failover-timeout %s 10000\n"
                    "sentinel parallel-syncs %s 1\n"
                    % (port, d, MASTER, self.master_port, MASTER, MASTER, MASTER)
                    + ("requirepass %s\n" % sentinel_pass if sentinel_pass else ""))
                return [REDIS_BIN, str(conf), "--sentinel"]
            p, port = spawn_redis(procs, "sentinel-%d" % i, argv, password=sentinel_pass)
            self.sentinels.append(p)
            self.sentinel_ports.append(port)
        wait_until(self.settled, 30, 0.2, "Sentinels know each other and the replica",
                   diagnose=self.diagnose)

    def server(self, name, *extra):
        d = self.procs.tmp / name
        d.mkdir(exist_ok=True)
        return spawn_redis(self.procs, name, lambda port: [
            REDIS_BIN, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(d), "--protected-mode", "no"] + list(extra))

    def diagnose(self):
        """What each Sentinel knows, for the message of a cluster that did not settle."""
        out = []
        for p, port in zip(self.sentinels, self.sentinel_ports):
            try:
                m = self.sentinel_master(port)
                out.append("%s :%d alive=%s other-sentinels=%s slaves=%s flags=%s" % (
                    p.name, port, p.alive(), m.get("num-other-sentinels"),
                    m.get("num-slaves"), m.get("flags")))
            except (OSError, ValueError, TypeError) as e:
                out.append("%s :%d alive=%s: %s" % (p.name, port, p.alive(), e))
        return "; ".join(out)

    def sentinel_cmd(self, port, *args):
        if not self.sentinel_pass:
            return redis_cmd(port, *args)
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            f = s.makefile("rb")
            for cmd in (("AUTH", self.sentinel_pass), args):
                s.sendall(b"*%d\r\n" % len(cmd) + b"".join(
                    b"$%d\r\n%s\r\n" % (len(str(a)), str(a).encode()) for a in cmd))
                out = _resp_read(f)
            return out

    def sentinel_master(self, port):
        flat = self.sentinel_cmd(port, "SENTINEL", "master", MASTER)
        return dict(zip(flat[::2], flat[1::2]))

    def settled(self):
        try:
            if "master_link_status:up" not in redis_cmd(self.replica_port, "INFO",
                                                         "replication"):
                return False
            return all(int(self.sentinel_master(p)["num-other-sentinels"]) == 2 and
                       int(self.sentinel_master(p)["num-slaves"]) == 1
                       for p in self.sentinel_ports)
        except (OSError, KeyError, ValueError):
            return False

    def addresses(self, dead_first=True):
        out = ["127.0.0.1:%d" % p for p in self.sentinel_ports]
        return (["127.0.0.1:%d" % free_port()] if dead_first else []) + out


def agent_with_sentinel(procs, tmp, agent_bin, cl, name="agent", **sentinel):
    from conftest import Agent
    port = free_port()
    cfg = agent_config("127.0.0.1:%d" % port, "127.0.0.1:1", limits=LIMITS, tiers=TIERS)
    cfg["redis"].pop("address")
    cfg["redis"].update({"sentinel": dict({"addresses": cl.addresses(), "master": MASTER},
                                          **sentinel),
                         "connect_timeout_ms": 300})
    return Agent(procs, tmp, cfg, name=name)


def remaining(v):
    return int(v["remaining"])


def test_master_found_through_the_sentinels(procs, tmp, agent_bin):
    cl = Cluster(procs, tmp)
    a = agent_with_sentinel(procs, tmp, agent_bin, cl)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        vs = [c.request(2 * i + 1, 1, [sc.rl_message(key="sn-exact")]) for i in range(5)]
    assert all(v["allow"] == 1 and not v.get("degraded") for v in vs), vs
    assert [remaining(v) for v in vs] == list(range(999999, 999994, -1)), vs
    log = a.proc.log_text()
    assert "redis master %s connected (127.0.0.1:%d)" % (MASTER, cl.master_port) in log, log
    # the dead Sentinel listed first was passed over, the master's keys are on the master
    assert redis_cmd(cl.master_port, "DBSIZE") >= 1
    # `ctl` finds the master through the Sentinels too: a block reaches the agent
    from test_overrides import ctl_ok
    ctl_ok(a, "block", "key:sn-blocked", "--for", "10m")
    assert any(k.endswith("overrides") or "ovr" in k
               for k in redis_cmd(cl.master_port, "KEYS", "*")), "no overrides hash"
    with sc.SpopClient(a.addr) as c:
        c.hello()
        wait_until(lambda: c.request(101, 1, [sc.rl_message(key="sn-blocked")])["allow"] == 0,
                   5, 0.1, "the block applied")


def test_sentinels_with_a_password_file(procs, tmp, agent_bin):
    """Sentinels that require a password: read from redis.sentinel.password_file (0600);
    without it every Sentinel refuses (NOAUTH) and the agent says so."""
    cl = Cluster(procs, tmp, sentinel_pass="sn-secret")
    pw = tmp / "sentinel-password"
    pw.write_text("sn-secret\n")
    pw.chmod(0o600)
    a = agent_with_sentinel(procs, tmp, agent_bin, cl, password_file=str(pw))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="sn-auth")])
    assert v["allow"] == 1 and not v.get("degraded"), v
    from conftest import Agent
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1", limits=LIMITS, tiers=TIERS)
    cfg["redis"].pop("address")
    cfg["redis"]["sentinel"] = {"addresses": cl.addresses(dead_first=False), "master": MASTER}
    b = Agent(procs, tmp, cfg, name="noauth", wait_redis=False)
    wait_until(lambda: "no Sentinel answered" in b.proc.log_text(), 10, 0.1, "NOAUTH logged")
    assert "NOAUTH" in b.proc.log_text() or "Authentication" in b.proc.log_text()


def test_failover_under_load(procs, tmp, agent_bin):
    """SIGKILL the master while spop-load sends 2,000 decisions/s; a probe client sends
    one decision every 5 ms for one key and records each answer's time and kind."""
    cl = Cluster(procs, tmp)
    a = agent_with_sentinel(procs, tmp, agent_bin, cl)
    switch_at = []

    def watch_switch():
        s = socket.create_connection(("127.0.0.1", cl.sentinel_ports[0]), timeout=60)
        s.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$14\r\n+switch-master\r\n")
        buf = b""
        while not switch_at:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
            if b"message" in buf and MASTER.encode() in buf.split(b"message", 1)[1]:
                switch_at.append(time.monotonic())
        s.close()
    watcher = threading.Thread(target=watch_switch, daemon=True)
    watcher.start()

    probe, sent, stop = [], [], threading.Event()

    def prober():
        with sc.SpopClient(a.addr, timeout=5) as c:
            c.hello()
            sid = 1
            while not stop.is_set():
                t = time.monotonic()
                v = c.request(sid, 1, [sc.rl_message(key="sn-probe")])
                sent.append(t)
                probe.append((time.monotonic(), v))
                sid += 2
                time.sleep(0.005)
    pt = threading.Thread(target=prober)
    pt.start()
    load = subprocess.Popen([LOAD, "-a", "127.0.0.1:%d" % a.addr[1], "-r", "2000", "-d", "12",
                             "-c", "2", "-p", "32", "-k", "1000", "-K", "sn-load-"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.5)
        acked_before = [v for _, v in probe if v.get("allow") == 1 and not v.get("degraded")]
        killed_at = time.monotonic()
        cl.master.p.kill()
        wait_until(lambda: switch_at, 30, 0.05, "+switch-master")
        wait_until(lambda: any(t > switch_at[0] and not v.get("degraded") for t, v in probe),
                   15, 0.05, "an exact decision after the switch")
        time.sleep(1.0)
    finally:
        stop.set()
        pt.join(10)
        out, _ = load.communicate(timeout=30)
    first_exact = min(t for t, v in probe if t > switch_at[0] and not v.get("degraded"))
    degraded = [t for t, v in probe if v.get("degraded")]
    print("\nfailover: killed at 0.000 s; first degraded answer %+.3f s; +switch-master "
          "%+.3f s; first exact decision %+.3f s (%.3f s after the switch); last degraded "
          "%+.3f s; probe answers %d, degraded %d" % (
              (min(degraded) - killed_at) if degraded else float("nan"),
              switch_at[0] - killed_at, first_exact - killed_at, first_exact - switch_at[0],
              (max(degraded) - killed_at) if degraded else float("nan"), len(probe),
              len(degraded)))
    print("spop-load:", out.strip())
    m = re.search(r"unanswered=(\d+)", out)
    assert m and int(m.group(1)) == 0, out                  # every NOTIFY answered
    assert first_exact - switch_at[0] < 2.0
    # increments acknowledged by the old master and never replicated: the probe key's
    # count on the new master against the probe's exact admissions before the kill
    after = [v for t, v in probe if t >= first_exact and not v.get("degraded")]
    exact_before = len([1 for t, v in probe if t < killed_at and v.get("allow") == 1 and
                        not v.get("degraded")])
    consumed_new = 1000000 - remaining(after[0])            # includes after[0] itself
    lost = exact_before + 1 - consumed_new
    exact_between = len([1 for t, v in probe if killed_at <= t < first_exact and
                         not v.get("degraded")])
    # the probe's request in flight at the kill may have been counted by the old master
    # (and replicated) and still be answered degraded: the connection died before its reply
    in_flight = len([1 for (t, v), t0 in zip(probe, sent) if t0 < killed_at <= t and
                     v.get("degraded")])
    print("increments lost in the failover: %d of %d acknowledged before the kill "
          "(+%d exact between kill and switch, +%d degraded in flight at the kill)" % (
              lost, exact_before, exact_between, in_flight))
    assert acked_before and lost >= -(exact_between + in_flight)
    log = a.proc.log_text()
    assert "+switch-master %s" % MASTER in log, log[-3000:]
    new_port = cl.replica_port
    assert "redis master %s connected (127.0.0.1:%d)" % (MASTER, new_port) in log


@pytest.mark.parametrize("sentinel, extra, ok, msg", [
    ({"addresses": ["127.0.0.1:26379"], "master": "m"}, {}, True, None),
    ({"addresses": ["127.0.0.1:26379", "[::1]:26380"], "master": "m", "password": "x"}, {},
     True, None),
    ({"addresses": [], "master": "m"}, {}, False, "addresses"),
    ({"addresses": ["sentinel.example:26379"], "master": "m"}, {}, True, None),
    ({"addresses": ["bad_name!:26379"], "master": "m"}, {}, False, "addresses"),
    ({"addresses": ["[sentinel.example]:26379"], "master": "m"}, {}, False, "addresses"),
    ({"addresses": ["127.0.0.1:26379"]}, {}, False, "master"),
    ({"addresses": ["127.0.0.1:26379"], "master": "m"}, {"address": "127.0.0.1:6379"}, False,
     "address"),
    ({"addresses": ["127.0.0.1:26379"], "master": "m", "bogus": 1}, {}, False, "bogus"),
])
def test_config(tmp, sentinel, extra, ok, msg):
    cfg = agent_config("127.0.0.1:1", "127.0.0.1:6379")
    cfg["redis"].pop("address")
    cfg["redis"]["sentinel"] = sentinel
    cfg["redis"].update(extra)
    r = check_config(tmp, cfg)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    if msg:
        assert "sentinel" in r.stderr and msg in r.stderr, r.stderr


def test_sentinels_by_host_name(procs, tmp, agent_bin):
    """Sentinels named by DNS name (resolved on the agent's loop, here by a DNS server of the
    test's): the master found through them, decisions exact; `ctl` resolves them too. A
    name that does not resolve is passed over like a Sentinel that is down."""
    from conftest import Agent
    from test_dns import Dns
    cl = Cluster(procs, tmp)
    dns = Dns(procs, tmp, {"sentinel-%d.test" % i: ["127.0.0.1"] for i in range(3)})
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1", limits=LIMITS, tiers=TIERS)
    cfg["redis"].pop("address")
    cfg["redis"].update({
        "sentinel": {"addresses": ["nowhere.test:%d" % free_port()] +
                     ["sentinel-%d.test:%d" % (i, p) for i, p in enumerate(cl.sentinel_ports)],
                     "master": MASTER},
        "nameservers": [dns.nameserver], "connect_timeout_ms": 300})
    a = Agent(procs, tmp, cfg, name="agent-names")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        vs = [c.request(2 * i + 1, 1, [sc.rl_message(key="sn-names")]) for i in range(5)]
    assert all(v["allow"] == 1 and not v.get("degraded") for v in vs), vs
    assert [remaining(v) for v in vs] == list(range(999999, 999994, -1)), vs
    log = a.proc.log_text()
    assert "redis master %s connected (127.0.0.1:%d)" % (MASTER, cl.master_port) in log, log
    assert "nowhere.test" in log, log       # the name that does not resolve, said so


def test_a_sentinel_name_with_a_dead_address_is_tried_at_each_address(procs, tmp, agent_bin):
    """One Sentinel given by a name with two addresses, one where nothing listens
    (127.0.0.2): the agent dials the name's addresses in turn and finds the master through
    the other (it used to dial the first address only, every time)."""
    from conftest import Agent
    from test_dns import Dns
    cl = Cluster(procs, tmp)
    dns = Dns(procs, tmp, {"sentinels.test": ["127.0.0.2", "127.0.0.1"]})
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1", limits=LIMITS, tiers=TIERS)
    cfg["redis"].pop("address")
    cfg["redis"].update({
        "sentinel": {"addresses": ["sentinels.test:%d" % cl.sentinel_ports[0]],
                     "master": MASTER},
        "nameservers": [dns.nameserver], "connect_timeout_ms": 300})
    a = Agent(procs, tmp, cfg, name="agent-two-addresses")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="sn-two")])
    assert v["allow"] == 1 and not v.get("degraded"), v
    assert "redis master %s connected (127.0.0.1:%d)" % (MASTER, cl.master_port) \
        in a.proc.log_text()
