"""Overload control and Redis failures: a slow or stalling Redis and a busy agent shed only
the excess (no circuit breaker), while a broken Redis (error replies such as OOM, a
connection lost, no answer at all) opens it; replies are distrusted (topology, integers)."""

import re
import socket
import subprocess
import threading

import pytest

import spop_client as sc
from conftest import SPOA_BIN, Redis, vm_rss_kb, wait_until
from fake_redis import ERR_NO_CLUSTER, FakeRedis, resp_array, resp_int, script_reply

SPOP_LOAD = SPOA_BIN.parent / "spop-load"


class DebugRedis(Redis):
    """A Redis that accepts DEBUG SLEEP from loopback clients (Redis 7 refuses it by
    default)."""

    def argv(self):
        return super().argv() + ["--enable-debug-command", "local"]


def metric(a, name, **labels):
    """The value of one sample of <name> with exactly <labels> on agent <a> (0 if absent)."""
    status, body = a.http("/metrics")
    assert status == 200, (status, body)
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in body.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{([^}]*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = ",".join(sorted((m.group(2) or "").split(","))) if m.group(2) else ""
        if got == want:
            return float(m.group(3))
    return 0


def degraded_by(a):
    """Degraded answers by reason, from /metrics."""
    status, body = a.http("/metrics")
    assert status == 200
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^spoa_ratelimit_degraded_total\{reason="(\w+)"\} (\S+)$', body, re.M)}


def run_load(a, *args):
    """build/spop-load against agent <a>: its summary line as a dict of numbers."""
    host, port = a.addr
    out = subprocess.run([str(SPOP_LOAD), "-a", "%s:%d" % (host, port)] + [str(x) for x in args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("decisions=")][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}


# ---------------------------------------------------------------------------------------
# Slow, stalling, saturated: shed the excess, never the whole traffic

def test_short_stalls_under_paced_load_open_no_breaker(agent, procs, tmp):
    """Redis stalls for 30 ms (DEBUG SLEEP) every 250 ms under 2,000 decisions/s with the
    default 5 ms command timeout: the decisions caught in a stall are degraded (timeout or
    overload), but no breaker opens, so the degraded answers stay within twice the
    requests that arrived during the stalls (the breaker used to turn each stall into
    500 ms of unprotected answers for everyone), on top of what the same load without
    stalls costs on this machine (a control run first: a slow or shared machine, or a
    sanitizer build, may shed some of 2,000/s by itself)."""
    redis = DebugRedis(procs, tmp)
    a = agent(redis=redis, metrics=True, redis_cfg={"command_timeout_ms": 5})
    load = ["-r", 2000, "-d", 3, "-c", 4, "-p", 32, "-k", 1000]
    control = run_load(a, *load, "-K", "calm-")
    before = degraded_by(a)             # the harness's probes, the control run
    stalls, stop = [0], threading.Event()

    def staller():
        while not stop.wait(0.25):
            redis.cmd("DEBUG", "SLEEP", "0.03")
            stalls[0] += 1
    t = threading.Thread(target=staller, daemon=True)
    t.start()
    try:
        r = run_load(a, *load, "-K", "stall-")
    finally:
        stop.set()
        t.join(5)
    assert stalls[0] >= 5, stalls
    assert r["unanswered"] == 0 and r["decisions"] >= 0.9 * r["sent"], r
    deg = {k: v - before.get(k, 0) for k, v in degraded_by(a).items()}
    assert metric(a, "spoa_ratelimit_redis_breaker_opened_total") == 0, (deg, r)
    assert deg.get("breaker", 0) == 0, deg
    # requests that arrived during the stalls: 2000/s x 30 ms each
    in_stalls = stalls[0] * 2000 * 0.03
    limit = metric(a, "spoa_ratelimit_redis_concurrency_limit")
    print("control:", control, "stalls:", stalls[0], r, deg, "limit", limit)
    assert r["degraded"] <= control["degraded"] + 2 * in_stalls, (r, control, stalls, deg)
    assert a.alive()


@pytest.mark.parametrize("batch_max", [16, 1])
def test_a_slow_redis_never_cuts_the_limit_below_one_script_call(agent, procs, tmp, batch_max):
    """Redis stalled 20 ms ten times in a row under paced load: each stall cuts the
    concurrency limit, but with batching never below one full script call (batch_max
    decisions: fewer per round trip would only lower Redis' capacity while it is short);
    without batching (batch_max = 1) it goes down to 2. Read right after the stalls."""
    redis = DebugRedis(procs, tmp)
    a = agent(redis=redis, metrics=True,
              redis_cfg={"command_timeout_ms": 5, "batch_max": batch_max})
    done, out = threading.Event(), {}

    def load():
        out["r"] = run_load(a, "-r", 2000, "-d", 2, "-c", 4, "-p", 32, "-k", 1000,
                            "-K", "slow-")
        done.set()
    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        wait_until(lambda: metric(a, "spoa_ratelimit_redis_commands_total") > 200, 10)
        for _ in range(10):
            redis.cmd("DEBUG", "SLEEP", "0.02")
        limit = metric(a, "spoa_ratelimit_redis_concurrency_limit")
        print("limit after the stalls", limit)
    finally:
        t.join(30)
    assert done.is_set(), "load did not finish"
    assert metric(a, "spoa_ratelimit_redis_breaker_opened_total") == 0
    if batch_max > 2:
        assert limit >= batch_max, limit
    else:
        assert limit < 16, limit


def test_closed_loop_beyond_capacity_opens_no_breaker(agent, redis):
    """4 connections x 32 NOTIFYs in flight, as fast as the agent answers, against a
    healthy Redis with a 5 ms command timeout: whatever cannot fit is shed (overload) or
    late (timeout) and counted with its reason; the breaker never opens."""
    a = agent(redis=redis, metrics=True, redis_cfg={"command_timeout_ms": 5})
    before = degraded_by(a)             # the harness's probes while connecting
    r = run_load(a, "-c", 4, "-p", 32, "-d", 4, "-k", 1000, "-K", "closed-")
    deg = {k: v - before.get(k, 0) for k, v in degraded_by(a).items()}
    assert r["decisions"] > 0, r
    assert metric(a, "spoa_ratelimit_redis_breaker_opened_total") == 0, (deg, r)
    assert deg.get("breaker", 0) == 0, deg
    # every degraded answer has its reason, and a shed command is a degraded answer (or
    # several: decisions of one key waiting on one Redis call share its outcome)
    assert sum(deg.values()) >= r["degraded"], (deg, r)
    print("closed loop:", r, deg)
    shed = metric(a, "spoa_ratelimit_redis_shed_total")
    assert deg.get("overload", 0) >= shed and (shed > 0) == (deg.get("overload", 0) > 0), deg
    assert set(k for k, v in deg.items() if v) <= {"overload", "timeout"}, deg
    assert metric(a, "spoa_ratelimit_redis_queued") == 0
    assert metric(a, "spoa_ratelimit_redis_concurrency_limit") >= 2
    assert a.alive()


# ---------------------------------------------------------------------------------------
# Broken: error replies are Redis failures

def test_redis_oom_opens_breaker_and_shows_in_metrics_and_ready(agent, redis):
    """A Redis at maxmemory with noeviction answers every script call with OOM: each is a
    Redis failure (degraded, class oom), the breaker opens, /ready's body says so (still
    200: the 200/503 decision is unchanged); with memory back, limiting resumes."""
    a = agent(redis=redis, metrics=True, redis_cfg={"breaker_cooldown_ms": 200})
    status, body = a.http("/ready")
    assert status == 200 and "degraded" not in body, body
    redis.cmd("CONFIG", "SET", "maxmemory-policy", "noeviction")
    redis.cmd("CONFIG", "SET", "maxmemory", "1")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(8):
            v = c.request(1 + 2 * i, 1, [sc.rl_message(key="oom-%d" % i)])
            assert v.get("degraded") == 1, v
        # the counters are published every 250 ms: read until they are (they only grow)
        wait_until(lambda: metric(a, "spoa_ratelimit_redis_errors_total",
                                  **{"class": "oom"}) >= 5, 5, 0.05, "oom errors counted")
        wait_until(lambda: metric(a, "spoa_ratelimit_redis_breaker_opened_total") >= 1, 5,
                   0.05, "the breaker's opening counted")
        # five consecutive failures open the breaker; the gateway heartbeat (once a second)
        # meets the same OOM and may be one of them: the 8 decisions are degraded by the
        # error itself until the breaker opens, then by the open breaker
        wait_until(lambda: (lambda deg: deg.get("error", 0) >= 1 and deg.get("breaker", 0) >= 1
                            and deg.get("error", 0) + deg.get("breaker", 0) >= 8)(
            degraded_by(a)), 5, 0.05, "degraded answers by reason")

        def ready_says_open():
            status, body = a.http("/ready")
            assert status == 200, body
            return ("degraded: redis %s OOM" % redis.address in body and
                    "breaker open" in body)
        # a probe after the 200 ms cooldown fails again (OOM): the breaker opens again
        wait_until(ready_says_open, 5, 0.05, "/ready saying OOM and the breaker open")
        redis.cmd("CONFIG", "SET", "maxmemory", "0")
        sid = [101]

        def exact():
            sid[0] += 2
            v = c.request(sid[0], 1, [sc.rl_message(key="oom-after")])
            return v.get("degraded") is None and v
        wait_until(exact, 10, 0.05, "decisions with Redis again")
    assert "breaker closed" in a.proc.log_text()
    assert a.alive()


# ---------------------------------------------------------------------------------------
# Distrusted replies (a fake Redis)

def test_malformed_cluster_slots_before_mode_known_is_retried(agent):
    """The seed answers its first CLUSTER SLOTS with an array of nonsense: the store asks
    again instead of staying without a mode (never ready); a cluster-disabled error then
    makes it a single Redis, and decisions are made."""
    garbage = resp_array([resp_array([resp_int(1)])])
    fr = FakeRedis(slots=[garbage, garbage, ERR_NO_CLUSTER])
    try:
        a = agent(redis=fr)                 # waits until decisions are not degraded
        assert fr.count("CLUSTER", "SLOTS") >= 3
        assert "single Redis" in a.proc.log_text()
        assert a.alive()
    finally:
        fr.close()


def test_out_of_range_integers_in_script_reply_are_errors(agent):
    """Script replies carrying integers out of their range (huge, negative, flags other
    than 0/1, a grant larger than asked) are errors (degraded, reason error), never used:
    nothing the agent computes from them overflows (the ASan/UBSan build aborts on
    signed overflow)."""
    big = 2 ** 63 - 1

    def bad(n, now=1700000000000000):
        ok = [1, n, now] + [1, 5, 0, 60000] * n
        return [
            ok[:3] + [1, big, 0, 0] * n,                # remaining huge
            ok[:3] + [1, -big - 1, 0, 0] * n,           # remaining hugely negative
            ok[:2] + [-1] + ok[3:],                     # Redis time negative
            ok[:2] + [big] + ok[3:],                    # Redis time huge
            ok[:3] + [0, 0, big, 0] * n,                # retry_ms huge
            ok[:3] + [0, 0, 1000, -5] * n,              # reset_ms negative
            [2] + ok[1:],                               # allowed flag 2
            ok[:3] + [7, 5, 0, 0] * n,                  # verdict flag 7
        ]
    replies = []

    def script(nkeys, argv):
        if not replies:
            replies.extend(bad(nkeys))
            replies.append(None)                        # then a good one
        v = replies.pop(0)
        return script_reply(nkeys) if v is None else resp_array([resp_int(x) for x in v])

    fr = FakeRedis(script=script)
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False,
                  redis_cfg={"breaker_failures": 100})
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.05, "store ready")
        with sc.SpopClient(a.addr) as c:
            c.hello()
            for i in range(8):
                v = c.request(1 + 2 * i, 1, [sc.rl_message(key="int-%d" % i)])
                assert v.get("degraded") == 1, (i, v)
            v = c.request(101, 1, [sc.rl_message(key="int-good")])
            assert v.get("degraded") is None and v["allow"] == 1, v
        assert degraded_by(a).get("error") == 8
        assert metric(a, "spoa_ratelimit_redis_errors_total", **{"class": "other"}) == 8
        assert a.alive()
    finally:
        fr.close()


