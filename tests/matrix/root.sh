#!/bin/bash
# A Debian root of another release, made with mmdebstrap from Debian's archive,
# and a command run inside it: how the matrix reaches Debian 13, unstable and
# experimental (HAProxy 3.x, Redis 8, Valkey) from a Debian 12 machine.
#
#   tests/matrix/root.sh make NAME SUITE "PACKAGES" ["EXTRA SOURCES" ["HOOK"]]
#   tests/matrix/root.sh run  NAME COMMAND...      (in /src, a copy of this tree)
#
# MATRIX_SHARE=DIR: a directory of the machine's, mounted on /share in the root
# for `run` (read-write): how a package built in one root reaches another.
#
# Roots are cached in $MATRIX_CACHE (default /var/cache/spoa-ratelimit-matrix),
# keyed by suite, packages and sources; a root older than $MATRIX_MAX_AGE days
# (default 7) is made again, so security updates reach it. `run` never changes
# the cached root: it mounts an overlay on it (a plain copy where the kernel
# has no overlayfs), copies the tree's tracked and untracked-but-not-ignored
# files into /src, and runs COMMAND in new mount and PID namespaces: when
# COMMAND ends, every process it left behind is ended with it and the mounts
# go away. The network is the host's (tests listen on loopback only).
#
# Root only (mmdebstrap, chroot, mount).
set -euo pipefail

CACHE=${MATRIX_CACHE:-/var/cache/spoa-ratelimit-matrix}
MAX_AGE=${MATRIX_MAX_AGE:-7}
MIRROR=${MATRIX_MIRROR:-http://deb.debian.org/debian}
TREE=$(cd "$(dirname "$0")/../.." && pwd)

die() { echo "root.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap, chroot, mount)"

# make NAME SUITE "PACKAGES" ["EXTRA SOURCES" ["HOOK"]]: the root, made or taken from the
# cache. EXTRA SOURCES: more sources.list lines, one a line. HOOK: a shell command run
# inside the new root once its packages are installed, with the package lists still there
# (e.g. to unpack a package from experimental beside the suite's own).
make_root() {
	local name=$1 suite=$2 pkgs=$3 extra=${4:-} hook=${5:-}
	local dir=$CACHE/$name key
	command -v mmdebstrap >/dev/null || {
		apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null ||
			die "mmdebstrap missing and could not be installed"; }
	key=$(printf '%s\n' "$suite" "$pkgs" "$extra" "$hook" "$MIRROR" | sha256sum | cut -c1-16)
	if [ -f "$dir/.matrix-key" ] && [ "$(cat "$dir/.matrix-key")" = "$key" ] &&
	   [ -n "$(find "$dir/.matrix-key" -mtime -"$MAX_AGE")" ]; then
		echo "root $name: cached ($suite, $(cat "$dir/.matrix-made"))"
		return 0
	fi
	mkdir -p "$CACHE"
	rm -rf "$dir.new"
	local sources=("deb $MIRROR $suite main")
	local s
	if [ -n "$extra" ]; then
		while IFS= read -r s; do [ -n "$s" ] && sources+=("$s"); done <<<"$extra"
	fi
	echo "root $name: mmdebstrap $suite (${#sources[@]} source(s))"
	# Check-Valid-Until off: unstable's and experimental's Release files are
	# short-lived, and a mirror a few days behind must still be usable.
	local hookopt=()
	if [ -n "$hook" ]; then
		export MATRIX_HOOK=$hook
		# shellcheck disable=SC2016
		hookopt=(--customize-hook='chroot "$1" /bin/sh -ec "$MATRIX_HOOK"')
	fi
	mmdebstrap --variant=apt --quiet \
		--aptopt='Acquire::Check-Valid-Until "false"' \
		--aptopt='APT::Install-Recommends "false"' \
		--include="$(echo $pkgs | tr ' ' ',')" \
		"${hookopt[@]}" \
		"$suite" "$dir.new" "${sources[@]}" ||
		die "mmdebstrap $suite failed"
	echo "$key" > "$dir.new/.matrix-key"
	date -u +%Y-%m-%dT%H:%MZ > "$dir.new/.matrix-made"
	rm -rf "$dir"
	mv "$dir.new" "$dir"
}

# run NAME COMMAND...: COMMAND in the root, in /src, as root.
run_in_root() {
	local name=$1; shift
	local dir=$CACHE/$name
	[ -f "$dir/.matrix-key" ] || die "no root $name: make it first"
	local work files rc=0
	work=$(mktemp -d /var/tmp/spoa-ratelimit-matrix.XXXXXX)
	files=$(mktemp)
	# removed however this script ends: a failing command (set -e) or a signal never
	# returns from this function, and a RETURN trap would leave the overlay's upper layer
	# shellcheck disable=SC2064
	trap "rm -rf '$work' '$files'" EXIT
	trap 'exit 143' TERM
	trap 'exit 130' INT
	mkdir -p "$work/upper" "$work/work" "$work/root"
	if git -C "$TREE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git -C "$TREE" ls-files -z --cached --others --exclude-standard >"$files"
	else
		(cd "$TREE" && find . -path ./build -prune -o -path ./build-asan -prune \
			-o -path ./build-fuzz -prune -o -path ./.git -prune -o -type f -print0) >"$files"
	fi
	# shellcheck disable=SC2016
	unshare --mount --pid --fork --propagation private /bin/bash -c '
		set -euo pipefail
		dir=$1 work=$2 tree=$3 files=$4; shift 4
		R=$work/root
		if ! mount -t overlay overlay \
			-o "lowerdir=$dir,upperdir=$work/upper,workdir=$work/work" "$R" 2>/dev/null; then
			echo "(no overlayfs: copying the root)"
			cp -a "$dir/." "$R/"
		fi
		mkdir -p "$R/src"
		(cd "$tree" && tar --null -T "$files" -cf - 2>/dev/null) | tar -xf - -C "$R/src"
		mount -t proc proc "$R/proc"
		mount --rbind /dev "$R/dev"
		mount --rbind /sys "$R/sys"
		mount -t tmpfs -o size=4g tmpfs "$R/tmp"
		if [ -n "${MATRIX_SHARE:-}" ]; then
			mkdir -p "$R/share"
			mount --bind "$MATRIX_SHARE" "$R/share"
		fi
		cp /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
		exec chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root LANG=C.UTF-8 CI="${CI:-}" TERM=dumb \
			${MATRIX_ENV:-} /bin/bash -c "cd /src && $*"
	' _ "$dir" "$work" "$TREE" "$files" "$@" || rc=$?
	return $rc
}

case "${1:-}" in
make) shift; [ $# -ge 3 ] || die "usage: root.sh make NAME SUITE \"PACKAGES\" [\"SOURCES\" [\"HOOK\"]]"
      make_root "$@" ;;
run)  shift; [ $# -ge 2 ] || die "usage: root.sh run NAME COMMAND..."
      run_in_root "$@" ;;
*)    die "usage: root.sh make|run ..." ;;
esac
