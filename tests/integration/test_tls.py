"""TLS to Redis (src/store/rconn.c, src/net/tls.c): a redis-server with --tls-port and a CA and
certificates made by the test with the openssl command. Decisions are exact over TLS; a
wrong CA, a wrong name or an expired certificate is logged with the reason, answered by the
ladder (degraded), never crashes the agent, and is recovered from once the server (or the
configuration, on reload) is fixed; mutual TLS; a TLS Cluster of 3 masters; the
configuration's checks of the TLS files.

Each Redis also listens in clear text on another port: the test reads Redis's state there,
the agent is only ever given the TLS port."""

import os
import shutil
import subprocess

import pytest

import spop_client as sc
from conftest import (REDIS_BIN, SPOA_BIN, Redis, agent_config, agent_env, free_port,
                      to_libconfig, wait_port, wait_until)
from test_cluster import RedisCluster, allowed_degraded, key_slot, principal_tag
from test_dns import Dns

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl command not installed")


def openssl(*args, cwd):
    r = subprocess.run([OPENSSL] + [str(a) for a in args], cwd=cwd, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (args, r.stdout, r.stderr)


class PKI:
    """A CA in <dir> and certificates it signs (EC P-256 keys: quick to make)."""

    def __init__(self, dir, name):
        self.dir = dir / name
        self.dir.mkdir()
        self.name = name
        self.ca_key, self.ca_crt = self.dir / "ca.key", self.dir / "ca.crt"
        (self.dir / "index.txt").write_text("")
        (self.dir / "serial").write_text("01\n")
        # the extensions strict verifiers insist on (Python 3.13's default context sets
        # VERIFY_X509_STRICT): key identifiers, key usages, critical basic constraints
        (self.dir / "ca.cnf").write_text(
            "[req]\ndistinguished_name = dn\n[dn]\n"
            "[ca]\ndefault_ca = d\n[d]\ndatabase = %s/index.txt\nnew_certs_dir = %s\n"
            "serial = %s/serial\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
            "[p]\ncommonName = supplied\n"
            "[v3ca]\nbasicConstraints = critical,CA:TRUE\n"
            "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
            "[ext]\nsubjectAltName = $ENV::SAN\nbasicConstraints = critical,CA:FALSE\n"
            "keyUsage = critical,digitalSignature\n"
            "extendedKeyUsage = serverAuth,clientAuth\nsubjectKeyIdentifier = hash\n"
            "authorityKeyIdentifier = keyid\n"
            % (self.dir, self.dir, self.dir))
        r = subprocess.run([OPENSSL, "req", "-x509", "-config", self.dir / "ca.cnf",
                            "-extensions", "v3ca", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:P-256", "-nodes", "-keyout", self.ca_key,
                            "-out", self.ca_crt, "-days", "3", "-subj",
                            "/CN=%s test CA" % name], cwd=self.dir, capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, SAN="DNS:unused"))
        assert r.returncode == 0, r.stderr

    def issue(self, name, san="DNS:redis.test,DNS:localhost,IP:127.0.0.1", start=None,
              end=None, days=3):
        """A key and a certificate for <name>: (crt, key) paths. <start>/<end> as
        YYYYMMDDHHMMSSZ make one outside its validity (an expired one)."""
        key, csr, crt = (self.dir / ("%s.%s" % (name, x)) for x in ("key", "csr", "crt"))
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", key, "-out", csr, "-subj", "/CN=%s" % name, cwd=self.dir)
        when = ["-startdate", start, "-enddate", end] if start else ["-days", str(days)]
        env = dict(os.environ, SAN=san)
        r = subprocess.run([OPENSSL, "ca", "-batch", "-notext", "-config", self.dir / "ca.cnf",
                            "-cert", self.ca_crt, "-keyfile", self.ca_key, "-extensions",
                            "ext", "-in", csr, "-out", crt] + when,
                           cwd=self.dir, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        os.chmod(key, 0o600)
        return crt, key


class TLSRedis(Redis):
    """A redis-server with a TLS port (given to the agent) and a clear one (for the test)."""

    def __init__(self, procs, tmp, crt, key, ca, clients="no"):
        self.tls_port = free_port()
        self.crt, self.key, self.ca, self.clients = crt, key, ca, clients
        super().__init__(procs, tmp)

    def argv(self):
        return super().argv() + ["--tls-port", str(self.tls_port), "--tls-cert-file",
                                  str(self.crt), "--tls-key-file", str(self.key),
                                  "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients",
                                  self.clients]

    def start(self):
        super().start()
        wait_port("127.0.0.1", self.tls_port, 10, self.proc)

    def serve(self, crt, key):
        """Restarted with another certificate."""
        self.stop()
        self.crt, self.key = crt, key
        self.proc.argv = [str(a) for a in self.argv()]
        self.start()

    @property
    def address(self):
        return "127.0.0.1:%d" % self.tls_port


@pytest.fixture
def pki(tmp):
    return PKI(tmp, "good")


def decide(a, key, n, sid0=1):
    """<n> decisions of <key> over SPOP: [(allow, degraded)]."""
    out = []
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(n):
            v = c.request(sid0 + 2 * i, 1, [sc.rl_message(key=key)])
            out.append((v["allow"], "degraded" in v))
    return out


EXACT = [(1, False)] * 5 + [(0, False)]


def tls_agent(agent, redis, wait_redis=True, **tls):
    return agent(redis=redis, redis_cfg={"tls": tls}, wait_redis=wait_redis)


def test_tls_decisions_exact(agent, procs, tmp, pki):
    """Server-authenticated TLS to 127.0.0.1 (the certificate's IP address is verified):
    exact decisions, the state in Redis; the log says the connection is up; `ctl` writes an
    override over TLS too."""
    crt, key = pki.issue("redis")
    r = TLSRedis(procs, tmp, crt, key, pki.ca_crt)
    a = tls_agent(agent, r, ca_file=str(pki.ca_crt))
    assert decide(a, "tls-a", 6) == EXACT
    assert r.cmd("DBSIZE") >= 1
    assert "redis %s connected" % r.address in a.proc.log_text()
    # `ctl` speaks TLS with the same settings: a block written through it reaches the agent
    from test_overrides import ctl_ok
    ctl_ok(a, "block", "key:tls-blocked", "--for", "10m")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        wait_until(lambda: c.request(301, 1, [sc.rl_message(key="tls-blocked")])["allow"] == 0,
                   5, 0.1, "the block applied")


def test_tls_by_name_and_sni(agent, procs, tmp, pki):
    """A host name (resolved on the loop, here by a DNS server of the test's) is the name
    sent (SNI) and verified; TLS 1.3 as the floor."""
    crt, key = pki.issue("redis", san="DNS:redis.test")
    r = TLSRedis(procs, tmp, crt, key, pki.ca_crt)
    dns = Dns(procs, tmp, {"redis.test": ["127.0.0.1"]})
    a = agent(redis=None, store="redis", redis_cfg={
        "address": "redis.test:%d" % r.tls_port, "nameservers": [dns.nameserver],
        "tls": {"ca_file": str(pki.ca_crt), "min_version": "1.3"}})
    a.wait_store()
    assert decide(a, "tls-n", 6) == EXACT


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_name", "expired"])
def test_tls_refused_then_fixed(agent, procs, tmp, pki, case):
    """The server's certificate fails verification: the reason in the log, every request
    answered by the ladder (degraded, never a crash); fixed (the server's certificate, or
    the expected name on reload), decisions are exact again."""
    good = pki.issue("redis")
    if case == "wrong_ca":
        bad = PKI(tmp, "other").issue("redis")
        why = "unable to get local issuer certificate"
    elif case == "wrong_name":
        bad = pki.issue("elsewhere", san="DNS:elsewhere.test,IP:10.9.9.9")
        why = "IP address mismatch"
    else:
        bad = pki.issue("old", start="20200101000000Z", end="20200102000000Z")
        why = "certificate has expired"
    r = TLSRedis(procs, tmp, *bad, pki.ca_crt)
    a = tls_agent(agent, r, wait_redis=False, ca_file=str(pki.ca_crt))
    wait_until(lambda: why in a.proc.log_text(), 10, what="the verification failure logged")
    assert "certificate verify failed: " + why in a.proc.log_text()
    answers = decide(a, "tls-bad", 5)
    assert all(d for _, d in answers), answers
    assert a.alive()
    assert r.cmd("DBSIZE") == 0
    r.serve(*good)
    a.wait_store(timeout=15)
    assert decide(a, "tls-fixed", 6, sid0=101) == EXACT


def test_tls_server_name_fixed_on_reload(agent, procs, tmp, pki):
    """tls.server_name names what the certificate must carry: a wrong one fails (hostname
    mismatch), a reload with the right one is used by the next connection."""
    crt, key = pki.issue("redis", san="DNS:redis.test")
    r = TLSRedis(procs, tmp, crt, key, pki.ca_crt)
    a = tls_agent(agent, r, wait_redis=False, ca_file=str(pki.ca_crt),
                  server_name="wrong.test")
    wait_until(lambda: "hostname mismatch" in a.proc.log_text(), 10, what="mismatch logged")
    cfg = dict(a.cfg)
    cfg["redis"] = dict(cfg["redis"], tls={"ca_file": str(pki.ca_crt),
                                            "server_name": "redis.test"})
    a.reload(to_libconfig(cfg))
    a.wait_store(timeout=15)
    assert decide(a, "tls-sni", 6) == EXACT


def test_mutual_tls(agent, procs, tmp, pki):
    """A Redis that requires client certificates: without one the agent is refused (the
    reason logged, ladder answers); with cert_file and key_file, exact decisions."""
    crt, key = pki.issue("redis")
    r = TLSRedis(procs, tmp, crt, key, pki.ca_crt, clients="yes")
    a = tls_agent(agent, r, wait_redis=False, ca_file=str(pki.ca_crt))
    wait_until(lambda: "redis %s" % r.address in a.proc.log_text() and
               "connect" in a.proc.log_text(), 10, what="refusal logged")
    assert all(d for _, d in decide(a, "mtls-no", 3))
    a.stop()
    ccrt, ckey = pki.issue("agent", san="DNS:agent.test")
    b = tls_agent(agent, r, ca_file=str(pki.ca_crt), cert_file=str(ccrt),
                  key_file=str(ckey))
    assert decide(b, "mtls", 6) == EXACT


def check(tmp, tls, name="agent.conf"):
    """`-c` on a configuration with redis.tls = <tls>: CompletedProcess."""
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:6379")
    cfg["redis"]["tls"] = tls
    p = tmp / name
    p.write_text(to_libconfig(cfg))
    return subprocess.run([str(SPOA_BIN), "-c", "-f", str(p)], capture_output=True, text=True,
                          timeout=20, env=agent_env())


def test_tls_configuration_checks(agent_bin, tmp, pki):
    """What the configuration refuses, with the reason: a key others can read, a key that
    is not the certificate's, a missing CA file, a bad protocol floor, a certificate
    without its key, unknown keys; a good one passes."""
    crt, key = pki.issue("client")
    crt2, key2 = pki.issue("client2")
    ok = check(tmp, {"ca_file": str(pki.ca_crt), "cert_file": str(crt), "key_file": str(key)})
    assert ok.returncode == 0, ok.stderr
    os.chmod(key, 0o644)
    r = check(tmp, {"ca_file": str(pki.ca_crt), "cert_file": str(crt), "key_file": str(key)})
    assert r.returncode == 1 and "is readable by others" in r.stderr, r.stderr
    os.chmod(key, 0o600)
    cases = [
        ({"cert_file": str(crt), "key_file": str(key2)}, "does not match cert_file"),
        ({"ca_file": str(tmp / "nope.crt")},
         "redis.tls: CA file %s: No such file or directory" % (tmp / "nope.crt")),
        ({"min_version": "1.1"}, "min_version \"1.1\": \"1.2\" or \"1.3\""),
        ({"cert_file": str(crt)}, "cert_file and key_file go together"),
        ({"ca_fle": "x"}, "ca_fle"),
        ({"server_name": "bad name!"}, "redis.tls.server_name 'bad name!'"),
    ]
    for tls, msg in cases:
        r = check(tmp, tls)
        assert r.returncode == 1 and msg in r.stderr, (tls, r.stderr)


def test_tls_cluster_of_three_masters(agent, procs, tmp, pki):
    """A Cluster whose nodes speak TLS to clients and to each other (tls-cluster yes): the
    agent, given one node's TLS port, finds the 3 masters at their TLS ports (CLUSTER
    SLOTS over TLS announces them) and decides exactly on each."""
    crt, key = pki.issue("node")
    tls_ports = {}

    def extra(node_port):
        tls_ports[node_port] = free_port()
        return ["--tls-port", str(tls_ports[node_port]), "--tls-cert-file", str(crt),
                "--tls-key-file", str(key), "--tls-ca-cert-file", str(pki.ca_crt),
                "--tls-auth-clients", "no", "--tls-cluster", "yes",
                "--tls-replication", "yes"]
    cl = RedisCluster(procs, tmp, masters=3, replicas=0, extra_args=extra)
    seed = cl.masters()[0]
    a = agent(redis=None, store="redis", log_level="debug", redis_cfg={
        "address": "127.0.0.1:%d" % tls_ports[seed.port],
        "tls": {"ca_file": str(pki.ca_crt)}})
    a.wait_store()
    keys = ["tls-acct-%d" % i for i in range(30)]
    owners = {cl.owner(key_slot(principal_tag(k))).port for k in keys}
    assert len(owners) == 3
    got = {}
    with sc.SpopClient(a.addr, timeout=10) as c:
        c.hello()
        sid = 1
        for k in keys:
            for _ in range(6):
                v = c.request(sid, 1, [sc.rl_message(key=k)])
                got.setdefault(k, []).append(v)
                sid += 2
    for k in keys:
        assert allowed_degraded(got[k]) == (5, 0), (k, got[k])
    log = a.proc.log_text()
    for m in cl.masters():
        assert "redis 127.0.0.1:%d connected" % tls_ports[m.port] in log, log[-3000:]


def tls_cmd(port, ca, *args, timeout=2.0):
    """One command over TLS (the CA verifies the server; its name is not checked here)."""
    import socket
    import ssl
    from conftest import _resp_read
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        with ctx.wrap_socket(raw) as s:
            s.sendall(b"*%d\r\n" % len(args) + b"".join(
                b"$%d\r\n%s\r\n" % (len(str(a)), str(a).encode()) for a in args))
            return _resp_read(s.makefile("rb"))


class TLSSentinels:
    """A master, a replica and three Sentinels speaking TLS only (port 0): replication,
    the Sentinels' links and their clients all over TLS."""

    def __init__(self, procs, tmp, pki, master="rltls", by_name=False):
        """<by_name>: the Sentinels monitor the master as "localhost" and answer with that
        name (resolve-hostnames, announce-hostnames), and the master's and replica's
        certificate names only it (no IP address): a client must verify the name."""
        from conftest import free_ports
        self.procs, self.pki, self.name = procs, pki, master
        self.crt, self.key = pki.issue("node")
        self.by_name = by_name
        self.node_crt, self.node_key = pki.issue("node-by-name", san="DNS:localhost") \
            if by_name else (self.crt, self.key)
        # one call: ports from two calls may coincide
        ports = free_ports(5)
        self.master_port, self.replica_port = ports[:2]
        self.sentinel_ports = ports[2:]
        self.master = self.server("master", self.master_port)
        self.replica = self.server("replica", self.replica_port, "--replicaof", "127.0.0.1",
                                   str(self.master_port))
        for i, port in enumerate(self.sentinel_ports):
            d = tmp / ("tls-sentinel-%d" % i)
            d.mkdir()
            conf = d / "sentinel.conf"
            conf.write_text(
                "port 0\ntls-port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\n"
                "protected-mode no\ntls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n"
                "tls-auth-clients no\ntls-replication yes\n"
                "%s"
                "sentinel monitor %s %s %d 2\n"
                "sentinel down-after-milliseconds %s 1000\n"
                "sentinel failover-timeout %s 10000\n"
                % (port, d, self.crt, self.key, pki.ca_crt,
                   "sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n"
                   if by_name else "", master, "localhost" if by_name else "127.0.0.1",
                   self.master_port, master, master))
            p = procs.spawn("tls-sentinel-%d" % i, [REDIS_BIN, str(conf), "--sentinel"])
            wait_port("127.0.0.1", port, 10, p)
        wait_until(self.settled, 30, 0.2, "Sentinels know each other and the replica")

    def server(self, name, port, *extra):
        d = self.procs.tmp / ("tls-" + name)
        d.mkdir(exist_ok=True)
        # by name: "localhost" may resolve to ::1 too (optional: "-::1")
        bind = ["127.0.0.1", "-::1"] if self.by_name else ["127.0.0.1"]
        p = self.procs.spawn("tls-" + name, [
            REDIS_BIN, "--port", "0", "--tls-port", str(port), "--bind"] + bind + [
            "--save", "", "--appendonly", "no", "--dir", str(d), "--protected-mode", "no",
            "--tls-cert-file", str(self.node_crt), "--tls-key-file", str(self.node_key),
            "--tls-ca-cert-file", str(self.pki.ca_crt), "--tls-auth-clients", "no",
            "--tls-replication", "yes"] + list(extra))
        wait_port("127.0.0.1", port, 10, p)
        return p

    def cmd(self, port, *args):
        return tls_cmd(port, self.pki.ca_crt, *args)

    def settled(self):
        try:
            if "master_link_status:up" not in self.cmd(self.replica_port, "INFO",
                                                        "replication"):
                return False
            for p in self.sentinel_ports:
                flat = self.cmd(p, "SENTINEL", "master", self.name)
                m = dict(zip(flat[::2], flat[1::2]))
                if int(m["num-other-sentinels"]) != 2 or int(m["num-slaves"]) != 1:
                    return False
            return True
        except (OSError, KeyError, ValueError, RuntimeError):
            return False


def agent_on_tls_sentinels(procs, tmp, pki, cl, name):
    """An agent finding <cl>'s master through its Sentinels, everything over TLS."""
    from conftest import Agent
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1")
    cfg["redis"].pop("address")
    cfg["redis"].update({
        "sentinel": {"addresses": ["127.0.0.1:%d" % p for p in cl.sentinel_ports],
                     "master": cl.name},
        "tls": {"ca_file": str(pki.ca_crt)}, "connect_timeout_ms": 300})
    return Agent(procs, tmp, cfg, name=name)


def test_tls_sentinels_and_failover(agent, procs, tmp, pki):
    """Sentinels, master and replica on TLS only: the master found by asking the Sentinels
    over TLS, decisions exact; the master killed, the replica promoted: the agent hears
    +switch-master on its TLS subscription and decides exactly on the new master."""
    import signal
    cl = TLSSentinels(procs, tmp, pki)
    a = agent_on_tls_sentinels(procs, tmp, pki, cl, "agent-sn")
    assert decide(a, "tls-sn", 6) == EXACT
    log = a.proc.log_text()
    assert "redis master %s connected (127.0.0.1:%d)" % (cl.name, cl.master_port) in log, log
    cl.master.signal(signal.SIGKILL)
    wait_until(lambda: "+switch-master %s" % cl.name in a.proc.log_text(), 30, 0.1,
               "+switch-master heard by the agent")
    wait_until(lambda: "connected (127.0.0.1:%d)" % cl.replica_port in a.proc.log_text(), 10,
               0.1, "the agent on the promoted replica")
    a.wait_store(timeout=10)
    assert decide(a, "tls-sn-after", 6, sid0=201) == EXACT


def test_a_master_the_sentinels_name_is_verified_by_its_name(agent, procs, tmp, pki):
    """Sentinels with resolve-hostnames and announce-hostnames answer the master's host name
    (localhost), and the master's certificate carries only that name: the agent resolves it
    and verifies the certificate against the name the Sentinels gave, not the address it
    dialled (it did: "certificate verify failed: IP address mismatch")."""
    cl = TLSSentinels(procs, tmp, pki, master="rlbyname", by_name=True)
    a = agent_on_tls_sentinels(procs, tmp, pki, cl, "agent-sn-name")
    assert decide(a, "tls-sn-name", 6) == EXACT
    assert "mismatch" not in a.proc.log_text()
