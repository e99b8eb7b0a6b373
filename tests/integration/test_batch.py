"""Several decisions in one script call (redis.batch_max): decisions that meet in one loop
iteration of the agent go to a single Redis together, and each still gets exactly the
answer it would get alone, in order, whatever else shares its call."""

import spop_client as sc
from conftest import wait_until
from test_ops import pipeline, scrape
from test_quota import script_calls

LIMITS = {"b50": {"rate": 50, "period": "1h"}, "anon5": {"rate": 5, "period": "1h"}}
CFG = dict(limits=LIMITS, tiers={"t": {"limits": ["b50"]}}, default_tier="t",
           anonymous={"limits": ["anon5"]})


def messages(hot, distinct, prefix, tags=None):
    """<hot> requests of one key interleaved with <distinct> requests of fresh keys;
    <tags>, when given, gets True for each hot one and False for each fresh one."""
    out = []
    for i in range(max(hot, distinct)):
        if i < hot:
            out.append(sc.rl_message(key=prefix + "hot", tier="t"))
            if tags is not None:
                tags.append(True)
        if i < distinct:
            out.append(sc.rl_message(key="%s%d" % (prefix, i), tier="t"))
            if tags is not None:
                tags.append(False)
    return out


def test_decisions_in_one_call_count_exactly(agent, redis):
    """400 pipelined decisions, 200 of one key (50/h) and 200 of fresh keys: the hot key
    is admitted exactly 50 times, every fresh key once, nothing degraded, and Redis saw
    fewer script calls than decisions (they went in batches)."""
    a = agent(redis=redis, metrics=True, **CFG)
    calls0 = script_calls(redis)
    tags = []
    vs = pipeline(a.addr, messages(200, 200, "bx-", tags), conns=4, window=128)
    assert all(v.get("degraded") is None for v in vs), [v for v in vs if v.get("degraded")]
    hot = [v for t, v in zip(tags, vs) if t]
    cold = [v for t, v in zip(tags, vs) if not t]
    assert len(hot) == 200 and len(cold) == 200
    assert sum(v["allow"] for v in hot) == 50, [v["allow"] for v in hot]
    assert all(v["allow"] == 1 for v in cold)
    # the denied ones say when: the bucket of 50/h refills one every 72 s
    assert all(v["retry_after"] >= 1 for v in hot if v["allow"] == 0)
    calls = script_calls(redis) - calls0
    assert calls < 400

    def counters():
        # published 4 times a second: wait for the last decisions to show
        m = scrape(a)
        got = (m.get("spoa_ratelimit_redis_batch_calls_total"),
               m.get("spoa_ratelimit_redis_batched_decisions_total"),
               m.get("spoa_ratelimit_redis_commands_total"))
        return got if got[2] >= 200 and got[0] else None
    wait_until(counters, 3, 0.05, "the Redis counters to be published")
    batches, batched, sent = counters()
    assert batched >= 2 * batches, (batches, batched)
    # every batch is one call, the other decisions sent went alone (the hot key's
    # requests are coalesced, and once denied answered by the blocked-key cache)
    assert calls <= batches + (sent - batched) and calls < sent, (calls, batches, batched, sent)


def test_batch_max_one_sends_every_decision_alone(agent, redis):
    """redis.batch_max = 1: one script call per decision, as before batching existed."""
    a = agent(redis=redis, metrics=True, redis_cfg={"batch_max": 1}, **CFG)
    calls0 = script_calls(redis)
    vs = pipeline(a.addr, messages(100, 100, "b1-"), conns=4, window=128)
    assert all(v.get("degraded") is None for v in vs)
    assert sum(v["allow"] for v in vs) == 50 + 100
    calls = script_calls(redis) - calls0
    assert calls >= 100     # the fresh keys; the hot one's are coalesced, then cached
    # every decision sent went in a call of its own
    wait_until(lambda: scrape(a).get("spoa_ratelimit_redis_commands_total") >= calls, 3, 0.05,
               "the counters to be published")
    m = scrape(a)
    assert m.get("spoa_ratelimit_redis_batch_calls_total") == 0
    assert m.get("spoa_ratelimit_redis_batched_decisions_total") == 0


