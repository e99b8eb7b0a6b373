# spoa-ratelimit — plain Makefile.
#
#   make                 build the agent into build/
#   make test            install what is missing, then unit tests, fuzz corpus
#                        replay (ASan), integration tests (real HAProxy + Redis)
#   make demo            two gateways, two agents, one Redis: the shared budget
#   make bench           CPU per decision, the Redis ceiling (-P 32), targets (~2 min)
#   make bench-script    Redis CPU per decision of the script, single and multi (~1 min)
#   make accuracy        20 agents on one Redis: admitted / limit, exact vs local-only
#   make candidate-cost  Redis commands per decision and would-be denials, candidate
#                        modes exact and sampled on one replayed load (~1 min)
#   make attack          attacks on two gateways, one row each with PASS/FAIL (~2 min);
#                        ATTACKS=sigstop,stall runs those rows only
#   make soak            steady load, reloads, restarts: RSS/fds/Redis memory flat? (SOAK_MIN=10)
#   make screenshots     the status page in chromium: doc/img/status-*.png (~30 s)
#   make fuzz-smoke      libFuzzer (clang): frame decoder, config loader, reply reader,
#                        HTTP request parser, what is read out of replies (~3 min)
#   make matrix          the tests on Debian 13, HAProxy 3.2/3.4, Valkey (root, ~15 min)
#   make deb             Debian package (dpkg-buildpackage + lintian) into build/deb/
#   make test-deb        build it, install it, run it, purge it (root; tests/package/)
#   make SANITIZE=address,undefined   ASan/UBSan build into build-asan/
#   make WERROR=1        warnings are errors
#   make install PREFIX=/usr/local DESTDIR=...

CC      ?= gcc
PREFIX  ?= /usr/local
VERSION ?= 0.1.0
PYTHON  ?= /usr/bin/python3

ifneq ($(SANITIZE),)
BUILD   ?= build-asan
SANFLAGS = -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
LTO      =
else
BUILD   ?= build
SANFLAGS =
# link-time optimisation: the SPOP library's small encoders and decoders, the
# utilities and the store's helpers are inlined across files (about a tenth of
# the agent's instructions per decision, callgrind)
LTO     ?= -flto=auto
endif

WARN    = -Wall -Wextra -Wshadow -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes \
          -Wpointer-arith -Wcast-align -Wwrite-strings -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN   += -Werror
endif
ifeq ($(DEBUG),1)
OPT     = -O0 -g3
else
OPT     = -O2 -g
endif

PKG_CFLAGS := $(shell pkg-config --cflags hiredis libconfig 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs hiredis libconfig 2>/dev/null || echo -lhiredis -lconfig)
CARES_LIBS := $(shell pkg-config --libs libcares 2>/dev/null || echo -lcares)
SSL_LIBS   := $(shell pkg-config --libs openssl 2>/dev/null || echo -lssl -lcrypto)
# src/ is in wings, one folder each (doc/development.md, "Map of src/")
SRC_WINGS = core net store config policy observe decide ctl
SRC_INC   = -Isrc $(SRC_WINGS:%=-Isrc/%)

CFLAGS  += -std=gnu11 -D_GNU_SOURCE -DVERSION='"$(VERSION)"' $(OPT) $(LTO) $(WARN) $(SANFLAGS) \
           -MMD -MP -Ispoa $(SRC_INC) $(PKG_CFLAGS)
LDFLAGS += $(SANFLAGS) $(LTO)
AR_LTO   = $(if $(LTO),gcc-ar,ar)
LIBS     = $(PKG_LIBS) $(CARES_LIBS) $(SSL_LIBS) -lev -lm

ifneq ($(V),1)
Q = @
endif

