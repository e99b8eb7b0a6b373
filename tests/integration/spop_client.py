"""A small SPOP 2.0 codec and raw client, written from doc/SPOP.md.

Used by the protocol tests (to talk to the agent without HAProxy) and by fake_agent.py (to
play an agent behind a real HAProxy). Everything is plain `struct`/`socket`; no third-party
modules.

Layout: varints (SPOP.md §2), typed data (§3), KV lists and HELLO/DISCONNECT (§4),
NOTIFY/ACK payloads (§5), framing (§1), then a blocking client over a socket.
"""

import ipaddress
import select
import socket
import struct
import time

# ---- frame types (§1.2) ----
T_UNSET = 0
T_HAPROXY_HELLO = 1
T_HAPROXY_DISCONNECT = 2
T_NOTIFY = 3
T_AGENT_HELLO = 101
T_AGENT_DISCONNECT = 102
T_ACK = 103

FLAG_FIN = 0x00000001
FLAG_ABORT = 0x00000002

# ---- typed data ids (§3) ----
D_NULL = 0
D_BOOL = 1
D_INT32 = 2
D_UINT32 = 3
D_INT64 = 4
D_UINT64 = 5
D_IPV4 = 6
D_IPV6 = 7
D_STRING = 8
D_BINARY = 9

# ---- ACK actions and scopes (§5.2) ----
A_SET_VAR = 1
A_UNSET_VAR = 2
SCOPE_PROC, SCOPE_SESS, SCOPE_TXN, SCOPE_REQ, SCOPE_RES = 0, 1, 2, 3, 4

# ---- disconnect status codes (§4.4) ----
ST_NONE = 0
ST_IO = 1
ST_TOUT = 2
ST_TOO_BIG = 3
ST_INVALID = 4
ST_NO_VSN = 5
ST_NO_FRAME_SIZE = 6
ST_NO_CAP = 7
ST_BAD_VSN = 8
ST_BAD_FRAME_SIZE = 9
ST_FRAG_NOT_SUPPORTED = 10
ST_INTERLACED = 11
ST_FRAMEID_NOTFOUND = 12
ST_RES = 13
ST_UNKNOWN = 99

U64 = (1 << 64) - 1


class SpopError(Exception):
    """Malformed input for the decoder."""


# ---------------------------------------------------------------------------------------
# Varints (§2)

def encode_varint(v):
    """Encode an integer (negative values as 64-bit two's complement)."""
    v &= U64
    if v < 240:
        return bytes([v])
    out = bytearray([0xF0 | (v & 0x0F)])
    v = (v - 240) >> 4
    while v >= 128:
        out.append(0x80 | (v & 0x7F))
        v = (v - 128) >> 7
    out.append(v)
    return bytes(out)


def decode_varint(buf, off=0):
    """Return (value, new_offset). Raises SpopError on truncation or > 10 bytes."""
    if off >= len(buf):
        raise SpopError("varint: end of buffer")
    v = buf[off]
    off += 1
    if v < 240:
        return v, off
    shift = 4
    n = 1
    while True:
        if off >= len(buf):
            raise SpopError("varint: truncated")
        if n >= 10:
            raise SpopError("varint: longer than 10 bytes")
        b = buf[off]
        off += 1
        n += 1
        v = (v + (b << shift)) & U64
        shift += 7
        if b < 128:
            return v, off


def to_signed64(v):
    return v - (1 << 64) if v >= (1 << 63) else v


# ---------------------------------------------------------------------------------------
# Typed data (§3)

class Typed:
    """A value with an explicit SPOP type, for when the Python type is ambiguous."""

    __slots__ = ("type", "value")

    def __init__(self, type_, value):
        self.type = type_
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Typed) and (self.type, self.value) == (other.type, other.value)

    def __repr__(self):
        return "Typed(%d, %r)" % (self.type, self.value)


def Int32(v):
    return Typed(D_INT32, v)


def UInt32(v):
    return Typed(D_UINT32, v)


def Int64(v):
    return Typed(D_INT64, v)


