"""The quota route of the sample gateway: GET /rate_limit is answered by HAProxy from the
agent's variables (cost 0: decided, nothing charged) and never reaches the application."""

import http.server
import json

import pytest

from conftest import HAProxy, StubApp, parse_sf_list, wait_until


class App(StubApp):
    """A stand-in application that records the paths it is asked for."""

    def __init__(self):
        self.paths = []
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                app.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_POST = do_GET

            def log_message(self, *a):
                pass

        super().__init__(Handler)


@pytest.fixture
def app():
    a = App()
    yield a
    a.close()


def quota(gw, **kw):
    r = gw.request("/rate_limit", **kw)
    assert r.status == 200, r
    assert r.h("Content-Type") == "application/json", r
    return r, json.loads(r.body)


def test_quota_route_reports_without_spending(redis, agent, procs, tmp, app):
    a = agent(redis=redis)                  # tier free: key_rpm 5/min, key_day 1000/day
    gw = HAProxy(procs, tmp, a.address, app.address)
    for i in range(8):                      # more than the limit: asking is free
        r, body = quota(gw, api_key="asker")
        policy = dict(parse_sf_list(r.h("RateLimit-Policy")))
        assert policy["key_rpm"] == {"q": 5, "w": 60}, r
        assert policy["key_day"] == {"q": 1000, "w": 86400}, r
        rl = parse_sf_list(r.h("RateLimit"))
        assert rl[0][0] == "key_rpm" and rl[0][1]["r"] == 5, r
        assert body["policy"] == r.h("RateLimit-Policy"), body
        assert body["ratelimit"] == r.h("RateLimit"), body
        assert body["rule"] == "key_rpm" and body["limit"] == 5 and body["remaining"] == 5, body
        assert body["degraded"] == 0, body
    # a real request spends one; the route shows it, and still spends nothing
    assert gw.request("/work", api_key="asker").status == 200
    for _ in range(3):
        r, body = quota(gw, api_key="asker")
        assert body["remaining"] == 4, body
        assert dict(parse_sf_list(r.h("RateLimit")))["key_rpm"]["r"] == 4, r
    # over the limit, the route still answers (remaining 0), with the wait in `t`
    sts = [gw.request("/work", api_key="asker").status for _ in range(5)]
    assert sts == [200] * 4 + [429], sts
    r, body = quota(gw, api_key="asker")
    assert body["remaining"] == 0 and body["reset"] >= 1, body
    # anonymous clients ask for their address's quota
    r, body = quota(gw, source="127.0.0.9")
    assert body["rule"] == "anon_rpm" and body["remaining"] == 3, body
    # the application saw the real requests only; other methods are not the route
    assert gw.request("/rate_limit", api_key="other", method="POST").status == 200
    assert app.paths == ["/work"] * 5 + ["/rate_limit"], app.paths


def test_quota_route_without_legacy_headers_and_without_agent(redis, agent, procs, tmp, app):
    a = agent(redis=redis, response={"legacy_headers": False})
    gw = HAProxy(procs, tmp, a.address, app.address)
    r, body = quota(gw, api_key="k")
    assert body["limit"] is None and body["remaining"] is None and body["reset"] is None, body
    assert dict(parse_sf_list(body["ratelimit"]))["key_rpm"]["r"] == 5, body
    # no answer from the agent: the quota is unknown, said so, and nothing reaches the app
    a.stop()
    r = wait_until(lambda: (lambda r: r if r.status == 503 else None)(
        gw.request("/rate_limit", api_key="k")), 10, what="503 without the agent")
    assert r.h("Content-Type") == "application/problem+json", r
    assert json.loads(r.body)["status"] == 503, r
    assert r.h("X-RateLimit-Agent-Error") is not None, r
    assert app.paths == [], app.paths