SPOA_SRC  = spoa/spop.c spoa/conn.c spoa/request.c spoa/listener.c
AGENT_SRC = src/main.c src/agent.c src/config/config.c src/policy/rules.c src/store/store.c src/store/store_node.c src/store/store_cmd.c \
            src/store/store_cluster.c src/store/store_batch.c src/store/store_reply.c src/store/store_parse.c src/store/reply_parse.c src/store/rconn.c src/net/tls.c src/net/resolve.c src/store/sentinel.c src/core/limiter.c src/core/digest.c src/core/log.c src/core/util.c \
            src/store/memstore.c src/observe/metrics.c src/net/http.c src/observe/prom.c src/observe/topk.c src/core/hll.c src/policy/quota.c \
            src/core/normalize.c src/policy/overrides.c src/ctl/ctl.c src/observe/status.c src/core/json.c \
            src/decide/notify.c src/decide/prepare.c src/decide/parts.c src/decide/candidate.c src/decide/charge.c src/decide/answer.c \
            src/decide/principal.c src/decide/blocked.c src/decide/decision.c src/config/config_read.c src/config/config_policy.c
SPOA_OBJ  = $(SPOA_SRC:%.c=$(BUILD)/%.o)
AGENT_OBJ = $(AGENT_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/scripts.o
AGENT_SRC += src/core/secret.c
AGENT_SRC += src/policy/heartbeat.c
LUA       = lua/prelude.lua lua/gcra.lua lua/fixed_window.lua lua/sliding_log.lua \
            lua/sliding_window.lua lua/concurrency.lua lua/state.lua lua/decide.lua

BIN       = $(BUILD)/spoa-ratelimit
LIBSPOA   = $(BUILD)/libspoa.a
UNIT_BINS = $(BUILD)/test_spop $(BUILD)/test_limiter $(BUILD)/test_memstore $(BUILD)/test_obs \
            $(BUILD)/test_normalize $(BUILD)/test_overrides $(BUILD)/test_status
MODEL     = $(BUILD)/limit_model
REPLAY    = $(BUILD)/fuzz_replay

# a recipe that fails leaves no half-written target behind
.DELETE_ON_ERROR:

.PHONY: all deps test-deps unit replay itest screenshots test demo bench bench-script accuracy attack candidate-cost soak fuzz fuzz-smoke \
        check-config matrix install uninstall clean help deb deb-deps test-deb version check-version

all: $(BIN) $(LIBSPOA) $(BUILD)/spop-load

help:
	@sed -n '1,23p' Makefile

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# The Lua scripts are assembled into one script and embedded in the binary:
# what was tested is what runs.
$(BUILD)/gen/ratelimit.lua: $(LUA)
	@mkdir -p $(dir $@)
	@echo "  GEN     $@"
	$(Q)cat $(LUA) > $@.tmp && mv $@.tmp $@

# Any failing step fails the recipe (set -e): a missing xxd stops the build with
# a message instead of leaving a broken scripts.c behind, and the .tmp file is
# only renamed once complete, so the next `make` generates it again.
$(BUILD)/gen/scripts.c: $(BUILD)/gen/ratelimit.lua lua/heartbeat.lua
	@echo "  GEN     $@"
	$(Q)set -e; command -v xxd >/dev/null || \
	  { echo "xxd not found: it embeds lua/ in the agent (apt-get install xxd, or make deps)" >&2; \
	    exit 1; }; \
	{ echo '/* generated from lua/ by the Makefile: do not edit */'; \
	  echo '#include "scripts.h"'; \
	  echo 'const char script_ratelimit[] = {'; xxd -i < $<; echo ', 0x00 };'; \
	  echo 'const size_t script_ratelimit_len = sizeof(script_ratelimit) - 1;'; \
	  echo 'const char script_heartbeat[] = {'; xxd -i < lua/heartbeat.lua; echo ', 0x00 };'; \
	  echo 'const size_t script_heartbeat_len = sizeof(script_heartbeat) - 1;'; } > $@.tmp; \
	mv $@.tmp $@

$(BUILD)/gen/scripts.o: $(BUILD)/gen/scripts.c
	@echo "  CC      $<"
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(LIBSPOA): $(SPOA_OBJ)
	@echo "  AR      $@"
	$(Q)rm -f $@ && $(AR_LTO) rcs $@ $^

$(BIN): $(AGENT_OBJ) $(LIBSPOA)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(AGENT_OBJ) $(LIBSPOA) $(LIBS)

# ---- tests ---------------------------------------------------------------

$(BUILD)/test_spop: tests/unit/test_spop.c $(LIBSPOA)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIBSPOA) -lcmocka