def test_a_flushed_script_is_loaded_again_for_a_whole_batch(agent, redis):
    """SCRIPT FLUSH between two bursts: the batch calls fail with NOSCRIPT, each of their
    decisions is sent again with the script's body and answered as usual."""
    a = agent(redis=redis, metrics=True, **CFG)
    vs = pipeline(a.addr, messages(0, 100, "bf1-"), conns=4, window=128)
    assert all(v.get("degraded") is None and v["allow"] == 1 for v in vs)
    assert redis.cmd("SCRIPT", "FLUSH") == "OK"
    vs = pipeline(a.addr, messages(100, 100, "bf2-"), conns=4, window=128)
    assert all(v.get("degraded") is None for v in vs), [v for v in vs if v.get("degraded")]
    assert sum(v["allow"] for v in vs) == 50 + 100
    assert scrape(a).get("spoa_ratelimit_redis_breaker_opened_total") == 0


def two_decisions_apart(a, redis, gap_s, max_gap_s, tries=5):
    """Two decisions of fresh keys on one connection, their NOTIFYs written <gap_s> apart
    (so the agent reads them in two loop turns): the script calls Redis saw for them.
    A machine too busy to keep the gap within <max_gap_s> is given another try."""
    import time
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(tries):
            calls0 = script_calls(redis)
            t0 = time.monotonic()
            c.send(sc.notify(10 + 4 * i, 1, [sc.rl_message(key="bw-a%d" % i, tier="t")]))
            time.sleep(gap_s)
            c.send(sc.notify(12 + 4 * i, 1, [sc.rl_message(key="bw-b%d" % i, tier="t")]))
            gap = time.monotonic() - t0
            acks = [c.recv_frame(timeout=5), c.recv_frame(timeout=5)]
            assert all(sc.ack_vars(f.payload)["allow"] == 1 for f in acks), acks
            if gap < max_gap_s:
                return script_calls(redis) - calls0
    raise AssertionError("the two NOTIFYs were never written within %.0f ms of each other"
                         % (max_gap_s * 1000))


def test_batch_wait_gathers_decisions_of_several_turns(agent, redis):
    """redis.batch_wait_us: a partial batch waits that long for more decisions, so two
    NOTIFYs read a millisecond apart share one script call; without it (the default)
    each leaves at the end of its own turn, in a call of its own."""
    waiting = agent(redis=redis, metrics=True,
                    redis_cfg={"batch_wait_us": 5000, "command_timeout_ms": 20}, **CFG)
    assert two_decisions_apart(waiting, redis, 0.001, 0.003) == 1
    wait_until(lambda: scrape(waiting).get("spoa_ratelimit_redis_batched_decisions_total") == 2,
               3, 0.05, "the batch counters to be published")
    m = scrape(waiting)
    assert m.get("spoa_ratelimit_redis_batch_calls_total") == 1
    at_once = agent(redis=redis, name="agent-2", **CFG)
    assert two_decisions_apart(at_once, redis, 0.02, 1.0) == 2


def test_a_waiting_batch_leaving_full_samples_redis_not_the_wait(agent, redis):
    """A decision that waited in a partial batch (redis.batch_wait_us) until a later one
    filled it: what its round trip tells the adaptive concurrency limit and the node's
    latency (/status) is Redis's time from when the batch left, not the wait. The wait
    was counted when the batch was full (it left from the flusher, not the timer): ten
    pairs of decisions 4 ms apart, two a batch, put the first of each at over 4 ms, the
    node's p90 in the 6.4 ms bucket."""
    import time
    from test_status import status_json
    a = agent(redis=redis, metrics=True,
              redis_cfg={"batch_wait_us": 5000, "batch_max": 2, "command_timeout_ms": 20},
              **CFG)
    calls0 = script_calls(redis)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(10):
            c.send(sc.notify(10 + 4 * i, 1, [sc.rl_message(key="bl-a%d" % i, tier="t")]))
            time.sleep(0.004)
            c.send(sc.notify(12 + 4 * i, 1, [sc.rl_message(key="bl-b%d" % i, tier="t")]))
            acks = [c.recv_frame(timeout=5), c.recv_frame(timeout=5)]
            assert all(sc.ack_vars(f.payload)["allow"] == 1 for f in acks), acks
    # at least two pairs shared a call (a busy machine may stretch some gaps past the
    # wait): two of the node's twenty samples are enough to put its p90 at 6.4 ms
    calls = script_calls(redis) - calls0
    assert calls <= 18, "%d calls: the machine never kept the 4 ms gaps" % calls
    [node] = status_json(a)["redis"]["nodes"]
    assert node["replies"] >= 10 and node["p90_ms"] is not None
    assert node["p90_ms"] <= 3.2, node              # bucket bounds: ... 1.6, 3.2, 6.4 ms
    assert node["limit"] == 256, node               # never cut: no reply was late
