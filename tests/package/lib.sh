# SPDX-License-Identifier: MIT
# shellcheck shell=bash disable=SC2034  # (the names are for the scripts that source it)
#
# What the package tests share (sourced by test_deb.sh and test_upgrade.sh).

PKG=spoa-ratelimit
BIN=/usr/sbin/spoa-ratelimit
CONF=/etc/spoa-ratelimit/spoa-ratelimit.conf
WANTS=/etc/systemd/system/multi-user.target.wants/spoa-ratelimit.service
EXAMPLES=/usr/share/doc/spoa-ratelimit/examples
# where dh_installsystemd puts the unit: /lib on Debian 12, /usr/lib since the
# merged /usr (Debian 13, unstable: no VERSION_ID)
if [ "$(. /etc/os-release && echo "${VERSION_ID:-}")" = 12 ]; then
	UNIT=/lib/systemd/system/spoa-ratelimit.service
else
	UNIT=/usr/lib/systemd/system/spoa-ratelimit.service
fi

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

# "installed", "config-files", "half-installed"...: anything dpkg still knows about
pkg_state() { dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null || true; }
pkg_present() { local s; s=$(pkg_state); [ -n "$s" ] && [ "$s" != "not-installed" ]; }

# Every path of the file system that names the package, outside temporary
# directories (other processes' files there are none of ours) and man-db's
# cache of formatted pages (systemd-analyze verify formats the pages the
# unit's Documentation= names; man-db's daily job expires them), nor the test
# matrix's cached Debian roots (tests/matrix/root.sh; one may be in the making).
MANCACHE=/var/cache/man
named_paths() {
	find /etc /lib /usr /var /run /opt /srv -xdev \
		\( -path /var/tmp -o -path /var/cache/apt -o -path $MANCACHE \
		   -o -path "/var/cache/$PKG-matrix*" -o -path "${MATRIX_CACHE:-/var/cache/$PKG-matrix}" \) -prune -o \
		-path "*$PKG*" -print 2>/dev/null | sort
}

# The paths a package file holds, one a line, absolute, directories with a
# trailing slash.
deb_paths() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's,^\./,/,'; }