$(BUILD)/test_limiter: tests/unit/test_limiter.c $(BUILD)/src/core/limiter.o $(BUILD)/src/core/digest.o \
                       $(BUILD)/src/core/util.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lcmocka -lm

$(BUILD)/test_memstore: tests/unit/test_memstore.c $(BUILD)/src/store/memstore.o $(BUILD)/src/core/limiter.o \
                        $(BUILD)/src/core/util.o $(BUILD)/src/core/hll.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lcmocka -lm

$(BUILD)/test_obs: tests/unit/test_obs.c $(BUILD)/src/net/http.o $(BUILD)/src/observe/prom.o \
                   $(BUILD)/src/observe/topk.o $(BUILD)/src/core/hll.o $(BUILD)/src/core/util.o $(BUILD)/src/core/log.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lev -lcmocka -lm

$(BUILD)/test_normalize: tests/unit/test_normalize.c $(BUILD)/src/core/normalize.o $(BUILD)/src/policy/rules.o \
                         $(BUILD)/src/config/config.o $(BUILD)/src/core/limiter.o $(BUILD)/src/core/util.o \
                         $(BUILD)/src/core/log.o $(BUILD)/spoa/spop.o $(BUILD)/src/core/secret.o \
                         $(BUILD)/src/config/config_read.o $(BUILD)/src/config/config_policy.o $(BUILD)/src/net/tls.o \
                         $(BUILD)/src/core/digest.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(PKG_LIBS) $(SSL_LIBS) -lcmocka -lm

# the parser lives with the agent's runtime: link every agent object but main()
$(BUILD)/test_overrides: tests/unit/test_overrides.c $(filter-out $(BUILD)/src/main.o,$(AGENT_OBJ)) \
                         $(LIBSPOA)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIBS) -lcmocka

# the status page with the metrics' view and the HTTP parser it is served by
$(BUILD)/test_status: tests/unit/test_status.c $(filter-out $(BUILD)/src/main.o,$(AGENT_OBJ)) \
                      $(LIBSPOA)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(LIBS) -lcmocka

$(MODEL): tests/tools/limit_model.c $(BUILD)/src/core/limiter.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lm

$(BUILD)/spop-load: tests/tools/spop_load.c $(LIBSPOA)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIBSPOA) -lev

$(BUILD)/fuzz_config_replay: tests/fuzz/fuzz_config.c tests/fuzz/replay.c $(BUILD)/src/config/config.o \
                             $(BUILD)/src/policy/rules.o $(BUILD)/src/core/util.o $(BUILD)/src/core/log.o \
                             $(BUILD)/src/core/limiter.o $(BUILD)/src/core/normalize.o $(BUILD)/spoa/spop.o \
                             $(BUILD)/src/core/secret.o $(BUILD)/src/config/config_read.o \
                             $(BUILD)/src/config/config_policy.o $(BUILD)/src/net/tls.o $(BUILD)/src/core/digest.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(PKG_LIBS) $(SSL_LIBS) -lm

$(BUILD)/fuzz_resp_replay: tests/fuzz/fuzz_resp.c tests/fuzz/replay.c $(BUILD)/src/store/store_reply.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(PKG_LIBS)

$(BUILD)/fuzz_reply_parse_replay: tests/fuzz/fuzz_reply_parse.c tests/fuzz/replay.c \
                                  $(BUILD)/src/store/store_reply.o $(BUILD)/src/store/reply_parse.o \
                                  $(BUILD)/src/store/store_parse.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) $(PKG_LIBS)

