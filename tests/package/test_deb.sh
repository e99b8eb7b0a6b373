#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The Debian package, end to end: build it (`make deb`: dpkg-buildpackage and
# lintian), check that the Makefile's VERSION, debian/changelog, the package
# and `spoa-ratelimit -V` agree, install it with dpkg -i, run the installed
# agent on the installed configuration, check the systemd unit, the user and
# the permissions, then remove and purge it and check that nothing is left but
# the system user (which Debian policy leaves in place).
#
#   tests/package/test_deb.sh                  build with `make deb`, then test
#   DEB=path/to/spoa-ratelimit_V_ARCH.deb tests/package/test_deb.sh
#                                              test a package built already
#
# Needs root (dpkg). Refuses to run if spoa-ratelimit is installed already.
# Whatever happens, the package is purged on exit, and the user and group are
# removed if the test created them. Not part of `make test`: `.ci/run` runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."

. tests/package/lib.sh

[ "$(id -u)" -eq 0 ] || fail "needs root (dpkg -i, dpkg --purge)"
pkg_present && fail "$PKG is installed already (state: $(pkg_state)); this test installs and purges it: purge it first"

user_before=no
getent passwd "$PKG" >/dev/null && user_before=yes
group_before=no
getent group "$PKG" >/dev/null && group_before=yes
mancache_before=$(find $MANCACHE -name "$PKG*" 2>/dev/null)
tmp=$(mktemp -d)

cleanup() {
	local rc=$?

	set +e
	if pkg_present; then
		echo "cleanup: purging $PKG (state: $(pkg_state))"
		dpkg --purge "$PKG" >/dev/null || echo "cleanup: dpkg --purge $PKG FAILED" >&2
	fi
	if [ "$user_before" = no ] && getent passwd "$PKG" >/dev/null; then
		deluser --system --quiet "$PKG" >/dev/null 2>&1
	fi
	if [ "$group_before" = no ] && getent group "$PKG" >/dev/null; then
		delgroup --system --quiet "$PKG" >/dev/null 2>&1
	fi
	# the formatted pages this test had man-db cache, if there were none before
	[ -n "$mancache_before" ] || find $MANCACHE -name "$PKG*" -delete 2>/dev/null
	rm -rf "$tmp"
	if [ $rc -eq 0 ]; then
		echo "PASS: tests/package/test_deb.sh"
	else
		echo "FAIL: tests/package/test_deb.sh (exit $rc)" >&2
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- one version ------------------------------------------------------------

version=$(make -s --no-print-directory version)
[ -n "$version" ] || fail "make version printed nothing"
make -s --no-print-directory check-version >/dev/null || fail "make check-version"
# the check itself must see a disagreement
if make -s --no-print-directory check-version VERSION="$version.mismatch" >/dev/null 2>&1; then
	fail "make check-version accepted VERSION=$version.mismatch against debian/changelog"
fi
changelog=$(dpkg-parsechangelog -S Version)
[ "$changelog" = "$version" ] || fail "debian/changelog says $changelog, the Makefile $version"
ok "version $version: Makefile and debian/changelog agree (and a mismatch is caught)"

# ---- build ------------------------------------------------------------------

arch=$(dpkg --print-architecture)
if [ -z "${DEB:-}" ]; then
	echo "== make deb"
	make --no-print-directory deb
	DEB=build/deb/${PKG}_${version}_${arch}.deb
fi
[ -f "$DEB" ] || fail "no package at $DEB"
[ "$(dpkg-deb -f "$DEB" Package)" = "$PKG" ] || fail "$DEB is not $PKG"
[ "$(dpkg-deb -f "$DEB" Version)" = "$version" ] ||
	fail "$DEB has version $(dpkg-deb -f "$DEB" Version), the Makefile $version"
ok "$DEB: $PKG $version"

deb_paths "$DEB" > "$tmp/contents"
for f in "$BIN" "$CONF" "$UNIT" \
	/usr/share/man/man8/spoa-ratelimit.8.gz /usr/share/man/man5/spoa-ratelimit.conf.5.gz \
	/usr/share/doc/spoa-ratelimit/README.Debian /usr/share/doc/spoa-ratelimit/copyright \
	$EXAMPLES/haproxy/haproxy.cfg $EXAMPLES/haproxy/spoe-ratelimit.conf \
	$EXAMPLES/haproxy/tiers.map $EXAMPLES/prometheus-alerts.yml \
	$EXAMPLES/grafana-dashboard.json; do
	# dh_compress gzips a document once it is over 4 KB: either name will do
	grep -qx -e "$f" -e "$f.gz" "$tmp/contents" || fail "$DEB lacks $f"
done
ok "the package holds the agent, configuration, unit, man pages and examples"

# dpkg -i fetches no dependency: name the missing ones rather than leave a
# half-configured package
missing=""
for dep in $(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed 's/[(|].*//; s/ //g'); do
	dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' ||
		missing="$missing $dep"
done
[ -z "$missing" ] || fail "dependencies not installed:$missing (apt-get install$missing)"

# ---- install ------------------------------------------------------------------

named_paths > "$tmp/before"
echo "== dpkg -i $DEB"
dpkg -i "$DEB"
[ "$(pkg_state)" = installed ] || fail "after dpkg -i, $PKG is '$(pkg_state)'"

# every file of the package is on disk
while read -r f; do
	case "$f" in */) continue ;; esac
	[ -e "$f" ] || fail "installed package lacks $f"
