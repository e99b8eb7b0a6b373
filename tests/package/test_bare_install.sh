#!/bin/bash
# SPDX-License-Identifier: MIT
#
# The package on a bare system: `apt install ./spoa-ratelimit_*.deb` on a
# Debian root holding none of the build dependencies pulls the libraries the
# package's Depends name (from shlibs: libssl3 on Debian 12, libssl3t64 on 13,
# c-ares, libev, libconfig, hiredis) and adduser from Debian's archive, and
# the installed agent runs: -V, -c on the installed configuration (as root and
# as the service's user), no library missing (ldd). Then apt purges it, and no
# file of it is left.
#
#   tests/package/test_bare_install.sh SUITE DEB
#       SUITE: bookworm (Debian 12) or trixie (Debian 13), the release DEB was
#       built for. Makes (or takes from the cache) the bare root of the
#       release with tests/matrix/root.sh (make and ca-certificates only: the
#       root of the matrix's debian13 leg) and runs the check in it.
#
# Root only (tests/matrix/root.sh). The root is thrown away afterwards: nothing
# of the machine is changed but the cache of roots.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/package/lib.sh

usage() { echo "usage: tests/package/test_bare_install.sh bookworm|trixie DEB" >&2; exit 2; }

# ---- on the machine: the root, and this script run in it ----------------------

if [ "${1:-}" != --in-root ]; then
	[ $# -eq 2 ] || usage
	suite=$1 deb=$2
	case $suite in
	bookworm) name=debian12-bare ;;
	trixie) name=debian13-bare ;;
	*) usage ;;
	esac
	[ -f "$deb" ] || fail "no package at $deb"
	share=$(mktemp -d /var/tmp/spoa-ratelimit-bare.XXXXXX)
	# shellcheck disable=SC2064
	trap "rm -rf '$share'" EXIT
	cp "$deb" "$share/"
	chmod -R a+rX "$share"
	tests/matrix/root.sh make "$name" "$suite" "make ca-certificates"
	MATRIX_SHARE=$share tests/matrix/root.sh run "$name" \
		"tests/package/test_bare_install.sh --in-root /share/${deb##*/}"
	exit 0
fi

# ---- in the bare root ----------------------------------------------------------

DEB=$2
export DEBIAN_FRONTEND=noninteractive
verdict() {
	local rc=$?
	if [ $rc -eq 0 ]; then
		echo "PASS: tests/package/test_bare_install.sh"
	else
		echo "FAIL: tests/package/test_bare_install.sh (exit $rc)" >&2
	fi
	exit $rc
}
trap verdict EXIT

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
release=$(. /etc/os-release && echo "$PRETTY_NAME")
version=$(dpkg-deb -f "$DEB" Version)

# nothing of the build: no compiler, no -dev package, no debhelper
for p in gcc libc6-dev libssl-dev libc-ares-dev libev-dev libhiredis-dev libconfig-dev debhelper; do
	! installed "$p" || fail "$release: $p is installed: not a bare root"
done
depends=$(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed 's/[(|].*//; s/ //g' | grep .)
missing=""
for p in $depends; do installed "$p" || missing="$missing $p"; done
[ -n "$missing" ] || fail "$release: every dependency is installed already: the check would prove nothing"
ok "$release, bare: none of the build dependencies; of the package's Depends, missing:$missing"

named_paths > /tmp/before
echo "== apt-get install ./${DEB##*/}"
timeout 300 apt-get update -qq || fail "apt-get update"
timeout 300 apt-get install -y -q --no-install-recommends "$DEB" > /tmp/apt.log 2>&1 ||
	{ cat /tmp/apt.log >&2; fail "apt-get install $DEB"; }
grep -E '^Setting up' /tmp/apt.log | sed 's/ \.\.\.$//'
[ "$(pkg_state)" = installed ] || fail "after apt-get install, $PKG is '$(pkg_state)'"
for p in $depends; do installed "$p" || fail "$p (a dependency) is not installed"; done
ok "apt-get installed $PKG $version and its dependencies"

out=$(ldd "$BIN" | grep 'not found' || true)
[ -z "$out" ] || fail "$BIN: libraries not found: $out"
out=$("$BIN" -V) || fail "$BIN -V failed"
[ "$out" = "spoa-ratelimit $version" ] || fail "$BIN -V printed '$out'"
out=$("$BIN" -c) || fail "$BIN -c failed: $out"
case "$out" in "$CONF: configuration is valid"*) ;; *) fail "$BIN -c printed '$out'" ;; esac
out=$(runuser -u "$PKG" -- "$BIN" -c -f "$CONF") || fail "$BIN -c as $PKG failed: $out"
ok "$BIN -V: spoa-ratelimit $version; -c: ${out%%$'\n'*}"
[ -f "$UNIT" ] && [ -L "$WANTS" ] || fail "$UNIT not installed and enabled"
ok "$UNIT installed and enabled"

echo "== apt-get purge $PKG"
timeout 300 apt-get purge -y -q "$PKG" > /tmp/apt.log 2>&1 || { cat /tmp/apt.log >&2; fail "apt-get purge"; }
pkg_present && fail "after apt-get purge, $PKG is '$(pkg_state)'"
named_paths > /tmp/after
left=$(comm -13 /tmp/before /tmp/after)
[ -z "$left" ] || fail "left after the purge: $left"
ok "purged: no file left"