$(BUILD)/fuzz_http_replay: tests/fuzz/fuzz_http.c tests/fuzz/replay.c $(BUILD)/src/net/http.o \
                           $(BUILD)/src/core/log.o $(BUILD)/src/core/util.o
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lev -lm

$(REPLAY): tests/fuzz/fuzz_spop_frame.c tests/fuzz/replay.c $(LIBSPOA)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ tests/fuzz/fuzz_spop_frame.c tests/fuzz/replay.c \
	  $(LIBSPOA)

unit: $(UNIT_BINS)
	$(Q)for t in $(UNIT_BINS); do echo "== $$t"; $$t || exit 1; done

# The fuzz corpus is replayed as a regression test under ASan/UBSan.
replay:
	$(Q)$(MAKE) --no-print-directory SANITIZE=address,undefined build-asan/fuzz_replay \
	  build-asan/fuzz_config_replay build-asan/fuzz_resp_replay build-asan/fuzz_http_replay \
	  build-asan/fuzz_reply_parse_replay
	build-asan/fuzz_replay tests/fuzz/corpus/spop_frame
	build-asan/fuzz_config_replay tests/fuzz/corpus/config
	build-asan/fuzz_resp_replay tests/fuzz/corpus/resp
	build-asan/fuzz_reply_parse_replay tests/fuzz/corpus/reply_parse
	build-asan/fuzz_http_replay tests/fuzz/corpus/http

SPOA_BIN ?= $(abspath $(BIN))
itest: $(BIN) $(MODEL) $(BUILD)/gen/ratelimit.lua
	SPOA_BIN=$(SPOA_BIN) LIMIT_MODEL=$(abspath $(MODEL)) \
	  RATELIMIT_LUA=$(abspath $(BUILD)/gen/ratelimit.lua) $(PYTHON) -m pytest -q tests/integration

# the status page's screenshots in doc/operations.md (doc/img/status-*.png): the browser
# tests of test_status.py write them, in chromium, with a real agent and Redis (~30 s)
screenshots: $(BIN) $(MODEL) $(BUILD)/gen/ratelimit.lua
	STATUS_SCREENSHOTS=$(CURDIR)/doc/img SPOA_BIN=$(SPOA_BIN) LIMIT_MODEL=$(abspath $(MODEL)) \
	  RATELIMIT_LUA=$(abspath $(BUILD)/gen/ratelimit.lua) $(PYTHON) -m pytest -q \
	  -p no:cacheprovider tests/integration/test_status.py -k "first_screen or not_answering"

test: test-deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)$(MAKE) --no-print-directory unit
	$(Q)$(MAKE) --no-print-directory replay
	$(Q)$(MAKE) --no-print-directory itest

# the map of src/ in doc/development.md against the #include lines: layers, no cycles
.PHONY: check-layers
check-layers:
	$(PYTHON) tests/check_layers.py

# ---- fuzzing (clang + libFuzzer) ------------------------------------------
# `clang` is the release's default (14 on Debian 12, 19 on Debian 13); libFuzzer
# comes with libclang-rt-dev on both.
CLANG ?= clang

FUZZ_BUILD = build-fuzz
fuzz: $(FUZZ_BUILD)/fuzz_spop_frame $(FUZZ_BUILD)/fuzz_config $(FUZZ_BUILD)/fuzz_resp \
      $(FUZZ_BUILD)/fuzz_http $(FUZZ_BUILD)/fuzz_reply_parse

FUZZ_CONFIG_SRC = tests/fuzz/fuzz_config.c src/config/config.c src/policy/rules.c src/core/util.c src/core/log.c \
                  src/core/limiter.c src/core/normalize.c spoa/spop.c src/core/secret.c src/config/config_read.c \
                  src/config/config_policy.c src/net/tls.c src/core/digest.c
$(FUZZ_BUILD)/fuzz_config: $(FUZZ_CONFIG_SRC) src/config/config.h src/policy/rules.h
	@mkdir -p $(FUZZ_BUILD)
	$(CLANG) -std=gnu11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined $(SRC_INC) -Ispoa \
	  $(PKG_CFLAGS) -o $@ $(FUZZ_CONFIG_SRC) -lconfig $(SSL_LIBS) -lm