done < "$tmp/contents"
dpkg-query -W -f='${Conffiles}\n' "$PKG" | grep -q "^ $CONF " || fail "$CONF is not a conffile"
ok "installed; $CONF is a conffile"

# the service's user and group, and who may read the configuration
pw=$(getent passwd "$PKG") || fail "no user $PKG"
IFS=: read -r _ _ uid _ _ home shell <<< "$pw"
[ "$uid" -lt 1000 ] || fail "user $PKG is not a system user (uid $uid)"
[ "$home" = /nonexistent ] || fail "user $PKG has home $home"
[ "$shell" = /usr/sbin/nologin ] || fail "user $PKG has shell $shell"
getent group "$PKG" >/dev/null || fail "no group $PKG"
perm=$(stat -c '%U:%G %a' "$CONF")
[ "$perm" = "root:$PKG 640" ] || fail "$CONF is $perm, not root:$PKG 640"
ok "system user $PKG (uid $uid); $CONF is $perm"

# the installed agent
out=$("$BIN" -V) || fail "$BIN -V failed"
[ "$out" = "spoa-ratelimit $version" ] || fail "$BIN -V printed '$out', not 'spoa-ratelimit $version'"
ok "$BIN -V: $out"
out=$("$BIN" -c -f "$CONF") || fail "$BIN -c -f $CONF failed: $out"
case "$out" in "$CONF: configuration is valid"*) ;; *) fail "$BIN -c printed '$out'" ;; esac
ok "$BIN -c -f $CONF: $out"
out=$("$BIN" -c) || fail "$BIN -c (default file) failed: $out"
case "$out" in "$CONF: configuration is valid"*) ;; *) fail "$BIN -c printed '$out'" ;; esac
ok "$BIN -c reads $CONF by default"
out=$(runuser -u "$PKG" -- "$BIN" -c -f "$CONF") || fail "user $PKG cannot check $CONF: $out"
ok "user $PKG reads the configuration"
if out=$(runuser -u nobody -- "$BIN" -c -f "$CONF" 2>&1); then
	fail "user nobody could read $CONF: $out"
fi
case "$out" in *"cannot read"*) ;; *) fail "user nobody: unexpected error '$out'" ;; esac
ok "other users cannot read it: $out"