def agent_first_reply(agent, first, command_timeout_ms, **redis_cfg):
    """An agent (metrics on, <command_timeout_ms>, other <redis_cfg>) on a fake Redis whose
    first script reply is the raw bytes <first> (or <first>(nkeys)), the others ordinary
    ones, once its store is ready. Returns (agent, the fake Redis to close, the script calls
    so far)."""
    calls = []

    def script(nkeys, argv):
        calls.append(nkeys)
        if len(calls) > 1:
            return script_reply(nkeys)
        return first(nkeys) if callable(first) else first

    fr = FakeRedis(script=script)
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False,
                  redis_cfg=dict(redis_cfg, command_timeout_ms=command_timeout_ms))
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.05, "store ready")
    except BaseException:
        fr.close()
        raise
    return a, fr, calls


def test_an_array_header_alone_costs_the_agent_no_resident_memory(agent):
    """The script's reply is only an array header claiming 4 million elements (within
    redis.max_reply_elements raised to 2^22 here; the default, 2^18, refuses it as the next
    test's header is refused), none of which follow: the agent answers the decision degraded
    at its command timeout, drops the stalled connection and goes on answering. Its resident
    memory never grows by the 31 MB of such an array's element vector: the vector is
    reserved, not written, as with hiredis' own reply functions (the store's reply
    functions used to clear it page by page: a 12-byte header cost 128 MB, and one claiming
    2^31 elements, 16 GB), and when the half-built reply is freed only its built elements
    (none) are read. The bound holds on any kernel: where reading untouched anonymous
    memory makes it resident (it did on some: +31 MB when the free path read every slot),
    the agent now touches one page of the vector, at most a 2 MB huge page with THP; the
    16 MB margin is half of what writing or reading the vector would cost."""
    import threading
    import time
    a, fr, calls = agent_first_reply(agent, b"*4000000\r\n", 200,
                                     max_reply_elements=1 << 22)
    try:
        assert a.worker_pids() == []        # the store lives in this process
        pid = a.proc.pid
        base = vm_rss_kb(pid)
        peak, stop = [base], threading.Event()

        def sampler():                      # the vector lives until the stall drops it
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], vm_rss_kb(pid))
                except (OSError, AssertionError):
                    return
                time.sleep(0.002)

        t = threading.Thread(target=sampler, daemon=True)
        t.start()
        try:
            with sc.SpopClient(a.addr, timeout=10) as c:
                c.hello()
                v = c.request(1, 1, [sc.rl_message(key="hdr")])
                assert v.get("degraded") == 1, v
                # the stalled connection, its half-built reply with it, is dropped (1 s)
                wait_until(lambda: "stalled" in a.proc.log_text(), 10, 0.05, "stall")
                v = c.request(3, 1, [sc.rl_message(key="hdr")])
                assert "allow" in v, v
        finally:
            stop.set()
            t.join(5)
        assert peak[0] - base < 16 * 1024, (base, peak[0])   # 31,250 kB if written
        assert a.alive()
    finally:
        fr.close()