def UInt64(v):
    return Typed(D_UINT64, v)


def _encode_str(b):
    if isinstance(b, str):
        b = b.encode()
    return encode_varint(len(b)) + b


def encode_typed(value):
    """Encode a Python value: None->NULL, bool->BOOL, int->INT64, str->STRING,
    bytes->BINARY, IPv4Address/IPv6Address->IPV4/IPV6, Typed->as given."""
    if isinstance(value, Typed):
        t, v = value.type, value.value
    elif value is None:
        t, v = D_NULL, None
    elif isinstance(value, bool):
        t, v = D_BOOL, value
    elif isinstance(value, int):
        t, v = D_INT64, value
    elif isinstance(value, str):
        t, v = D_STRING, value
    elif isinstance(value, (bytes, bytearray)):
        t, v = D_BINARY, bytes(value)
    elif isinstance(value, ipaddress.IPv4Address):
        t, v = D_IPV4, value
    elif isinstance(value, ipaddress.IPv6Address):
        t, v = D_IPV6, value
    else:
        raise TypeError("cannot encode %r" % (value,))
    if t == D_NULL:
        return b"\x00"
    if t == D_BOOL:
        return bytes([0x11 if v else 0x01])
    if t in (D_INT32, D_UINT32, D_INT64, D_UINT64):
        return bytes([t]) + encode_varint(v)
    if t == D_IPV4:
        return bytes([t]) + ipaddress.IPv4Address(v).packed
    if t == D_IPV6:
        return bytes([t]) + ipaddress.IPv6Address(v).packed
    if t in (D_STRING, D_BINARY):
        return bytes([t]) + _encode_str(v)
    raise TypeError("bad type id %d" % t)


def decode_typed(buf, off=0):
    """Return (Typed, new_offset). Integers of signed types come back signed; STRING as
    str when it is valid UTF-8 (else bytes); IPs as ipaddress objects."""
    if off >= len(buf):
        raise SpopError("typed: end of buffer")
    tb = buf[off]
    off += 1
    t, flags = tb & 0x0F, tb & 0xF0
    if t == D_NULL:
        return Typed(D_NULL, None), off
    if t == D_BOOL:
        return Typed(D_BOOL, bool(flags & 0x10)), off
    if t in (D_INT32, D_UINT32, D_INT64, D_UINT64):
        v, off = decode_varint(buf, off)
        if t in (D_INT32, D_INT64):
            v = to_signed64(v)
        return Typed(t, v), off
    if t == D_IPV4:
        if len(buf) - off < 4:
            raise SpopError("typed: truncated ipv4")
        return Typed(t, ipaddress.IPv4Address(bytes(buf[off:off + 4]))), off + 4
    if t == D_IPV6:
        if len(buf) - off < 16:
            raise SpopError("typed: truncated ipv6")
        return Typed(t, ipaddress.IPv6Address(bytes(buf[off:off + 16]))), off + 16
    if t in (D_STRING, D_BINARY):
        n, off = decode_varint(buf, off)
        if n > len(buf) - off:
            raise SpopError("typed: truncated string")
        raw = bytes(buf[off:off + n])
        off += n
        if t == D_STRING and flags == 0:
            try:
                return Typed(t, raw.decode()), off
            except UnicodeDecodeError:
                return Typed(t, raw), off
        return Typed(t, raw), off
    raise SpopError("typed: unknown type id %d" % t)


def decode_name(buf, off):
    """A STRING without type byte (KV keys, message/arg/var names)."""
    n, off = decode_varint(buf, off)
    if n > len(buf) - off:
        raise SpopError("name: truncated")
    return bytes(buf[off:off + n]).decode("utf-8", "replace"), off + n


# ---------------------------------------------------------------------------------------
# KV lists, HELLO, DISCONNECT (§4)

def encode_kv(items):
    """items: iterable of (key, value) pairs; value as for encode_typed."""
    out = bytearray()
    for k, v in items:
        out += _encode_str(k)
        out += encode_typed(v)
    return bytes(out)