$(FUZZ_BUILD)/fuzz_spop_frame: tests/fuzz/fuzz_spop_frame.c tests/fuzz/fuzz.h spoa/spop.c spoa/spop.h
	@mkdir -p $(FUZZ_BUILD)
	$(CLANG) -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Ispoa -o $@ \
	  tests/fuzz/fuzz_spop_frame.c spoa/spop.c

# the reply reader with the agent's reply objects (src/store/store_reply.c)
$(FUZZ_BUILD)/fuzz_resp: tests/fuzz/fuzz_resp.c tests/fuzz/fuzz.h src/store/store_reply.c src/store/store_reply.h
	@mkdir -p $(FUZZ_BUILD)
	$(CLANG) -std=gnu11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined $(SRC_INC) -Ispoa \
	  $(PKG_CFLAGS) -o $@ tests/fuzz/fuzz_resp.c src/store/store_reply.c -lhiredis

# the metrics listener's request parser (src/net/http.c), reachable by whoever can connect
# what the store reads out of replies (src/store/store_parse.c, src/store/reply_parse.c)
FUZZ_REPLY_PARSE_SRC = tests/fuzz/fuzz_reply_parse.c src/store/store_reply.c src/store/reply_parse.c \
                       src/store/store_parse.c
$(FUZZ_BUILD)/fuzz_reply_parse: $(FUZZ_REPLY_PARSE_SRC) tests/fuzz/fuzz.h src/store/store_reply.h \
                                src/store/reply_parse.h src/store/store_parse.h src/store/store_types.h
	@mkdir -p $(FUZZ_BUILD)
	$(CLANG) -std=gnu11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined $(SRC_INC) -Ispoa \
	  $(PKG_CFLAGS) -o $@ $(FUZZ_REPLY_PARSE_SRC) -lhiredis

FUZZ_HTTP_SRC = tests/fuzz/fuzz_http.c src/net/http.c src/core/log.c src/core/util.c
$(FUZZ_BUILD)/fuzz_http: $(FUZZ_HTTP_SRC) tests/fuzz/fuzz.h src/net/http.h
	@mkdir -p $(FUZZ_BUILD)
	$(CLANG) -std=gnu11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined $(SRC_INC) -Ispoa \
	  -o $@ $(FUZZ_HTTP_SRC) -lev -lm

fuzz-smoke: fuzz
	@mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/corpus-config $(FUZZ_BUILD)/corpus-resp \
	  $(FUZZ_BUILD)/corpus-http $(FUZZ_BUILD)/corpus-reply-parse
	$(FUZZ_BUILD)/fuzz_spop_frame -max_total_time=60 -max_len=65536 \
	  -dict=tests/fuzz/spop.dict $(FUZZ_BUILD)/corpus tests/fuzz/corpus/spop_frame
	# libconfig 1.5 leaks a few bytes on some syntax errors: not ours, not counted
	ASAN_OPTIONS=detect_leaks=0 $(FUZZ_BUILD)/fuzz_config -max_total_time=30 -max_len=4096 \
	  $(FUZZ_BUILD)/corpus-config tests/fuzz/corpus/config
	$(FUZZ_BUILD)/fuzz_resp -max_total_time=30 -max_len=65536 -dict=tests/fuzz/resp.dict \
	  $(FUZZ_BUILD)/corpus-resp tests/fuzz/corpus/resp
	$(FUZZ_BUILD)/fuzz_http -max_total_time=30 -max_len=65536 -dict=tests/fuzz/http.dict \
	  $(FUZZ_BUILD)/corpus-http tests/fuzz/corpus/http
	$(FUZZ_BUILD)/fuzz_reply_parse -max_total_time=30 -max_len=65536 \
	  -dict=tests/fuzz/reply_parse.dict $(FUZZ_BUILD)/corpus-reply-parse \
	  tests/fuzz/corpus/reply_parse

