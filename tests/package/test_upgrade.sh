#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Upgrades of the Debian package keep what the administrator made. Installs
# this version (apt-get install ./DEB), edits its configuration (a conffile)
# and writes a Redis password file it names, then builds the next version from
# a copy of this tree (a changelog entry and the Makefile's VERSION bumped
# there, the shipped configuration changed, an example dropped: never in this
# tree) and, non-interactively (--force-confdef --force-confold, as unattended
# upgrades do):
#
#   upgrade    V -> V+next: the edited configuration and the password file are
#              intact (content, owner, mode), the new shipped configuration
#              waits beside it as .dpkg-dist, the new agent runs (-V, -c as the
#              service's user, reading the password), nothing of the old
#              version's files is left, the service is restarted
#   downgrade  V+next -> V: the same, the example back
#   upgrade, then purge: nothing of the package left; the password file, the
#              administrator's own, stays (with its directory)
#
# The service: the maintainer scripts dh_installsystemd wrote act only where
# /run/systemd/system exists. Without systemd running (a container, CI), the
# test runs in a mount namespace of its own whose /run is a private tmpfs
# holding /run/systemd/system, with deb-systemd-invoke and systemctl
# replaced, on PATH, by stand-ins that record their calls: it checks that
# an installation starts the service, an upgrade or a downgrade restarts it
# (never a stop before), a removal stops it. Where systemd runs (and no
# policy-rc.d forbids starts), it checks the real service instead: active
# after each step, a new main process after an upgrade.
#
#   tests/package/test_upgrade.sh              build V with `make deb`, then V+next
#   DEB=path/to/spoa-ratelimit_V_ARCH.deb tests/package/test_upgrade.sh
#
# Needs root and the build dependencies (it builds V+next). Refuses to run if
# spoa-ratelimit is installed already; whatever happens, purges it on exit and
# removes what it made.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/package/lib.sh

[ "$(id -u)" -eq 0 ] || fail "needs root (apt-get, dpkg)"

if [ -d /run/systemd/system ] && [ -z "${UPGRADE_FAKE_SYSTEMD:-}" ]; then
	REAL_SYSTEMD=yes
	if [ -x /usr/sbin/policy-rc.d ]; then
		fail "systemd runs here but policy-rc.d forbids starting services: nothing to check"
	fi
elif [ -z "${UPGRADE_FAKE_SYSTEMD:-}" ]; then
	# again, in a mount namespace of its own (gone with this process)
	exec unshare --mount --propagation private env UPGRADE_FAKE_SYSTEMD=1 \
		"$PWD/tests/package/test_upgrade.sh" "$@"
else
	REAL_SYSTEMD=no
	mount -t tmpfs -o size=16m,mode=0755 tmpfs /run
	mkdir -p /run/systemd/system /run/lock
fi

pkg_present && fail "$PKG is installed already (state: $(pkg_state)); this test installs and purges it: purge it first"