def decode_kv(buf):
    """Return a dict key -> Typed (last one wins)."""
    out = {}
    off = 0
    while off < len(buf):
        k, off = decode_name(buf, off)
        v, off = decode_typed(buf, off)
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------
# NOTIFY and ACK payloads (§5)

def encode_messages(messages):
    """messages: list of (name, args); args: list of (argname, value) or a dict."""
    out = bytearray()
    for name, args in messages:
        if isinstance(args, dict):
            args = list(args.items())
        if len(args) > 255:
            raise ValueError("at most 255 args")
        out += _encode_str(name)
        out.append(len(args))
        for an, av in args:
            out += _encode_str(an)
            out += encode_typed(av)
    return bytes(out)


def decode_messages(buf):
    """Return a list of (name, [(argname, Typed), ...])."""
    msgs = []
    off = 0
    while off < len(buf):
        name, off = decode_name(buf, off)
        if off >= len(buf):
            raise SpopError("message: missing nb-args")
        nb = buf[off]
        off += 1
        args = []
        for _ in range(nb):
            an, off = decode_name(buf, off)
            av, off = decode_typed(buf, off)
            args.append((an, av))
        msgs.append((name, args))
    return msgs


def encode_actions(actions):
    """actions: list of ("set", scope, name, value) or ("unset", scope, name)."""
    out = bytearray()
    for a in actions:
        if a[0] == "set":
            _, scope, name, value = a
            out += bytes([A_SET_VAR, 3, scope]) + _encode_str(name) + encode_typed(value)
        elif a[0] == "unset":
            _, scope, name = a
            out += bytes([A_UNSET_VAR, 2, scope]) + _encode_str(name)
        else:
            raise ValueError(a[0])
    return bytes(out)


def decode_actions(buf):
    """Return a list of ("set", scope, name, Typed) / ("unset", scope, name)."""
    acts = []
    off = 0
    while off < len(buf):
        if len(buf) - off < 3:
            raise SpopError("action: truncated header")
        atype, nb, scope = buf[off], buf[off + 1], buf[off + 2]
        off += 3
        name, off = decode_name(buf, off)
        if atype == A_SET_VAR:
            if nb != 3:
                raise SpopError("set-var with %d args" % nb)
            val, off = decode_typed(buf, off)
            acts.append(("set", scope, name, val))
        elif atype == A_UNSET_VAR:
            if nb != 2:
                raise SpopError("unset-var with %d args" % nb)
            acts.append(("unset", scope, name))
        else:
            raise SpopError("unknown action type %d" % atype)
    return acts


def ack_vars(payload):
    """Decode an ACK payload into {name: python value} for set-var actions (any scope)."""
    return {a[2]: a[3].value for a in decode_actions(payload) if a[0] == "set"}


# ---------------------------------------------------------------------------------------
# Framing (§1)

class Frame:
    __slots__ = ("type", "flags", "sid", "fid", "payload")

    def __init__(self, type_, flags, sid, fid, payload):
        self.type, self.flags, self.sid, self.fid, self.payload = type_, flags, sid, fid, payload

    def kv(self):
        return decode_kv(self.payload)

    def __repr__(self):
        return "Frame(type=%d flags=%#x sid=%d fid=%d len=%d)" % (
            self.type, self.flags, self.sid, self.fid, len(self.payload))


def encode_frame(ftype, sid, fid, payload=b"", flags=FLAG_FIN):
    body = bytes([ftype]) + struct.pack(">I", flags) + encode_varint(sid) + encode_varint(fid)
    body += payload
    return struct.pack(">I", len(body)) + body


def decode_frame_body(body):
    """Decode a frame without its 4-byte length prefix."""
    if len(body) < 7:
        raise SpopError("frame shorter than 7 bytes")
    ftype = body[0]
    flags = struct.unpack(">I", body[1:5])[0]
    sid, off = decode_varint(body, 5)
    fid, off = decode_varint(body, off)
    return Frame(ftype, flags, sid, fid, bytes(body[off:]))


