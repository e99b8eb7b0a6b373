"""What the agent says when it cannot use Redis, checked word for word: each message names
the address and says what to do. A server that requires a password the configuration does
not give, a wrong password, TLS against a clear-text port and clear text against a TLS port,
a certificate for another name, a CA file that does not exist; `-c` says how Redis is
reached (in clear text, over TLS, verified or not) and warns of `tls.verify = false`; `ctl`
against a server that requires a client certificate says so once, at once; the shutdown
line's degraded total is the sum of its breakdown."""

import re
import subprocess
import time

import pytest

import spop_client as sc
from conftest import SPOA_BIN, Redis, agent_config, agent_env, free_port, to_libconfig, \
    wait_until
from test_redis_health import status_json
from test_secrets import PW, AuthRedis, secret_file
from test_tls import OPENSSL, PKI, TLSRedis

needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl command not installed")


def told(a, text, timeout=10):
    """Waits until the status (redis.health) and the log both hold <text>."""
    wait_until(lambda: text in (status_json(a)["redis"]["health"] or ""), timeout, 0.05,
               "the status saying " + text)
    wait_until(lambda: text in a.proc.log_text(), 5, 0.05, "the log saying " + text)


def test_password_required_but_not_configured(agent, procs, tmp):
    r = AuthRedis(procs, tmp, PW)
    a = agent(redis=r, metrics=True, wait_redis=False)
    told(a, "%s: Redis requires authentication: set redis.password_file (and redis.user "
         "for an ACL user)" % r.address)
    assert "unauthenticated bulk length" not in status_json(a)["redis"]["health"]


def test_wrong_password(agent, procs, tmp):
    r = AuthRedis(procs, tmp, PW)
    pw = secret_file(tmp / "pw", "not the password\n")
    a = agent(redis=r, metrics=True, wait_redis=False, redis_cfg={"password_file": str(pw)})
    told(a, "%s: Redis refused the password (WRONGPASS" % r.address)
    told(a, "check redis.password_file and redis.user")


def test_password_given_to_a_server_without_one(agent, redis, tmp):
    pw = secret_file(tmp / "pw", "a password\n")
    a = agent(redis=redis, metrics=True, wait_redis=False, redis_cfg={"password_file": str(pw)})
    told(a, "%s: Redis has no password but the agent sends one" % redis.address)


def test_refused_is_one_line_naming_the_address(agent, procs, tmp):
    r = Redis(procs, tmp)
    r.stop()
    a = agent(redis=r, metrics=True, wait_redis=False)
    told(a, "redis %s down: cannot connect to %s: Connection refused" % (r.address, r.address))
    log = a.proc.log_text()
    assert "connect: connect:" not in log and "connection lost" not in log, log


@needs_openssl
def test_tls_against_a_clear_text_port(agent, procs, tmp):
    """redis.tls set, the address a clear-text port: the hint names the likely mistake,
    whether the server answers the handshake with clear text or says nothing."""
    pki = PKI(tmp, "ca")
    r = Redis(procs, tmp)
    a = agent(redis=r, metrics=True, wait_redis=False,
              redis_cfg={"tls": {"ca_file": str(pki.ca_crt)}, "connect_timeout_ms": 300})
    told(a, "cannot connect to %s: no TLS handshake within redis.connect_timeout_ms (300 "
         "ms): is this the TLS port? (redis.tls is set)" % r.address)