DIR=${CONF%/*}
SECRET=$DIR/redis-password
export DEBIAN_FRONTEND=noninteractive

user_before=no
getent passwd "$PKG" >/dev/null && user_before=yes
group_before=no
getent group "$PKG" >/dev/null && group_before=yes
dir_before=no
[ -e "$DIR" ] && dir_before=yes
mancache_before=$(find $MANCACHE -name "$PKG*" 2>/dev/null)
tmp=$(mktemp -d)
chmod 0755 "$tmp"    # apt's _apt user reads the packages from there

cleanup() {
	local rc=$?

	set +e
	if pkg_present; then
		echo "cleanup: purging $PKG (state: $(pkg_state))"
		dpkg --purge "$PKG" >/dev/null || echo "cleanup: dpkg --purge $PKG FAILED" >&2
	fi
	if [ "$dir_before" = no ]; then
		rm -f "$SECRET"
		rmdir "$DIR" 2>/dev/null
	fi
	if [ "$user_before" = no ] && getent passwd "$PKG" >/dev/null; then
		deluser --system --quiet "$PKG" >/dev/null 2>&1
	fi
	if [ "$group_before" = no ] && getent group "$PKG" >/dev/null; then
		delgroup --system --quiet "$PKG" >/dev/null 2>&1
	fi
	[ -n "$mancache_before" ] || find $MANCACHE -name "$PKG*" -delete 2>/dev/null
	rm -rf "$tmp"
	if [ $rc -eq 0 ]; then
		echo "PASS: tests/package/test_upgrade.sh"
	else
		echo "FAIL: tests/package/test_upgrade.sh (exit $rc)" >&2
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# apt-get as an unattended upgrade runs it: no question, the administrator's
# version of a changed conffile kept. Bounded: a lock held elsewhere fails it.
APT_OPTS=()
apt_get() {
	timeout 300 apt-get -y -q -o Dpkg::Options::=--force-confdef \
		-o Dpkg::Options::=--force-confold "${APT_OPTS[@]}" "$@" > "$tmp/apt.log" 2>&1 ||
		{ cat "$tmp/apt.log" >&2; fail "apt-get $*"; }
	grep -E '^(Setting up|Unpacking|Removing|Purging|Configuration file)' "$tmp/apt.log" || true
}

# The stand-ins for the commands the maintainer scripts run to reach systemd:
# they record their calls. systemctl's work on the files alone (--root=, as
# deb-systemd-helper's `preset` that enables the unit) is the real one's.
CALLS=$tmp/systemd-calls
if [ "$REAL_SYSTEMD" = no ]; then
	mkdir "$tmp/bin"
	printf '#!/bin/sh\necho "deb-systemd-invoke $*" >> %s\n' "$CALLS" > "$tmp/bin/deb-systemd-invoke"
	systemctl=$(command -v systemctl || echo true)
	cat > "$tmp/bin/systemctl" <<-EOF
	#!/bin/sh
	echo "systemctl \$*" >> $CALLS
	case " \$* " in *" --root="*) exec $systemctl "\$@" ;; esac
	EOF
	chmod 0755 "$tmp/bin/deb-systemd-invoke" "$tmp/bin/systemctl"
	export PATH=$tmp/bin:$PATH
	# apt runs dpkg with a PATH of its own (DPkg::Path)
	APT_OPTS=(-o "DPkg::Path=$tmp/bin:/usr/sbin:/usr/bin:/sbin:/bin")
fi
: > "$CALLS"

# service_acted ACTION WHEN: the maintainer scripts asked for ACTION (start,
# restart, stop) of the service and for no other action; the real service's
# state where systemd runs.
service_acted() {
	local action=$1 when=$2 asked
	if [ "$REAL_SYSTEMD" = yes ]; then
		case $action in
		stop) ! systemctl is-active --quiet "$PKG" || fail "$when: $PKG still active" ;;
		*) systemctl is-active --quiet "$PKG" || fail "$when: $PKG is not active" ;;
		esac
		ok "$when: the service is $(systemctl is-active "$PKG")"
		return
	fi
	asked=$(sed -n "s/^deb-systemd-invoke \([a-z-]*\) $PKG.service\$/\1/p" "$CALLS" | tr '\n' ' ')
	[ "$asked" = "$action " ] ||
		fail "$when: the maintainer scripts asked for '${asked% }' of the service, not '$action' ($(tr '\n' ';' < "$CALLS"))"
	ok "$when: the maintainer scripts ${action} the service (deb-systemd-invoke $action)"
	: > "$CALLS"
}
main_pid() { systemctl show -p MainPID --value "$PKG"; }

# ---- the two versions -------------------------------------------------------

version=$(make -s --no-print-directory version)
next=$version+next
arch=$(dpkg --print-architecture)
if [ -z "${DEB:-}" ]; then
	echo "== make deb"
	make --no-print-directory deb
	DEB=build/deb/${PKG}_${version}_${arch}.deb
fi
[ -f "$DEB" ] || fail "no package at $DEB"
[ "$(dpkg-deb -f "$DEB" Version)" = "$version" ] || fail "$DEB is not version $version"
OLD=$tmp/${PKG}_${version}_${arch}.deb
cp "$DEB" "$OLD"

echo "== the next version, $next, built from a copy of the tree"
src=$tmp/build/$PKG
mkdir -p "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$src"
else
	tar --exclude=./.git --exclude=./build --exclude='./build-*' --exclude=./debian/build \
		--exclude=./debian/.debhelper --exclude="./debian/$PKG" -cf - . | tar -xf - -C "$src"
fi
maint=$(dpkg-parsechangelog -S Maintainer)
{
	printf '%s (%s) unstable; urgency=medium\n\n' "$PKG" "$next"
	printf '  * The next version, for tests/package/test_upgrade.sh.\n\n'
	printf ' -- %s  %s\n\n' "$maint" "$(date -R)"
	cat debian/changelog
} > "$src/debian/changelog"
sed -i "s/^VERSION ?= .*/VERSION ?= $next/" "$src/Makefile"
# the new version ships another configuration: the administrator's edited one
# must stay, the new one wait beside it
echo "# (the next version's configuration)" >> "$src/contrib/spoa-ratelimit.conf"
# and one file fewer: none of the old version's files may stay
DROPPED=$EXAMPLES/status.png
sed -i '\,^contrib/status\.png$,d' "$src/debian/$PKG.examples"
(cd "$src" && DEB_BUILD_OPTIONS=nocheck timeout 900 dpkg-buildpackage -us -uc -b) > "$tmp/build.log" 2>&1 ||
	{ tail -n 40 "$tmp/build.log" >&2; fail "dpkg-buildpackage of $next"; }
NEW=$tmp/build/${PKG}_${next}_${arch}.deb
[ -f "$NEW" ] || fail "no $NEW after the build"
[ "$(dpkg-deb -f "$NEW" Version)" = "$next" ] || fail "$NEW is not version $next"
dpkg --compare-versions "$next" gt "$version" || fail "$next does not sort after $version"
ok "built $PKG $next"

shipped_sum() { dpkg-deb --fsys-tarfile "$1" | tar -xOf - ".$CONF" | sha256sum | cut -d' ' -f1; }
old_shipped=$(shipped_sum "$OLD")
new_shipped=$(shipped_sum "$NEW")
[ "$old_shipped" != "$new_shipped" ] || fail "both versions ship the same configuration"
deb_paths "$OLD" | grep -v '/$' | sort > "$tmp/old.files"
deb_paths "$NEW" | grep -v '/$' | sort > "$tmp/new.files"
grep -qx "$DROPPED" "$tmp/old.files" || fail "$version does not ship $DROPPED"
! grep -qx "$DROPPED" "$tmp/new.files" || fail "$next still ships $DROPPED"

# ---- install V, as an administrator sets it up ------------------------------

named_paths > "$tmp/before"
echo "== apt-get install ./${OLD##*/}"
apt_get install "$OLD"
[ "$(pkg_state)" = installed ] || fail "after installing $version, $PKG is '$(pkg_state)'"
service_acted start "install $version"

# the edits: a setting changed, the Redis password named ...
sed -i -e 's/^  max_concurrency = 256; /  max_concurrency = 128; /' \
	-e 's/^  # password_file = "redis-password";/  password_file = "redis-password";/' "$CONF"
grep -q '^  max_concurrency = 128; ' "$CONF" && grep -q '^  password_file = "redis-password";' "$CONF" ||
	fail "could not edit $CONF (the example configuration changed?)"
if out=$("$BIN" -c -f "$CONF" 2>&1); then
	fail "-c accepted $CONF naming a password file that does not exist: $out"
fi
# ... and written, as README.Debian says
install -m 0640 -o root -g "$PKG" /dev/null "$SECRET"
echo "s3cret-$$-$RANDOM" > "$SECRET"
runuser -u "$PKG" -- "$BIN" -c -f "$CONF" >/dev/null || fail "$BIN -c as $PKG, with $SECRET"
conf_sum=$(sha256sum < "$CONF")
secret_sum=$(sha256sum < "$SECRET")
ok "$CONF edited (max_concurrency, password_file), $SECRET written (root:$PKG 640)"

# check_kept WHEN: what the administrator made is as it was
check_kept() {
	local when=$1 perm
	[ "$(sha256sum < "$CONF")" = "$conf_sum" ] || fail "$when: $CONF changed: $(diff <(echo) "$CONF" | head -n 5)"
	perm=$(stat -c '%U:%G %a' "$CONF")
	[ "$perm" = "root:$PKG 640" ] || fail "$when: $CONF is $perm, not root:$PKG 640"
	[ "$(sha256sum < "$SECRET")" = "$secret_sum" ] || fail "$when: $SECRET changed"
	perm=$(stat -c '%U:%G %a' "$SECRET")
	[ "$perm" = "root:$PKG 640" ] || fail "$when: $SECRET is $perm, not root:$PKG 640"
	ok "$when: $CONF and $SECRET as the administrator left them ($perm)"
}

# check_version WHEN V DEBFILE SHIPPED: V installed, running, and only its files
check_version() {
	local when=$1 v=$2 deb=$3 shipped=$4 out left f
	[ "$(pkg_state)" = installed ] || fail "$when: $PKG is '$(pkg_state)'"
	[ "$(dpkg-query -W -f='${Version}' "$PKG")" = "$v" ] ||
		fail "$when: dpkg says $(dpkg-query -W -f='${Version}' "$PKG"), not $v"
	out=$("$BIN" -V) && [ "$out" = "spoa-ratelimit $v" ] || fail "$when: $BIN -V printed '$out'"
	out=$(runuser -u "$PKG" -- "$BIN" -c -f "$CONF") || fail "$when: $BIN -c as $PKG: $out"
	case "$out" in "$CONF: configuration is valid"*) ;; *) fail "$when: $BIN -c printed '$out'" ;; esac
	ok "$when: $PKG $v installed; $BIN -V: spoa-ratelimit $v; -c as $PKG: valid (reads $SECRET)"
	# the package's shipped configuration waits beside the administrator's
	[ -f "$CONF.dpkg-dist" ] && [ "$(sha256sum < "$CONF.dpkg-dist" | cut -d' ' -f1)" = "$shipped" ] ||
		fail "$when: no $CONF.dpkg-dist holding $v's configuration"
	left=$(find "$DIR" -mindepth 1 | sort | tr '\n' ' ')
	[ "$left" = "$SECRET $CONF $CONF.dpkg-dist " ] || fail "$when: $DIR holds: $left"
	# every file of v on disk, as packaged (the edited conffile aside) ...
	deb_paths "$deb" | grep -v '/$' | sort > "$tmp/now.files"
	while read -r f; do
		[ -e "$f" ] || fail "$when: $f of $v is missing"
	done < "$tmp/now.files"
	out=$(dpkg --verify "$PKG" | grep -v " c $CONF\$" || true)
	[ -z "$out" ] || fail "$when: dpkg --verify: $out"
	# ... and none of the other version's that v does not ship
	while read -r f; do
		[ ! -e "$f" ] || fail "$when: $f is left, which $v does not ship"
	done < <(sort -u "$tmp/old.files" "$tmp/new.files" | comm -23 - "$tmp/now.files")
	grep -qx "$UNIT" "$tmp/now.files" && [ -L "$WANTS" ] || fail "$when: the unit is not installed and enabled"
	ok "$when: the files of $v only (dpkg --verify clean but for the edited $CONF), the unit enabled"
}

