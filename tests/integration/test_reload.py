"""Configuration reload on SIGHUP: a good file takes effect without dropping connections,
a broken one is refused and the last good configuration keeps running."""

import signal
import socket
import time

import spop_client as sc
from conftest import (DEFAULT_LIMITS, agent_config, agent_env, free_port, parse_sf_list,
                      to_libconfig, wait_until)


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



def test_a_sighup_as_soon_as_the_port_answers_is_a_reload(procs, tmp, agent_bin):
    """The listeners open before the signal watchers exist; a SIGHUP sent the moment the
    port answers (a supervisor reloading a freshly started agent) used to end the process
    by SIGHUP's default action. It now waits and becomes a reload, in every round. The
    port is polled without a pause so the signal lands as early as a client can see it."""
    for rnd in range(20):
        port = free_port()
        conf = tmp / ("early-%d.conf" % rnd)
        conf.write_text(to_libconfig(agent_config("127.0.0.1:%d" % port, None, store="allow")))
        p = procs.spawn("early-%d" % rnd, [agent_bin, "-f", conf], env=agent_env())
        deadline = time.monotonic() + 15
        while True:
            s = socket.socket()
            try:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            finally:
                s.close()
            assert p.alive() and time.monotonic() < deadline, p.log_text()[-2000:]
        p.signal(signal.SIGHUP)
        wait_until(lambda: "reload (SIGHUP) ok" in p.log_text() or not p.alive(),
                   10, what="reload or exit")
        assert p.alive(), "ended by a SIGHUP at start-up (%r)\n%s" % (
            p.returncode(), p.log_text()[-2000:])
        assert p.stop() == 0