# ---- the main job and the benchmark ----------------------------------------

demo: deps
	$(Q)$(MAKE) --no-print-directory all
	$(PYTHON) tests/tools/demo.py --agent $(abspath $(BIN))

bench: deps
	$(Q)$(MAKE) --no-print-directory all $(MODEL)
	$(PYTHON) tests/tools/bench.py --agent $(abspath $(BIN)) --load $(abspath $(BUILD)/spop-load) \
	  --model $(abspath $(MODEL))

bench-script: deps
	$(Q)$(MAKE) --no-print-directory $(MODEL) $(BUILD)/gen/ratelimit.lua
	$(PYTHON) tests/tools/script_bench.py --script $(abspath $(BUILD)/gen/ratelimit.lua) \
	  --model $(abspath $(MODEL))

accuracy: deps
	$(Q)$(MAKE) --no-print-directory all
	$(PYTHON) tests/tools/accuracy.py --agent $(abspath $(BIN)) --load $(abspath $(BUILD)/spop-load)

candidate-cost: deps
	$(Q)$(MAKE) --no-print-directory all
	$(PYTHON) tests/tools/candidate_cost.py --agent $(abspath $(BIN))

attack: deps
	$(Q)$(MAKE) --no-print-directory all
	$(PYTHON) tests/tools/attack.py --agent $(abspath $(BIN)) --load $(abspath $(BUILD)/spop-load) \
	  $(if $(ATTACKS),--attacks $(ATTACKS))

# steady load for SOAK_MIN minutes with reloads, Redis restarts and a worker restart:
# RSS, descriptors and Redis memory sampled, each levelled off or not
SOAK_MIN  ?= 10
SOAK_RATE ?= 3000
SOAK_KEYS ?= 200000
SOAK_CONNS ?= 64
soak: deps
	$(Q)$(MAKE) --no-print-directory all
	$(PYTHON) tests/tools/soak.py --agent $(abspath $(BIN)) --load $(abspath $(BUILD)/spop-load) \
	  --minutes $(SOAK_MIN) --rate $(SOAK_RATE) --keys $(SOAK_KEYS) --conns $(SOAK_CONNS)

# ---- checks ----------------------------------------------------------------

# the samples as they ship: no RL_* variable, from the repository root
HAPROXY ?= haproxy
check-config: $(BIN)
	$(BIN) -c -f contrib/spoa-ratelimit.conf
	env $$(env | sed -n 's/^\(RL_[A-Za-z0-9_]*\)=.*/-u \1/p') $(HAPROXY) -c -f haproxy/haproxy.cfg
	env $$(env | sed -n 's/^\(RL_[A-Za-z0-9_]*\)=.*/-u \1/p') $(HAPROXY) -c -f haproxy/upstream.cfg

# The test matrix beyond this machine (root; doc/development.md, "The test matrix"):
# Debian 13, HAProxy 3.2 and 3.4, Valkey 8.1 and 9.1, in Debian roots (mmdebstrap).
# `make matrix LEGS="haproxy-3.4 valkey-9"` runs some legs only.
matrix:
	tests/matrix/run $(LEGS)

# ---- dependencies: Debian 12 and 13 (package names that exist on both) ------

DEB_PKGS = gcc make pkg-config xxd libev-dev libhiredis-dev libconfig-dev libcmocka-dev libc-ares-dev libssl-dev \
           redis-server redis-tools haproxy python3 python3-pytest wrk clang \
           libclang-rt-dev socat dnsmasq-base openssl

# apt-get installs those of the packages $(1) that are missing (sudo unless root).
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || \
	    missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

deps:
	$(call apt_install,$(DEB_PKGS))

# What only the tests need: a headless browser for the status page
# (tests/integration/test_status.py skips that test where it is missing).
DEB_TEST_PKGS = chromium

test-deps: deps
	$(call apt_install,$(DEB_TEST_PKGS))