def test_an_array_header_past_the_cap_is_an_error_of_the_connection(agent):
    """A script reply claiming 2^31 - 1 elements (16 GB of element vector) is refused as
    it is read: the connection is dropped at once (no waiting for a stall), the decision
    answered by the failure ladder, and the next one, on a new connection, by Redis. The log
    says what was refused, and which limit to raise if the reply was legitimate."""
    import time
    a, fr, calls = agent_first_reply(agent, b"*2147483647\r\n", 5000)
    try:
        with sc.SpopClient(a.addr, timeout=10) as c:
            c.hello()
            t0 = time.monotonic()
            v = c.request(1, 1, [sc.rl_message(key="cap")])
            assert v.get("degraded") == 1, v
            # well before the 5 s command timeout and the stall: the reader refused it
            assert time.monotonic() - t0 < 2.0
            assert "stalled" not in a.proc.log_text()
            wait_until(lambda: "allow" in c.request(3, 1, [sc.rl_message(key="cap")]) and
                       len(calls) >= 2, 10, 0.1, "decided by Redis again")
        assert ("protocol error: a reply of more than 262144 elements "
                "(redis.max_reply_elements)") in a.proc.log_text(), a.proc.log_tail()
        assert a.alive()
    finally:
        fr.close()


@pytest.mark.parametrize("first", [
    b"#t\r\n", b",1.5\r\n",
    lambda n: b"*%d\r\n#t\r\n:%d\r\n,-inf\r\n" % (3 + 4 * n, n) + b":0\r\n" * (4 * n)],
    ids=["bool", "double", "in-array"])