def split_frames(buf):
    """Split complete frames off the front of <buf>; return (frames, rest)."""
    frames = []
    off = 0
    while len(buf) - off >= 4:
        n = struct.unpack(">I", buf[off:off + 4])[0]
        if len(buf) - off - 4 < n:
            break
        frames.append(decode_frame_body(buf[off + 4:off + 4 + n]))
        off += 4 + n
    return frames, buf[off:]


def haproxy_hello(max_frame_size=16380, capabilities="pipelining", engine_id=None,
                  healthcheck=False, versions="2.0"):
    items = [("supported-versions", versions),
             ("max-frame-size", UInt32(max_frame_size)),
             ("capabilities", capabilities)]
    if engine_id is not None:
        items.append(("engine-id", engine_id))
    if healthcheck:
        items.append(("healthcheck", True))
    return encode_frame(T_HAPROXY_HELLO, 0, 0, encode_kv(items))


def agent_hello(max_frame_size=16380, capabilities="pipelining", version="2.0"):
    return encode_frame(T_AGENT_HELLO, 0, 0, encode_kv([
        ("version", version),
        ("max-frame-size", UInt32(max_frame_size)),
        ("capabilities", capabilities)]))


def disconnect(ftype, status, message=""):
    return encode_frame(ftype, 0, 0, encode_kv([("status-code", UInt32(status)),
                                                 ("message", message)]))


def haproxy_disconnect(status=0, message="normal"):
    return disconnect(T_HAPROXY_DISCONNECT, status, message)


def notify(sid, fid, messages):
    return encode_frame(T_NOTIFY, sid, fid, encode_messages(messages))


def ack(sid, fid, actions):
    return encode_frame(T_ACK, sid, fid, encode_actions(actions))


def rl_message(key=None, ip="127.0.0.1", tier=None, method="GET", path="/", cost=None,
               name="rl-req"):
    """The `rl-req` message as haproxy/spoe-ratelimit.conf sends it."""
    args = [("key", key), ("tier", tier), ("ip", ipaddress.ip_address(ip)),
            ("method", method), ("path", path)]
    if cost is not None:
        args.append(("cost", cost))
    return (name, args)


# ---------------------------------------------------------------------------------------
# Blocking client

class SpopClient:
    """One TCP connection to an agent, speaking as HAProxy would."""

    def __init__(self, addr, timeout=5.0):
        """<addr>: (host, port) or a unix socket path."""
        if isinstance(addr, str):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(addr)
        else:
            self.sock = socket.create_connection(addr, timeout=timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.frames = []
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        r, _, _ = select.select([self.sock], [], [], remaining)
        if not r:
            return False
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        frames, self.buf = split_frames(self.buf)
        self.frames.extend(frames)
        return True

    def recv_frame(self, timeout=None):
        """Next frame, or None on EOF/timeout (check .eof)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.frames:
            if self.eof or not self._fill(deadline):
                return None
        return self.frames.pop(0)

    def wait_closed(self, timeout=None):
        """True if the peer closes the connection before the deadline (frames are kept)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.eof:
            if not self._fill(deadline) and not self.eof:
                if time.monotonic() >= deadline:
                    return False
        return True

    def hello(self, **kw):
        """Send a HAPROXY-HELLO; return the AGENT-HELLO frame (asserting its type)."""
        self.send(haproxy_hello(**kw))
        f = self.recv_frame()
        if f is None or f.type != T_AGENT_HELLO:
            raise AssertionError("expected AGENT-HELLO, got %r" % (f,))
        return f

    def request(self, sid, fid, messages, timeout=None):
        """Send one NOTIFY and wait for its ACK; return {var: value}."""
        self.send(notify(sid, fid, messages))
        f = self.recv_frame(timeout)
        if f is None or f.type != T_ACK or (f.sid, f.fid) != (sid, fid):
            raise AssertionError("expected ACK %d/%d, got %r" % (sid, fid, f))
        return ack_vars(f.payload)
