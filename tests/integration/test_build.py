"""The build itself: a missing generator fails it loudly and leaves nothing half written,
so the next `make` generates the file again (a missing xxd once left a broken
build/gen/scripts.c that later builds kept). Runs make in a temporary build directory."""
import shutil
import subprocess

from conftest import REPO

MAKE = shutil.which("make") or "/usr/bin/make"


def make(build, target, path=None):
    env = {"PATH": path} if path is not None else None
    return subprocess.run([MAKE, "-s", "BUILD=%s" % build, "%s/%s" % (build, target)],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=120)


def test_missing_xxd_fails_loudly_and_leaves_no_file(tmp_path):
    build = tmp_path / "b"
    r = make(build, "gen/ratelimit.lua")                   # cat: with the usual PATH
    assert r.returncode == 0, r.stdout + r.stderr
    # no xxd (nor anything else) on PATH: the recipe stops at its first step
    r = make(build, "gen/scripts.c", path=str(tmp_path / "empty"))
    assert r.returncode != 0
    assert "xxd not found" in r.stderr, r.stderr
    assert not (build / "gen" / "scripts.c").exists()
    assert not (build / "gen" / "scripts.c.tmp").exists()
    # with xxd back, the same target is generated, complete
    r = make(build, "gen/scripts.c")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (build / "gen" / "scripts.c").read_text()
    assert text.count("0x00 };") == 2 and "script_heartbeat_len" in text