def test_resp3_replies_never_asked_for_are_errors(agent, first):
    """A script reply that is a RESP3 boolean or double, or an array of them (the agent never
    sends HELLO 3, but a reply is the server's word): the decision is answered by the failure
    ladder, the next one by Redis. hiredis 1.x (Debian 13) reads these types, and the store's
    reply functions had none for them: hiredis then handed the type over as the reply's
    pointer (0x8), or left the array's slot NULL (in a reply of the expected length), and
    the agent crashed. hiredis 0.14 (Debian 12) refuses them as a protocol error."""
    a, fr, calls = agent_first_reply(agent, first, 5000)
    try:
        with sc.SpopClient(a.addr, timeout=10) as c:
            c.hello()
            v = c.request(1, 1, [sc.rl_message(key="resp3")])
            assert v.get("degraded") == 1, v
            wait_until(lambda: "allow" in c.request(3, 1, [sc.rl_message(key="resp3")]) and
                       len(calls) >= 2, 10, 0.1, "decided by Redis again")
        assert a.alive()
    finally:
        fr.close()


# ---------------------------------------------------------------------------------------
# Reload

def test_reload_logs_restart_only_redis_settings(agent, redis):
    """Redis settings a reload cannot apply are each logged as ignored until restart; the
    deadlines (command_timeout_ms, queue_timeout_ms, spoe_timeout) apply at once."""
    a = agent(redis=redis)
    for change in ({"max_pending": 777, "breaker_failures": 9, "breaker_cooldown_ms": 900},
                   {"max_concurrency": 64}):
        a.reload(redis=dict(a.cfg["redis"], **change))
        for k in change:
            wait_until(lambda: "reload: 'redis.%s' changed, ignored until restart" % k
                       in a.proc.log_text(), 10, 0.05, "redis.%s logged" % k)
    a.reload(redis=dict(a.cfg["redis"], command_timeout_ms=70, queue_timeout_ms=7),
             spoe_timeout="2s")
    wait_until(lambda: a.proc.log_text().count("reload (SIGHUP) ok") >= 3, 10, 0.05,
               "third reload")
    for k in ("command_timeout_ms", "queue_timeout_ms"):
        assert "'redis.%s' changed" % k not in a.proc.log_text()
    assert "store settings changed" not in a.proc.log_text()
    assert "reload (SIGHUP) failed" not in a.proc.log_text()
    assert a.alive()


