"""The Python SPOP codec (spop_client.py) against the vectors of doc/SPOP.md §2 and §9.
No processes: these check the test tool itself, so that protocol tests can be trusted."""

import ipaddress

import pytest

import spop_client as sc

VARINTS = [
    (0, "00"), (1, "01"), (41, "29"), (200, "c8"), (239, "ef"), (240, "f000"),
    (241, "f100"), (255, "ff00"), (256, "f001"), (2287, "ff7f"), (2288, "f08000"),
    (2289, "f18000"), (16380, "fcf006"), (65535, "fff01e"), (264431, "ffff7f"),
    (264432, "f0808000"), (300000, "f0af9100"), (33818864, "f080808000"),
    (4294967295, "fff0fefe7e"), (4328786160, "f08080808000"),
    (2**63 - 1, "fff0fefefefefefefe06"), (-2, "fef0fefefefefefefe0e"),
    (-5, "fbf0fefefefefefefe0e"), (2**64 - 1, "fff0fefefefefefefe0e"),
]

HELLO_26 = bytes.fromhex(
    "000000810100000001000012737570706f727465642d76657273696f6e730803322e300e6d61782d667261"
    "6d652d73697a6503fcf0060c6361706162696c69746965730810706970656c696e696e672c6173796e6309"
    "656e67696e652d6964082462373232313432362d333861362d343333392d613665312d3636363239393735"
    "35383435")

HEALTHCHECK_HELLO = bytes.fromhex(
    "0000004e0100000001000012737570706f727465642d76657273696f6e730803322e300e6d61782d667261"
    "6d652d73697a6503fcf0060c6361706162696c697469657308000b6865616c7468636865636b11")

AGENT_HELLO = bytes.fromhex(
    "00000040650000000100000776657273696f6e0803322e300e6d61782d6672616d652d73697a6503fcf006"
    "0c6361706162696c6974696573080a706970656c696e696e67")

NOTIFY_26 = bytes.fromhex(
    "0000009d03000000010001077265712d6d73670d027561080d6375726c2d746573742f312e30026970067f"
    "0000010470617468080a2f736f6d652f70617468036e756d0429046d657468080347455404666c61671107"
    "6d697373696e67000276360720010db80000000000000000000000020362696e090300ff10036e656704fe"
    "f0fefefefefefefe0e0362696704f0af910005656d707479080000067f000001")

ACK_92 = bytes.fromhex(
    "000000ca67000000010001010302027561080d6375726c2d746573742f312e30010302026970067f000001"
    "010302036e756d042a010302036e656704fbf0fefefefefefefe0e0103020362696703f0af910001030204"
    "666c61671101030205666c616766010103020276360720010db80000000000000000000000010103020362"
    "696e09030001fe01030107736573737661720804732d6f6b010303067265717661720804722d6f6b010302"
    "0b6e6f746465636c6172656408017801030206"
    "6e756c6c656400020202046e6f7065")


@pytest.mark.parametrize("value,hexstr", VARINTS)
def test_varint_vectors(value, hexstr):
    assert sc.encode_varint(value).hex() == hexstr
    v, off = sc.decode_varint(bytes.fromhex(hexstr))
    assert off == len(hexstr) // 2
    assert v == value & (2**64 - 1)


def test_varint_rejects_truncated_and_overlong():
    with pytest.raises(sc.SpopError):
        sc.decode_varint(bytes.fromhex("f080"))
    with pytest.raises(sc.SpopError):
        sc.decode_varint(bytes.fromhex("ff" + "80" * 10 + "00"))


def test_haproxy_hello_26_vector():
    frames, rest = sc.split_frames(HELLO_26)
    assert rest == b"" and len(frames) == 1
    f = frames[0]
    assert (f.type, f.flags, f.sid, f.fid) == (sc.T_HAPROXY_HELLO, sc.FLAG_FIN, 0, 0)
    kv = f.kv()
    assert kv["supported-versions"].value == "2.0"
    assert kv["max-frame-size"] == sc.UInt32(16380)
    assert kv["capabilities"].value == "pipelining,async"
    assert kv["engine-id"].value == "b7221426-38a6-4339-a6e1-666299755845"
    # and our builder produces the same bytes
    assert sc.haproxy_hello(16380, "pipelining,async",
                            "b7221426-38a6-4339-a6e1-666299755845") == HELLO_26


