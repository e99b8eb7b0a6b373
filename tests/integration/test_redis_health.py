"""One truth about Redis health: a Redis that cannot be reached from the start, one killed
while in use, one whose certificate the agent cannot verify. Each is reported down within a
second, with the reason in words, by /status.json (state, alerts.redis, the node's
down_since and trouble), /ready's body, /metrics (spoa_ratelimit_redis_down), `ctl status`
and the log; the breaker opens after breaker_failures failed connections; once Redis is
back every one of them says so and the state is `ok` again.

The time a node went down is the agent's own (down_since, Unix seconds): it is compared with
the time the test made Redis go away, not with how long the test's polling took."""

import subprocess
import time

import pytest

from conftest import SPOA_BIN, Redis, wait_until
from delay_proxy import DelayProxy
from test_overload import metric
from test_tls import OPENSSL, PKI, TLSRedis

POLL_S = 0.02


def status_json(a):
    import json
    status, body = a.http("/status.json")
    assert status == 200, body
    return json.loads(body)


def node_of(j):
    nodes = j["redis"]["nodes"]
    assert len(nodes) == 1, nodes
    return nodes[0]


def down(j):
    """<j> when it says Redis is down (state, alert, a reason, since when), else None."""
    if j["state"] == "ok" or not j["alerts"]["redis"] or not j["redis"]["health"]:
        return None
    n = node_of(j)
    return j if n["down_since"] and n["trouble"] and j["redis"]["down"] >= 1 else None


def up(j):
    n = node_of(j)
    ok = (j["state"] == "ok" and not j["alerts"]["redis"] and j["redis"]["health"] is None
          and n["down_since"] is None and n["trouble"] is None and j["redis"]["down"] == 0)
    return j if ok else None


def wait_down(a, t_event, what):
    """Polls /status.json until it says Redis is down; checks the time it reports against
    <t_event> (time.time() of the event); returns (status, seconds until seen)."""
    j = wait_until(lambda: down(status_json(a)), 15, POLL_S, what)
    seen = time.time() - t_event
    since = node_of(j)["down_since"]
    print("%s: down_since %.3f s after the event, seen by polling after %.3f s"
          % (what, since - t_event, seen))
    assert -0.05 <= since - t_event <= 1.0, (since, t_event, j["redis"])
    return j, seen


