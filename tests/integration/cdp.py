"""A small Chrome DevTools Protocol client for the tests: Debian's headless chromium driven
over --remote-debugging-pipe (fd 3 carries the commands in, fd 4 the replies and events out,
each message a JSON text ended by a NUL byte), to measure a page's layout in a real browser,
emulate a screen size and take screenshots.

Every wait is bounded; the browser runs in a session (process group) of its own, which
close() kills whole, whatever state it is in:

    with Browser(tmp) as b:
        b.viewport(1280, 800)
        b.goto(url)
        b.wait("document.readyState === 'complete'")
        width = b.eval("document.documentElement.scrollWidth")
        b.screenshot(path)
"""
import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import time

CHROMIUM = shutil.which("chromium")


class CdpError(Exception):
    pass


class Browser:
    def __init__(self, tmp, name="cdp", timeout=30.0):
        """Starts chromium with a profile under <tmp>/<name>-profile and opens one blank
        tab. <timeout>: the longest any one command waits for its reply."""
        self.timeout = timeout
        self.events, self.log = [], []
        self._buf, self._id, self.session = b"", 0, None
        prof = tmp / ("%s-profile" % name)
        prof.mkdir(exist_ok=True)
        cmd_r, cmd_w = os.pipe()        # we write commands, chromium reads them on fd 3
        out_r, out_w = os.pipe()        # chromium writes on fd 4, we read
        # high numbers, so that "3<&N 4>&M" cannot overwrite one with the other (bash: dash
        # takes one-digit descriptors only)
        hi_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 20)
        hi_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 20)
        os.close(cmd_r)
        os.close(out_w)
        argv = ["/bin/bash", "-c", 'exec "$0" "$@" 3<&%d 4>&%d %d<&- %d>&-' % (
                    hi_r, hi_w, hi_r, hi_w),
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                "--disable-sync", "--hide-scrollbars", "--mute-audio",
                "--user-data-dir=%s" % prof, "--remote-debugging-pipe", "about:blank"]
        self.errlog = open(tmp / ("%s-chromium.log" % name), "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.errlog,
                                     stderr=subprocess.STDOUT, pass_fds=(hi_r, hi_w),
                                     env=dict(os.environ, HOME=str(prof)),
                                     start_new_session=True)
        os.close(hi_r)
        os.close(hi_w)
        self.w, self.r = cmd_w, out_r
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target,
                                     flatten=True)["sessionId"]
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Log.enable")
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Asks the browser to close, then kills its process group (helpers included)."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self._send({"id": 10 ** 6, "method": "Browser.close"})
                self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)
        self.proc = None
        for fd in (self.w, self.r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.errlog.close()

    # ---- the protocol

    def _send(self, msg):
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self.w, data)
            data = data[n:]

    def _read(self, deadline):
        """The next message, or CdpError past <deadline> (time.monotonic())."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("no message from chromium in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise CdpError("chromium closed its pipe (exit %s)" % self.proc.poll())
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, timeout=None, **params):
        """Sends <method> (to the tab once attached) and returns its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise CdpError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            if "method" in m:
                self._event(m)

    def _event(self, m):
        self.events.append(m["method"])
        p = m.get("params", {})
        if m["method"] == "Log.entryAdded":
            self.log.append(p.get("entry", {}).get("text", ""))
        elif m["method"] == "Runtime.exceptionThrown":
            self.log.append(json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m["method"] == "Runtime.consoleAPICalled":
            self.log.append(" ".join(str(a.get("value")) for a in p.get("args", [])))

    # ---- what the tests use

    def viewport(self, width, height, mobile=False):
        """Emulates a screen of <width> x <height> CSS pixels (a phone when <mobile>)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=mobile)

    def goto(self, url):
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'")

    def eval(self, expression):
        """The value of a JavaScript <expression> in the page (JSON-able)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise CdpError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expression, timeout=15.0, every=0.1):
        """Waits until <expression> is truthy in the page; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.eval(expression)
            if v:
                return v
            if time.monotonic() >= deadline:
                raise CdpError("not true within %.0f s: %s" % (timeout, expression))
            time.sleep(every)

    def rect(self, selector):
        """The bounding box of the first element matching <selector>, in CSS pixels from the
        top left of the document (not the viewport), or None."""
        return self.eval("(function(){var e=document.querySelector(%s);if(!e)return null;"
                         "var r=e.getBoundingClientRect();return {x:r.left+scrollX,"
                         "y:r.top+scrollY,w:r.width,h:r.height};})()" % json.dumps(selector))

    def screenshot(self, path):
        """The viewport as a PNG file at <path>; returns its size in bytes."""
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        return len(data)

    def csp_violations(self):
        return [t for t in self.log if "Content Security Policy" in t]