# ---- upgrade, downgrade, upgrade, purge -------------------------------------

[ "$REAL_SYSTEMD" = yes ] && pid=$(main_pid)
echo "== upgrade: apt-get install ./${NEW##*/}"
apt_get install "$NEW"
check_kept "upgrade to $next"
check_version "upgrade to $next" "$next" "$NEW" "$new_shipped"
[ ! -e "$DROPPED" ] || fail "upgrade to $next: $DROPPED left"
service_acted restart "upgrade to $next"
if [ "$REAL_SYSTEMD" = yes ]; then
	[ "$(main_pid)" != "$pid" ] || fail "upgrade to $next: the service was not restarted (main PID $pid)"
fi

echo "== downgrade: apt-get install --allow-downgrades ./${OLD##*/}"
apt_get install --allow-downgrades "$OLD"
check_kept "downgrade to $version"
check_version "downgrade to $version" "$version" "$OLD" "$old_shipped"
[ -e "$DROPPED" ] || fail "downgrade to $version: no $DROPPED"
service_acted restart "downgrade to $version"

echo "== upgrade again, then purge"
apt_get install "$NEW"
check_version "upgrade to $next again" "$next" "$NEW" "$new_shipped"
service_acted restart "upgrade to $next again"
apt_get purge "$PKG"
pkg_present && fail "after the purge, $PKG is '$(pkg_state)'"
service_acted stop "purge"
named_paths > "$tmp/after"
left=$(comm -13 "$tmp/before" "$tmp/after" | tr '\n' ' ')
[ "$left" = "$DIR $SECRET " ] || fail "left after the purge: $left"
[ ! -L "$WANTS" ] || fail "$WANTS left after the purge"
[ "$(sha256sum < "$SECRET")" = "$secret_sum" ] || fail "the purge changed $SECRET"
ok "purged: nothing of the package left; $SECRET (the administrator's file) stays, with $DIR"