# ---- Debian package (debian/) ------------------------------------------------
#
# dpkg-buildpackage writes into the parent directory; `make deb` moves what it
# built (the .deb, the -dbgsym .deb, .buildinfo, .changes) into $(DEB_OUT)/ and
# runs lintian on it. The source tree is cleaned after the build (--post-clean);
# debian/rules builds in debian/build/, never in build/.

DEB_TOOLS   = build-essential debhelper devscripts lintian fakeroot
DEB_OUT    ?= build/deb
# The package version: the first line of debian/changelog (a native package,
# so it is the upstream version itself; `check-version` compares it with VERSION).
DEB_VERSION = $(shell head -n 1 debian/changelog | cut -d ' ' -f 2 | tr -d '()')

version:
	@echo $(VERSION)

check-version:
	@v='$(DEB_VERSION)'; v=$${v#*:}; v=$${v%-*}; \
	if [ "$$v" != "$(VERSION)" ]; then \
	  echo "version mismatch: Makefile VERSION = $(VERSION), debian/changelog = $(DEB_VERSION)" >&2; \
	  exit 1; fi; \
	echo "version $(VERSION): Makefile and debian/changelog agree"

# The tools, then the Build-Depends of debian/control (apt-get build-dep reads them).
deb-deps:
	$(call apt_install,$(DEB_TOOLS))
	$(Q)dpkg-checkbuilddeps 2>/dev/null || { \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get build-dep -y -qq --no-install-recommends ./; }

deb: deb-deps check-version
	$(Q)arch=$$(dpkg --print-architecture); \
	  changes=../spoa-ratelimit_$(DEB_VERSION)_$$arch.changes; \
	  rm -rf $(DEB_OUT) && mkdir -p $(DEB_OUT) && \
	  dpkg-buildpackage -us -uc -b --post-clean && \
	  for f in $$(awk '/^Files:/ {f = 1; next} /^[^ ]/ {f = 0} f {print $$5}' $$changes); do \
	    mv "../$$f" $(DEB_OUT)/; done && \
	  mv $$changes $(DEB_OUT)/ && \
	  echo "== lintian" && lintian --fail-on error,warning $(DEB_OUT)/*.changes && \
	  echo "== built in $(DEB_OUT)/:" && ls -1 $(DEB_OUT)

# Installs the package built by `make deb` and purges it again (root; see the script).
test-deb:
	tests/package/test_deb.sh

# ---- install ---------------------------------------------------------------

install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/spoa-ratelimit/haproxy \
	  $(DESTDIR)$(PREFIX)/share/doc/spoa-ratelimit/doc
	install -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/spoa-ratelimit
	install -m 0644 haproxy/haproxy.cfg haproxy/spoe-ratelimit.conf haproxy/tiers.map \
	  $(DESTDIR)$(PREFIX)/share/spoa-ratelimit/haproxy/
	install -m 0644 contrib/spoa-ratelimit.conf contrib/spoa-ratelimit.service \
	  contrib/prometheus-alerts.yml contrib/grafana-dashboard.json README.md \
	  $(DESTDIR)$(PREFIX)/share/doc/spoa-ratelimit/
	install -m 0644 contrib/README.md $(DESTDIR)$(PREFIX)/share/doc/spoa-ratelimit/contrib.md
	install -m 0644 doc/*.md $(DESTDIR)$(PREFIX)/share/doc/spoa-ratelimit/doc/
	install -d $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man8
	install -m 0644 doc/man/spoa-ratelimit.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 0644 doc/man/spoa-ratelimit.conf.5 $(DESTDIR)$(PREFIX)/share/man/man5/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/spoa-ratelimit
	rm -rf $(DESTDIR)$(PREFIX)/share/spoa-ratelimit $(DESTDIR)$(PREFIX)/share/doc/spoa-ratelimit
	rm -f $(DESTDIR)$(PREFIX)/share/man/man8/spoa-ratelimit.8 \
	  $(DESTDIR)$(PREFIX)/share/man/man5/spoa-ratelimit.conf.5

clean:
	rm -rf build build-asan build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
