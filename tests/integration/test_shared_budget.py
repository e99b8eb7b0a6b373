"""Two gateways (HAProxy + agent each) on one Redis enforce one budget per key."""

from conftest import parse_sf_list


def test_two_gateways_share_one_budget(redis, agent, haproxy):
    gws = []
    for i in range(2):
        a = agent(redis=redis, name="agent")
        gws.append(haproxy(a.address, tiers={"shared-pro": "pro"}))
    # free tier: 5/min. Alternate 14 requests over the two gateways.
    statuses = []
    for i in range(14):
        r = gws[i % 2].request("/", api_key="shared-free")
        assert r.h("X-RateLimit-Agent-Error") is None, r
        assert r.h("X-RateLimit-Degraded") is None, r
        statuses.append(r.status)
    assert statuses.count(200) == 5, statuses
    assert statuses == [200] * 5 + [429] * 9, statuses
    # pro tier (10/min), same shape
    statuses = []
    remaining = []
    for i in range(16):
        r = gws[i % 2].request("/", api_key="shared-pro")
        statuses.append(r.status)
        remaining.append(dict(parse_sf_list(r.h("RateLimit")))["pro_rpm"]["r"])
    assert statuses.count(200) == 10, statuses
    assert remaining[:10] == list(range(9, -1, -1)), remaining
    # the anonymous budget of one address is shared too
    statuses = [gws[i % 2].request("/", source="127.0.0.4").status for i in range(6)]
    assert statuses == [200] * 3 + [429] * 3, statuses