def test_commands_parked_at_a_connecting_node_do_not_open_its_breaker(agent):
    """A MOVED sends decisions to a node that never finishes connecting (it accepts and
    says nothing): they wait there until its connect deadline, which answers them all DOWN.
    That is one failure of the node, not one per command waiting: its breaker stays closed
    (8 parked commands opened it at breaker_failures = 5)."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)                   # the handshake completes; nothing is ever read
    moved = b"-MOVED 1 127.0.0.1:%d\r\n" % silent.getsockname()[1]
    fr = FakeRedis(script=lambda nkeys, argv: moved)
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False,
                  redis_cfg={"breaker_failures": 5, "command_timeout_ms": 1000,
                             "connect_timeout_ms": 300})
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.05, "store ready")
        got = run_load(a, "-c", 1, "-p", 8, "-n", 8, "-d", 5, "-k", 8, "-s")
        assert got["decisions"] == 8, got
        assert fr.count("EVALSHA") >= 1     # one call, or one per decision (batch_max)
        assert degraded_by(a).get("down", 0) >= 8, degraded_by(a)
        assert metric(a, "spoa_ratelimit_redis_breaker_opened_total") == 0
        assert "breaker open" not in a.proc.log_text()
        assert a.alive()
    finally:
        fr.close()
        silent.close()


def test_an_agent_paused_longer_than_the_stall_bound_opens_no_breaker(agent, redis):
    """The agent stopped (SIGSTOP) for 1.5 s with a command out, its reply waiting in the
    socket: on resume its housekeeping tick runs late, before the reply is read. The pause
    was the agent's, not Redis': no stall, no breaker, the next decisions are exact (the
    tick used to see 1.5 s without progress, open the breaker and drop the connection)."""
    import signal
    import time
    # a command timeout far below the pause, long enough that the decisions after it are
    # not degraded by an ordinary hiccup of a loaded machine
    a = agent(redis=redis, metrics=True, redis_cfg={"command_timeout_ms": 200})
    with sc.SpopClient(a.addr, timeout=5) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="pz")]).get("degraded") is None
        redis.proc.signal(signal.SIGSTOP)
        try:
            c.send(sc.notify(3, 1, [sc.rl_message(key="pz")]))
            time.sleep(0.05)            # the command is out, Redis does not answer
            a.proc.signal(signal.SIGSTOP)
        finally:
            redis.proc.signal(signal.SIGCONT)
        time.sleep(1.5)                 # Redis answers into the stopped agent's socket
        a.proc.signal(signal.SIGCONT)
        f = c.recv_frame(timeout=5)
        assert f is not None and f.type == sc.T_ACK and f.sid == 3, f
        vs = [c.request(5 + 2 * i, 1, [sc.rl_message(key="pz")]) for i in range(5)]
        assert all(v.get("degraded") is None for v in vs), vs
    assert metric(a, "spoa_ratelimit_redis_breaker_opened_total") == 0
    assert "stalled" not in a.proc.log_text()


def test_decisions_are_answered_within_haproxys_budget_not_the_command_timeout(agent, redis):
    """With spoe_timeout set, a decision Redis has not answered when most of HAProxy's
    processing budget has passed is answered by the failure ladder then (HAProxy would let
    the request through with no limit at all after it), not at the command or queue
    timeout: here Redis is stopped, the budget is 100 ms and the command timeout 20 s, and
    the answer (a local-limit verdict, reason timeout) arrives long before the latter."""
    import signal
    a = agent(redis=redis, metrics=True, spoe_timeout="100ms",
              redis_cfg={"command_timeout_ms": 20000, "queue_timeout_ms": 20000})
    with sc.SpopClient(a.addr, timeout=5) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="ab")]).get("degraded") is None
        redis.proc.signal(signal.SIGSTOP)
        try:
            v = c.request(3, 1, [sc.rl_message(key="ab")], timeout=5)
        finally:
            redis.proc.signal(signal.SIGCONT)
    assert v.get("degraded") == 1 and v.get("allow") == 1, v
    assert metric(a, "spoa_ratelimit_degraded_total", reason="timeout") == 1
    assert metric(a, "spoa_ratelimit_redis_breaker_opened_total") == 0