# the systemd unit: installed, packaged paths, enabled
grep -qx "ExecStart=$BIN -f $CONF" "$UNIT" || fail "$UNIT: no 'ExecStart=$BIN -f $CONF'"
if grep -n -e /usr/local -e contrib/ "$UNIT"; then fail "$UNIT has paths of a manual installation"; fi
grep -qx "User=$PKG" "$UNIT" || fail "$UNIT: not User=$PKG"
for cmd in $(sed -n 's/^Exec[A-Za-z]*=[-@!+:]*\([^ ]*\).*/\1/p' "$UNIT"); do
	[ -x "$cmd" ] || fail "$UNIT runs $cmd, which is not an executable"
done
[ -L "$WANTS" ] && [ "$(readlink -f "$WANTS")" = "$(readlink -f "$UNIT")" ] ||
	fail "$UNIT is not enabled ($WANTS)"
ok "$UNIT installed and enabled"
if command -v systemd-analyze >/dev/null; then
	systemd-analyze verify "$UNIT" || fail "systemd-analyze verify $UNIT"
	ok "systemd-analyze verify $UNIT"
fi
if [ -d /run/systemd/system ] && ! [ -x /usr/sbin/policy-rc.d ]; then
	systemctl is-active --quiet "$PKG" || fail "systemd runs here but $PKG is not active"
	ok "the service was started"
else
	echo "skip: the service start (systemd is not running here, or policy-rc.d forbids starts)"
fi

# the HAProxy samples are complete (a configuration HAProxy accepts)
if command -v haproxy >/dev/null; then
	out=$(RL_SPOE_CONF=$EXAMPLES/haproxy/spoe-ratelimit.conf RL_TIER_MAP=$EXAMPLES/haproxy/tiers.map \
		haproxy -c -f $EXAMPLES/haproxy/haproxy.cfg 2>&1) || fail "haproxy -c on $EXAMPLES/haproxy: $out"
	ok "haproxy -c accepts $EXAMPLES/haproxy/haproxy.cfg"
else
	echo "skip: haproxy -c on the examples (haproxy is not installed)"
fi

# the man pages render without warnings (copies: man caches what it formats
# from the system's manual directories)
if command -v man >/dev/null; then
	for f in /usr/share/man/man8/spoa-ratelimit.8.gz /usr/share/man/man5/spoa-ratelimit.conf.5.gz; do
		cp "$f" "$tmp/"
		warn=$(MANWIDTH=80 man --warnings -E UTF-8 -l "$tmp/${f##*/}" 2>&1 >/dev/null)
		[ -z "$warn" ] || fail "man $f: $warn"
	done
	ok "man pages render without warnings"
fi

# ---- remove, then purge -------------------------------------------------------

echo "# changed by the administrator" >> "$CONF"
echo "== dpkg --remove $PKG"
dpkg --remove "$PKG"
[ "$(pkg_state)" = config-files ] || fail "after dpkg --remove, $PKG is '$(pkg_state)'"
[ ! -e "$BIN" ] || fail "dpkg --remove left $BIN"
[ ! -e "$UNIT" ] || fail "dpkg --remove left $UNIT"
[ -f "$CONF" ] || fail "dpkg --remove removed the configuration"
ok "removed: the agent and the unit are gone, the configuration stays"

echo "== dpkg --purge $PKG"
dpkg --purge "$PKG"
pkg_present && fail "after dpkg --purge, $PKG is '$(pkg_state)'"
named_paths > "$tmp/after"
left=$(comm -13 "$tmp/before" "$tmp/after")
[ -z "$left" ] || fail "left after the purge: $left"
[ ! -e /etc/spoa-ratelimit ] || fail "/etc/spoa-ratelimit left after the purge"
[ ! -L "$WANTS" ] || fail "$WANTS left after the purge"
if dpkg-statoverride --list | grep -F "$PKG"; then fail "a statoverride is left"; fi
ok "purged: no file left (the system user stays, as Debian policy allows)"
