"""Configuration reload on SIGHUP: a good file takes effect without dropping connections,
a broken one is refused and the last good configuration keeps running."""

import spop_client as sc
from conftest import DEFAULT_LIMITS, parse_sf_list, wait_until


def policy_q(c, sid, key, rule):
    v = c.request(sid, 1, [sc.rl_message(key=key)])
    return dict(parse_sf_list(v["policy"]))[rule]["q"]


def test_reload_good_config(agent, redis):
    a = agent(redis=redis)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert policy_q(c, 1, "rl-a", "key_rpm") == 5
        limits = dict(DEFAULT_LIMITS, key_rpm={"rate": 2, "period": "1m"})
        a.reload(limits=limits)
        sid = [1]

        def reloaded():
            sid[0] += 2
            return policy_q(c, sid[0], "rl-b-%d" % sid[0], "key_rpm") == 2
        # the connection opened before the reload keeps working and sees the new limits
        wait_until(reloaded, 5, 0.05, "new limits after SIGHUP")
        statuses = [c.request(500 + 2 * i, 1, [sc.rl_message(key="rl-new")])["allow"]
                    for i in range(3)]
        assert statuses == [1, 1, 0]
    assert a.alive()


def test_reload_broken_config_keeps_last_good(agent, redis):
    a = agent(redis=redis)
    good = a.conf_path.read_text()
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert policy_q(c, 1, "rb-a", "key_rpm") == 5
        a.reload(text=good.replace('rate = 5;', 'rate = 0;'))          # invalid value
        errs = lambda: a.proc.log_text().count("%s:" % a.conf_path)   # noqa: E731
        wait_until(lambda: errs() >= 1, 5, 0.05, "reload error logged")
        a.reload(text=good.replace('listen =', 'listen ='[:-1]))      # syntax error
        wait_until(lambda: errs() >= 2, 5, 0.05, "2nd reload error logged")
        assert a.alive()
        assert policy_q(c, 3, "rb-b", "key_rpm") == 5
    # and a new connection is served with the old configuration too
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert policy_q(c, 1, "rb-c", "key_rpm") == 5
    log = a.proc.log_text()
    # the errors name the file and line, like -c does
    assert "%s:" % a.conf_path in log, log[-2000:]
    assert log.count("%s:" % a.conf_path) >= 2, log[-2000:]
