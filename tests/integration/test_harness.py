"""Self-checks of the test harness (conftest.py): Redis control and the structured-field
parser. Fast, and independent of the agent."""

import pytest

from conftest import parse_sf_list, to_libconfig


def test_redis_stop_start(redis):
    assert redis.cmd("SET", "k", "v") == "OK"
    assert redis.cmd("GET", "k") == "v"
    redis.stop()
    assert not redis.alive() and not redis.ping()
    redis.start()
    assert redis.ping()
    assert redis.cmd("GET", "k") is None        # no persistence: a fresh server


def test_sf_list_parser():
    assert parse_sf_list('"free_rps";q=5;w=1, "free_day";q=1000;w=86400') == [
        ("free_rps", {"q": 5, "w": 1}), ("free_day", {"q": 1000, "w": 86400})]
    assert parse_sf_list('"a\\"b";r=0;t=12') == [('a"b', {"r": 0, "t": 12})]
    assert parse_sf_list('tok;x;y=?0,  2;z=1.5') == [
        ("tok", {"x": True, "y": False}), (2, {"z": 1.5})]
    for bad in ('"unterminated', '"a";Q=1', '"a",', '"a" "b"', '"a";q=', '"a";q=1234567890123456'):
        with pytest.raises(ValueError):
            parse_sf_list(bad)


def test_libconfig_rendering():
    text = to_libconfig({"a": 1, "b": "x\"y", "c": {"d": [1, 2], "e": True}})
    assert text == 'a = 1;\nb = "x\\"y";\nc = {\n  d = [ 1, 2 ];\n  e = true;\n};\n'