def serve_bytes(reply):
    """A server on loopback that answers whatever it reads with <reply>, then hangs up:
    (address, stop function)."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                c.settimeout(1)
                c.recv(4096)
                c.sendall(reply)
            except OSError:
                pass
            c.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close():
        stop.set()
        t.join(5)
        srv.close()
    return "127.0.0.1:%d" % srv.getsockname()[1], close


@needs_openssl
def test_tls_against_a_server_answering_in_clear_text(agent, procs, tmp):
    """A clear-text server that answers the TLS handshake (with an error reply)."""
    pki = PKI(tmp, "ca")
    addr, close = serve_bytes(b"-ERR unknown command\r\n")
    try:
        a = agent(redis=None, store="redis", metrics=True, wait_redis=False,
                  redis_cfg={"address": addr, "tls": {"ca_file": str(pki.ca_crt)}})
        told(a, "cannot connect to %s: the server answered in clear text: is this the TLS "
             "port? (redis.tls is set)" % addr)
    finally:
        close()


def test_clear_text_against_a_server_sending_a_tls_alert(agent):
    """A TLS server that answers clear text with a TLS alert record (0x15)."""
    addr, close = serve_bytes(b"\x15\x03\x03\x00\x02\x02\x46")
    try:
        a = agent(redis=None, store="redis", metrics=True, wait_redis=False,
                  redis_cfg={"address": addr})
        told(a, "cannot connect to %s: the server speaks TLS: set redis.tls" % addr)
    finally:
        close()


@needs_openssl
def test_clear_text_against_a_tls_port(agent, procs, tmp):
    pki = PKI(tmp, "ca")
    r = TLSRedis(procs, tmp, *pki.issue("redis"), pki.ca_crt)
    a = agent(redis=r, metrics=True, wait_redis=False)
    # Redis 7 resets the connection; a server that sends a TLS alert is told "the server
    # speaks TLS: set redis.tls"
    told(a, "cannot connect to %s: the server hung up on our first command without a word "
         % r.address)
    told(a, "if it speaks TLS, set redis.tls")


@needs_openssl
def test_name_mismatch_names_both(agent, procs, tmp):
    """The certificate is for another name: the name expected and the names presented."""
    pki = PKI(tmp, "ca")
    r = TLSRedis(procs, tmp, *pki.issue("elsewhere", san="DNS:elsewhere.test,IP:10.9.9.9"),
                 pki.ca_crt)
    a = agent(redis=r, metrics=True, wait_redis=False,
              redis_cfg={"tls": {"ca_file": str(pki.ca_crt), "server_name": "redis.test"}})
    told(a, "certificate verify failed: hostname mismatch: expected redis.test, the "
         "certificate is for elsewhere.test, 10.9.9.9")


@needs_openssl
def test_agent_without_the_client_certificate(agent, procs, tmp):
    pki = PKI(tmp, "ca")
    r = TLSRedis(procs, tmp, *pki.issue("redis"), pki.ca_crt, clients="yes")
    a = agent(redis=r, metrics=True, wait_redis=False,
              redis_cfg={"tls": {"ca_file": str(pki.ca_crt)}})
    told(a, "redis %s down: cannot connect to %s: " % (r.address, r.address))
    # the server's alert ("certificate required"), or the reset that follows it
    told(a, "client certificate")
    told(a, "set redis.tls.cert_file and redis.tls.key_file")


def check(tmp, redis_cfg):
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:6379")
    cfg["redis"].update(redis_cfg)
    p = tmp / "check.conf"
    p.write_text(to_libconfig(cfg))
    return p, subprocess.run([str(SPOA_BIN), "-c", "-f", str(p)], capture_output=True,
                             text=True, timeout=20, env=agent_env())


@needs_openssl
def test_check_says_tls_and_warns_of_verify_false(agent_bin, tmp):
    pki = PKI(tmp, "ca")
    _, r = check(tmp, {})
    assert r.returncode == 0 and "redis: 127.0.0.1:6379, in clear text" in r.stdout, r
    _, r = check(tmp, {"tls": {"ca_file": str(pki.ca_crt)}})
    assert r.returncode == 0, r
    assert "redis: 127.0.0.1:6379, over TLS, the server's certificate verified" in r.stdout, r
    assert "warning" not in r.stderr, r.stderr
    p, r = check(tmp, {"tls": {"verify": False}})
    assert r.returncode == 0, r
    assert "over TLS, the server's certificate NOT verified (tls.verify = false)" in r.stdout
    line = [i for i, l in enumerate(p.read_text().splitlines(), 1) if "verify" in l][0]
    assert ("%s:%d: warning: redis.tls.verify = false: the server's certificate is not "
            "checked" % (p, line)) in r.stderr, r.stderr


@needs_openssl
def test_missing_ca_file(agent_bin, tmp):
    missing = tmp / "no-such-ca.crt"
    _, r = check(tmp, {"tls": {"ca_file": str(missing)}})
    assert r.returncode == 1, r
    assert "CA file %s: No such file or directory" % missing in r.stderr, r.stderr
    assert "system lib" not in r.stderr, r.stderr


@needs_openssl
def test_ctl_without_the_client_certificate_says_so_once(agent, procs, tmp):
    """`ctl` against a server that requires client certificates, without one: one message,
    at once (it used to print its error twice, or wait 5 s for "timed out", twice)."""
    pki = PKI(tmp, "ca")
    r = TLSRedis(procs, tmp, *pki.issue("redis"), pki.ca_crt, clients="yes")
    cfg = agent_config("127.0.0.1:%d" % free_port(), r.address)
    cfg["redis"]["tls"] = {"ca_file": str(pki.ca_crt)}
    p = tmp / "ctl.conf"
    p.write_text(to_libconfig(cfg))
    t0 = time.monotonic()
    out = subprocess.run([str(SPOA_BIN), "ctl", "-f", str(p), "block", "key:x", "--for", "1m"],
                         capture_output=True, text=True, timeout=30, env=agent_env())
    took = time.monotonic() - t0
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("redis %s: " % r.address), out.stderr
    # the server's alert ("certificate required"), or the reset that follows it
    assert "client certificate" in lines[0] and lines[0].endswith(
        "set redis.tls.cert_file and redis.tls.key_file"), out.stderr
    assert took < 2.5, took


def test_shutdown_line_adds_up(agent, procs, tmp):
    """The shutdown line's degraded total is the sum of its reasons."""
    r = Redis(procs, tmp)
    a = agent(redis=r)
    r.stop()
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(20):
            c.request(1 + 2 * i, 1, [sc.rl_message(key="sd-%d" % i)])
    assert a.stop() == 0
    line = [l for l in a.proc.log_text().splitlines() if "stats:" in l][-1]
    m = re.search(r"degraded=(\d+) \(([^)]*)\)", line)
    assert m, line
    parts = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2)))
    assert int(m.group(1)) == sum(parts.values()) and int(m.group(1)) >= 20, line