def test_healthcheck_hello_vector():
    assert sc.haproxy_hello(16380, "", healthcheck=True) == HEALTHCHECK_HELLO


def test_agent_hello_vector():
    assert sc.agent_hello(16380) == AGENT_HELLO


def test_notify_26_vector():
    frames, _ = sc.split_frames(NOTIFY_26)
    f = frames[0]
    assert (f.type, f.flags, f.sid, f.fid) == (sc.T_NOTIFY, sc.FLAG_FIN, 0, 1)
    msgs = sc.decode_messages(f.payload)
    assert len(msgs) == 1
    name, args = msgs[0]
    assert name == "req-msg"
    got = [(n, t.type, t.value) for n, t in args]
    assert got == [
        ("ua", sc.D_STRING, "curl-test/1.0"),
        ("ip", sc.D_IPV4, ipaddress.ip_address("127.0.0.1")),
        ("path", sc.D_STRING, "/some/path"),
        ("num", sc.D_INT64, 41),
        ("meth", sc.D_STRING, "GET"),
        ("flag", sc.D_BOOL, True),
        ("missing", sc.D_NULL, None),
        ("v6", sc.D_IPV6, ipaddress.ip_address("2001:db8::2")),
        ("bin", sc.D_BINARY, b"\x00\xff\x10"),
        ("neg", sc.D_INT64, -2),
        ("big", sc.D_INT64, 300000),
        ("empty", sc.D_STRING, ""),
        ("", sc.D_IPV4, ipaddress.ip_address("127.0.0.1")),
    ]
    # re-encoding gives the captured bytes back
    assert sc.notify(0, 1, [(name, [(n, t) for n, t in args])]) == NOTIFY_26


def test_ack_92_vector():
    frames, _ = sc.split_frames(ACK_92)
    f = frames[0]
    assert (f.type, f.sid, f.fid) == (sc.T_ACK, 0, 1)
    acts = sc.decode_actions(f.payload)
    assert acts[0] == ("set", sc.SCOPE_TXN, "ua", sc.Typed(sc.D_STRING, "curl-test/1.0"))
    assert acts[3] == ("set", sc.SCOPE_TXN, "neg", sc.Typed(sc.D_INT64, -5))
    assert acts[4] == ("set", sc.SCOPE_TXN, "big", sc.UInt32(300000))
    assert acts[6] == ("set", sc.SCOPE_TXN, "flagf", sc.Typed(sc.D_BOOL, False))
    assert acts[9] == ("set", sc.SCOPE_SESS, "sessvar", sc.Typed(sc.D_STRING, "s-ok"))
    assert acts[10][1] == sc.SCOPE_REQ
    assert acts[12] == ("set", sc.SCOPE_TXN, "nulled", sc.Typed(sc.D_NULL, None))
    assert acts[13] == ("unset", sc.SCOPE_TXN, "nope")
    assert sc.ack(0, 1, acts) == ACK_92


def test_small_vectors():
    assert sc.ack(1, 1, [("set", sc.SCOPE_TXN, "score", sc.Int32(87))]).hex() == \
        "00000012670000000101010103020573636f72650257"
    assert sc.encode_frame(sc.T_ACK, 3, 1).hex() == "0000000767000000010301"
    assert sc.disconnect(sc.T_AGENT_DISCONNECT, 99, "agent says bye").hex() == (
        "0000002d660000000100000b7374617475732d636f64650363076d657373616765080e6167656e742073"
        "61797320627965")
    assert sc.disconnect(sc.T_AGENT_DISCONNECT, 0, "").hex() == (
        "0000001f660000000100000b7374617475732d636f64650300076d6573736167650800")
    assert sc.haproxy_disconnect(0, "normal").hex() == (
        "00000025020000000100000b7374617475732d636f64650300076d65737361676508066e6f726d616c")


def test_split_frames_partial():
    data = sc.agent_hello() + sc.ack(5, 2, [("set", sc.SCOPE_TXN, "a", 1)])
    for cut in range(len(data)):
        frames, rest = sc.split_frames(data[:cut])
        frames2, rest2 = sc.split_frames(rest + data[cut:])
        assert [f.type for f in frames + frames2] == [sc.T_AGENT_HELLO, sc.T_ACK]
        assert rest2 == b""
