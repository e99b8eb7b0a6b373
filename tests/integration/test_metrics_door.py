"""The metrics listener's door: who may ask /metrics, /status, /top and /overrides.

An allow-list of networks (default: loopback when the listener is on loopback), the Host
header checked against the listener's own address and configured names (DNS rebinding: a
page of evil.example that rebinds its name to the agent's address sends "Host: evil.example"),
an optional bearer token read from a file (the probes /healthz and /ready need none), and on
every route nosniff, no-store and a Content-Security-Policy. `-c` warns when the listener
answers beyond loopback with neither an allow-list nor a token.
"""
import os

from conftest import check_config, agent_config, free_port, http_request, wait_until

ROUTES = ["/metrics", "/top", "/overrides", "/status", "/status.json", "/healthz", "/ready",
          "/nothing-here"]


def get(a, path, **headers):
    return http_request(a.metrics_addr, path, headers=headers)


def test_every_route_says_nosniff_no_store_and_a_policy(redis, agent):
    a = agent(redis=redis, metrics=True)
    for path in ROUTES:
        r = get(a, path)
        assert r.status in (200, 404), (path, r)
        assert r.h("X-Content-Type-Options") == "nosniff", (path, r.headers)
        assert r.h("Cache-Control") == "no-store", (path, r.headers)
        csp = r.h("Content-Security-Policy") or ""
        assert csp.startswith("default-src 'none'"), (path, r.headers)
        assert "frame-ancestors 'none'" in csp, (path, r.headers)


def test_a_foreign_host_is_refused_dns_rebinding(redis, agent):
    """A page whose name was rebound to the agent's address names itself in Host: refused
    with 421 on every route but the probes' answers too (the address and localhost work)."""
    a = agent(redis=redis, metrics=True)
    port = a.metrics_addr[1]
    for host in ("evil.example", "evil.example:%d" % port, "127.0.0.1.evil.example"):
        r = get(a, "/status.json", Host=host)
        assert r.status == 421, (host, r)
        assert b"metrics.host_names" in r.body, r.body
    for host in ("127.0.0.1:%d" % port, "127.0.0.1", "localhost:%d" % port, "LOCALHOST"):
        assert get(a, "/status.json", Host=host).status == 200, host
    # a name the operator gives is accepted
    b = agent(redis=redis, metrics=True, name="named")
    b.reload(metrics=dict(b.cfg["metrics"], host_names=["status.example.com"]))
    wait_until(lambda: get(b, "/metrics", Host="status.example.com:%d" % b.metrics_addr[1])
               .status == 200, 5, 0.1, "the name accepted after reload")
    assert get(b, "/metrics", Host="other.example.com").status == 421
    assert "refused" in a.proc.log_text() and "Host header" in a.proc.log_text()


def test_the_allow_list(redis, agent):
    """Only the networks of metrics.allow may ask; the others get 403 saying which key."""
    a = agent(redis=redis, metrics=True)
    a.reload(metrics=dict(a.cfg["metrics"], allow=["127.0.0.2/32", "2001:db8::/32"]))
    wait_until(lambda: get(a, "/metrics").status == 403, 5, 0.1, "the allow-list applied")
    r = get(a, "/healthz")
    assert r.status == 403 and b"metrics.allow" in r.body, r
    r = http_request(a.metrics_addr, "/metrics", source="127.0.0.2")
    assert r.status == 200, r
    assert "the last from 127.0.0.1: this address is not in" in a.proc.log_text()


def test_the_bearer_token_and_its_rotation(redis, agent, tmp):
    """With metrics.token_file, every route but the probes wants the token; a reload reads
    the file again, and the old token stops working."""
    tok = tmp / "metrics-token"
    tok.write_text("a" * 40 + "\n")
    os.chmod(tok, 0o600)
    a = agent(redis=redis, metrics=True)
    a.reload(metrics=dict(a.cfg["metrics"], token_file=str(tok)))
    wait_until(lambda: get(a, "/metrics").status == 401, 5, 0.1, "the token required")
    r = get(a, "/status.json")
    assert r.status == 401 and r.h("WWW-Authenticate").startswith("Bearer"), r
    assert b"Authorization: Bearer" in r.body, r.body
    assert get(a, "/top", Authorization="Bearer wrong").status == 401
    assert get(a, "/top", Authorization="Bearer " + "a" * 39).status == 401
    assert get(a, "/top", Authorization="Bearer " + "a" * 40).status == 200
    assert get(a, "/healthz").status == 200 and get(a, "/ready").status == 200
    # `ctl status` sends the token of the configuration it reads
    from test_overrides import ctl
    rc, out, err = ctl(a, "status")
    assert rc == 0 and "state" in out.lower(), (rc, out, err)
    tok.write_text("b" * 40 + "\n")
    a.reload()
    wait_until(lambda: get(a, "/top", Authorization="Bearer " + "b" * 40).status == 200, 5,
               0.1, "the new token")
    assert get(a, "/top", Authorization="Bearer " + "a" * 40).status == 401
    assert "metrics.token_file read again" in a.proc.log_text()


def test_check_warns_of_an_open_door(tmp):
    """-c warns when the listener answers beyond loopback with neither allow-list nor token;
    not when it is on loopback, has an allow-list of loopback, or a token. Bad entries are
    errors that say what is expected."""
    port = free_port()

    def check(**metrics):
        cfg = agent_config("127.0.0.1:%d" % port, metrics=dict({"listen": "0.0.0.0:%d" % port},
                                                               **metrics))
        return check_config(tmp, cfg)

    r = check()
    assert r.returncode == 0, r.stderr
    assert "warning: metrics.listen" in r.stderr and "metrics.token_file" in r.stderr, r.stderr
    r = check(allow=["10.0.0.0/8"])
    assert r.returncode == 0 and "warning: metrics.listen" in r.stderr, r.stderr
    r = check(allow=["127.0.0.1"])
    assert r.returncode == 0 and "warning: metrics" not in r.stderr, r.stderr
    r = check(listen="127.0.0.1:%d" % port)
    assert r.returncode == 0 and "warning: metrics" not in r.stderr, r.stderr
    tok = tmp / "tok"
    tok.write_text("x" * 32)
    os.chmod(tok, 0o600)
    r = check(token_file=str(tok))
    assert r.returncode == 0 and "warning: metrics" not in r.stderr, r.stderr
    r = check(allow=["10.0.0.300/8"])
    assert r.returncode != 0 and "a network is" in r.stderr, r.stderr
    r = check(host_names=["bad name"])
    assert r.returncode != 0 and "host name" in r.stderr, r.stderr
    tok.write_text("short")
    r = check(token_file=str(tok))
    assert r.returncode != 0 and "shorter than 16" in r.stderr, r.stderr