def ctl_status(a, want=0):
    """`ctl status`'s output; its exit status must be <want> (1: the agent answered that
    something is wrong)."""
    r = subprocess.run([str(SPOA_BIN), "ctl", "-f", str(a.conf_path), "status"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == want, (r.returncode, r.stdout, r.stderr)
    return r.stdout


def check_told(a, redis_address, reason):
    """Everything says the node at <redis_address> is down because of <reason> (the last
    failure's: a connection lost, then each reconnect refused)."""
    j = wait_until(lambda: (lambda j: j if reason in (j["redis"]["health"] or "") else None)(
        status_json(a)), 10, 0.05, "the status saying " + reason)
    assert ("redis %s down" % redis_address) in j["redis"]["health"], j["redis"]
    assert reason in node_of(j)["trouble"], node_of(j)
    assert j["agent"]["state"] == "degraded"
    status, body = a.http("/ready")
    # the failure ladder still answers every decision: ready, and the body says why
    assert status == 200, body
    assert "degraded: redis %s down" % redis_address in body and reason in body, body
    assert "local fallback limits apply" in body, body
    assert metric(a, "spoa_ratelimit_redis_down") == 1
    out = ctl_status(a, want=1)
    assert "== redis [RED]" in out and reason in out, out
    # logged at most once a second (with the count of messages suppressed)
    wait_until(lambda: reason in a.proc.log_text(), 5, 0.05, "the log saying " + reason)


def check_recovered(a, redis_address):
    wait_until(lambda: up(status_json(a)), 15, 0.05, "status ok again")
    status, body = a.http("/ready")
    assert status == 200 and "degraded" not in body, body
    assert metric(a, "spoa_ratelimit_redis_down") == 0
    wait_until(lambda: metric(a, "spoa_ratelimit_redis_breaker_open") == 0, 10, 0.05,
               "the breaker closed by the first decision")
    assert "redis %s up again after" % redis_address in a.proc.log_text()


def decide_exact(a):
    a.wait_store(timeout=15)


def test_closed_port_from_the_start(agent, procs, tmp):
    """Nothing listens on redis.address when the agent starts: down at once, "cannot connect
    to H:P: Connection refused" (one line, the address named), the breaker open after
    breaker_failures refused connects; Redis started on that port: ok again."""
    r = Redis(procs, tmp)
    r.stop()
    t0 = time.time()
    a = agent(redis=r, metrics=True, wait_redis=False)
    j, _ = wait_down(a, t0, "closed port from the start")
    reason = "cannot connect to %s: Connection refused" % r.address
    check_told(a, r.address, reason)
    log = a.proc.log_text()
    assert "connect: connect:" not in log and "connect: Connection refused" not in log, log
    assert "connection lost" not in log, log
    # five refused connects (50, 100, 200, 400 ms apart) open the breaker, and it says so
    wait_until(lambda: metric(a, "spoa_ratelimit_redis_breaker_open") == 1, 10, 0.05,
               "the breaker open on refused connects")
    assert "breaker open: 5 consecutive failures, the last: " + reason in a.proc.log_text()
    assert "(breaker open)" in status_json(a)["redis"]["health"]
    r.start()
    check_recovered(a, r.address)
    decide_exact(a)


def test_redis_killed_after_running(agent, redis):
    """Redis killed (SIGKILL) under an agent that used it: the loss is reported at once
    (down_since within a second of the kill), then every reconnect refused; back: ok."""
    a = agent(redis=redis, metrics=True)
    assert up(status_json(a)), status_json(a)
    t_kill = time.time()
    redis.proc.kill()
    j, seen = wait_down(a, t_kill, "Redis killed after running")
    health = j["redis"]["health"]
    # the kill shows as the server closing the connection or resetting it
    assert ("connection to %s lost: " % redis.address in health
            or "cannot connect to %s: Connection refused" % redis.address in health), health
    assert "redis %s down: connection to %s lost: " % (redis.address, redis.address) \
        in a.proc.log_text()
    check_told(a, redis.address, "cannot connect to %s: Connection refused" % redis.address)
    redis.start()
    check_recovered(a, redis.address)
    decide_exact(a)


@pytest.mark.skipif(OPENSSL is None, reason="openssl command not installed")
def test_wrong_ca(agent, procs, tmp):
    """The server's certificate is signed by a CA the agent does not trust: down from the
    start, the verification's verdict in words; the server given a good certificate: ok."""
    pki = PKI(tmp, "good")
    good = pki.issue("redis")
    bad = PKI(tmp, "other").issue("redis")
    r = TLSRedis(procs, tmp, *bad, pki.ca_crt)
    t0 = time.time()
    a = agent(redis=r, redis_cfg={"tls": {"ca_file": str(pki.ca_crt)}}, metrics=True,
              wait_redis=False)
    wait_down(a, t0, "wrong CA")
    check_told(a, r.address, "cannot connect to %s: TLS: certificate verify failed: "
               "unable to get local issuer certificate" % r.address)
    r.serve(*good)
    check_recovered(a, r.address)
    decide_exact(a)
    assert "redis %s connected over TLS" % r.address in a.proc.log_text()


def test_first_decisions_wait_for_redis_a_few_ms_away(agent, redis):
    """A process that starts listening before its first connection to Redis is up (a
    worker restarted under traffic): its first decisions wait for it, within their
    deadline, and are decided, not answered degraded (they were: "down", seen as a flaky
    test_rolling_worker_restart_through_haproxy)."""
    import spop_client as sc
    proxy = DelayProxy(redis.port, join_delay=0.08)
    try:
        a = agent(redis=proxy, wait_redis=False, metrics=True)
        t0 = time.monotonic()
        with sc.SpopClient(a.addr) as c:
            c.hello()
            v = c.request(1, 1, [sc.rl_message(key="first-one")])
        waited = time.monotonic() - t0
        assert v["allow"] == 1 and not v.get("degraded"), v
        print("first decision answered after %.0f ms (Redis joined after 80 ms)" %
              (waited * 1000))
    finally:
        proxy.close()
