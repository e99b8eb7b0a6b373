/* SPDX-License-Identifier: MIT */
/*
 * libconfig front end. Every key is looked up through a small table of known
 * names per section so a typo is an error, not a silently ignored setting.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libconfig.h>

#include "limiter.h"
#include "log.h"
#include "normalize.h"
#include "secret.h"
#include "store.h"
#include "util.h"

struct loader {
	const char *file;
	struct cfg_errors *errs;
	struct agent_config *cfg;
};

static void add_err(struct loader *ld, int line, const char *fmt, ...) PRINTF(3, 4);

static void add_err(struct loader *ld, int line, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ld->errs->msgs = xrealloc(ld->errs->msgs, (ld->errs->n + 1) * sizeof(char *));
	ld->errs->msgs[ld->errs->n++] = xasprintf("%s:%d: %s", ld->file, line, msg);
}

static int line_of(const config_setting_t *s)
{
	return s ? (int)config_setting_source_line(s) : 0;
}

/* Reports every member of group <g> whose name is not in <known>. */
static void check_known(struct loader *ld, const config_setting_t *g, const char *where,
			const char *const *known)
{
	int i, n = config_setting_length(g);

	for (i = 0; i < n; i++) {
		const config_setting_t *m = config_setting_get_elem(g, (unsigned)i);
		const char *name = config_setting_name(m);
		const char *const *k;

		if (!name)
			continue;
		for (k = known; *k; k++)
			if (strcmp(*k, name) == 0)
				break;
		if (!*k)
			add_err(ld, line_of(m), "unknown setting '%s' in %s", name, where);
	}
}

/* Reads string <name> of group <g>; returns a copy, <dflt> copy, or NULL. */
static char *get_str(struct loader *ld, const config_setting_t *g, const char *name,
		     const char *dflt)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;

	if (!s)
		return dflt ? xstrdup(dflt) : NULL;
	if (config_setting_type(s) != CONFIG_TYPE_STRING) {
		add_err(ld, line_of(s), "'%s' must be a string", name);
		return dflt ? xstrdup(dflt) : NULL;
	}
	return xstrdup(config_setting_get_string(s));
}

/* Reads integer <name> of <g> within [lo, hi] into <out> (left alone if absent). */
static void get_uint(struct loader *ld, const config_setting_t *g, const char *name, long long lo,
		     long long hi, unsigned *out)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;
	long long v;

	if (!s)
		return;
	if (config_setting_type(s) != CONFIG_TYPE_INT && config_setting_type(s) != CONFIG_TYPE_INT64) {
		add_err(ld, line_of(s), "'%s' must be an integer", name);
		return;
	}
	v = config_setting_get_int64(s);
	if (v < lo || v > hi) {
		add_err(ld, line_of(s), "'%s' must be between %lld and %lld", name, lo, hi);
		return;
	}
	*out = (unsigned)v;
}

/*
 * Reads duration <name> of <g> (a string like "10ms", "30s", "5m") within
 * [lo, hi] milliseconds into <out> (left alone if absent).
 */
static void get_duration(struct loader *ld, const config_setting_t *g, const char *name,
			 uint64_t lo, uint64_t hi, unsigned *out)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;
	uint64_t ms;

	if (!s)
		return;
	if (config_setting_type(s) != CONFIG_TYPE_STRING ||
	    parse_duration_ms(config_setting_get_string(s), &ms) < 0 || ms < lo || ms > hi) {
		add_err(ld, line_of(s),
			"'%s' must be a duration like \"10ms\", \"30s\" or \"5m\", from %llu ms "
			"to %llu ms",
			name, (unsigned long long)lo, (unsigned long long)hi);
		return;
	}
	*out = (unsigned)ms;
}

static void get_bool(struct loader *ld, const config_setting_t *g, const char *name, bool *out)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;

	if (!s)
		return;
	if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
		add_err(ld, line_of(s), "'%s' must be true or false", name);
		return;
	}
	*out = config_setting_get_bool(s);
}

/* A policy name goes into headers between quotes: keep it to a safe alphabet. */
static bool name_ok(const char *n)
{
	size_t i, l = strlen(n);

	if (l == 0 || l > 64)
		return false;
	for (i = 0; i < l; i++) {
		char c = n[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return false;
	}
	return true;
}

/*
 * A password of group <g> (<where>: "redis", "redis.sentinel"): written in
 * the file (`password`, whose line goes to <line> when not NULL, for the advice
 * of config_password_advice()), or read from a file of its own
 * (`password_file`, see secret.c; its resolved path to <file>), not both. A
 * password file that cannot be used is an error naming it.
 */
static void load_password_file(struct loader *ld, const config_setting_t *g, const char *where,
			       char **password, char **file, int *line)
{
	const config_setting_t *inl = g ? config_setting_get_member(g, "password") : NULL;
	const config_setting_t *s = g ? config_setting_get_member(g, "password_file") : NULL;
	char err[256], *name;

	if (!s) {
		if (inl && *password && **password && line)
			*line = line_of(inl);
		return;
	}
	if (inl) {
		add_err(ld, line_of(s), "%s: 'password' and 'password_file' together: keep "
					"'password_file' and remove 'password'", where);
		return;
	}
	name = get_str(ld, g, "password_file", NULL);
	if (!name)
		return;
	if (!*name) {
		add_err(ld, line_of(s), "%s.password_file is empty: name the file", where);
	} else {
		*file = secret_path(name, ld->file);
		if (secret_read(*file, password, err, sizeof(err)) < 0)
			add_err(ld, line_of(s), "%s.password_file '%s': %s", where, *file, err);
	}
	free(name);
}

/* "ip:port", "[ipv6]:port", "host:port" (a DNS name) or "unix:/path". */
static bool redis_address_ok(const char *addr)
{
	char host[256];
	int port;

	if (strncmp(addr, "unix:", 5) == 0)
		return addr[5] == '/' || addr[5] == '.';
	if (hostport_split(addr, host, sizeof(host), &port) < 0)
		return false;
	return host_is_numeric(host) || (addr[0] != '[' && host_name_ok(host));
}

/*
 * redis.sentinel { addresses = ["ip:port", ...]; master = "name"; user = ...;
 * password = ...; }: the master is found by asking these Sentinels (src/sentinel.c)
 * instead of redis.address, which must then not be set.
 */
static void load_sentinel(struct loader *ld, const config_setting_t *s)
{
	static const char *const known[] = {"addresses", "master", "user", "password",
					    "password_file", NULL};
	const config_setting_t *g = s ? config_setting_get_member(s, "sentinel") : NULL;
	const config_setting_t *list;
	struct agent_config *cfg = ld->cfg;
	int i, n;

	if (!g)
		return;
	if (!config_setting_is_group(g)) {
		add_err(ld, line_of(g),
			"redis.sentinel: a group { addresses = [...]; master = \"name\"; }");
		return;
	}
	check_known(ld, g, "redis.sentinel", known);
	if (config_setting_get_member(s, "address"))
		add_err(ld, line_of(g), "redis.sentinel: the Sentinels say where the master is: "
			"remove redis.address");
	cfg->redis.sentinel_master = get_str(ld, g, "master", NULL);
	if (!cfg->redis.sentinel_master || !name_ok(cfg->redis.sentinel_master) ||
	    strlen(cfg->redis.sentinel_master) > 64)
		add_err(ld, line_of(g), "redis.sentinel.master: the name the Sentinels monitor "
			"(at most 64 of [A-Za-z0-9_.-])");
	cfg->redis.sentinel_user = get_str(ld, g, "user", NULL);
	cfg->redis.sentinel_password = get_str(ld, g, "password", NULL);
	load_password_file(ld, g, "redis.sentinel", &cfg->redis.sentinel_password,
			   &cfg->redis.sentinel_password_file, NULL);
	list = config_setting_get_member(g, "addresses");
	n = list && (config_setting_is_array(list) || config_setting_is_list(list))
		    ? config_setting_length(list) : 0;
	if (n < 1 || n > 16) {
		add_err(ld, line_of(list ? list : g),
			"redis.sentinel.addresses: a list of 1 to 16 \"ip:port\"");
		return;
	}
	cfg->redis.sentinels = xcalloc((size_t)n, sizeof(char *));
	for (i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(list, (unsigned)i);
		const char *v = config_setting_type(e) == CONFIG_TYPE_STRING
					? config_setting_get_string(e) : "";
		char host[64];
		int port;

		if (hostport_split(v, host, sizeof(host), &port) < 0 || !host_is_numeric(host)) {
			add_err(ld, line_of(list), "redis.sentinel.addresses: '%s' is no ip:port or "
				"[ipv6]:port", v);
			continue;
		}
		cfg->redis.sentinels[cfg->redis.nsentinels++] = xstrdup(v);
	}
}

/*
 * redis.nameservers (a string or a list of "ip" / "ip:port" / "[ip6]:port")
 * and redis.resolve_timeout_ms: the DNS servers that resolve host names in
 * the addresses, instead of /etc/resolv.conf's.
 */
static void load_resolver(struct loader *ld, const config_setting_t *s)
{
	const config_setting_t *ns = s ? config_setting_get_member(s, "nameservers") : NULL;
	char csv[1024];
	size_t len = 0;
	int i, n;

	get_uint(ld, s, "resolve_timeout_ms", 1, 60000, &ld->cfg->redis.resolve_timeout_ms);
	if (!ns)
		return;
	if (config_setting_type(ns) == CONFIG_TYPE_STRING) {
		n = 1;
	} else if (config_setting_is_array(ns) || config_setting_is_list(ns)) {
		n = config_setting_length(ns);
	} else {
		add_err(ld, line_of(ns), "redis.nameservers: a string or a list of \"ip[:port]\"");
		return;
	}
	csv[0] = 0;
	for (i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_type(ns) == CONFIG_TYPE_STRING
						    ? ns : config_setting_get_elem(ns, (unsigned)i);
		const char *v = config_setting_type(e) == CONFIG_TYPE_STRING
					? config_setting_get_string(e) : NULL;
		char host[64];
		const char *colon, *h = v;
		size_t hl;

		if (!v || !*v || strchr(v, ',')) {
			add_err(ld, line_of(ns), "redis.nameservers: each entry a string \"ip[:port]\"");
			return;
		}
		/* "ip", "ip:port", "[ip6]:port" or a bare ip6 */
		colon = strrchr(v, ':');
		hl = strlen(v);
		if (v[0] == '[') {
			const char *rb = strchr(v, ']');

			h = v + 1;
			hl = rb ? (size_t)(rb - h) : 0;
		} else if (colon && strchr(v, ':') == colon) {
			hl = (size_t)(colon - v);
		}
		if (!hl || hl >= sizeof(host)) {
			add_err(ld, line_of(ns), "redis.nameservers: '%s' is no ip[:port]", v);
			return;
		}
		memcpy(host, h, hl);
		host[hl] = 0;
		if (!host_is_numeric(host)) {
			add_err(ld, line_of(ns), "redis.nameservers: '%s' is no ip[:port]", v);
			return;
		}
		len = str_cat(csv, sizeof(csv), len, i ? "," : "");
		len = str_cat(csv, sizeof(csv), len, v);
	}
	if (len >= sizeof(csv) - 1) {
		add_err(ld, line_of(ns), "redis.nameservers: too long");
		return;
	}
	ld->cfg->redis.nameservers = xstrdup(csv);
}

static void load_limit(struct loader *ld, const config_setting_t *s, struct cfg_limit *l)
{
	static const char *const known[] = {"algorithm", "rate", "period", "burst", "shadow",
					    "on_failure", "local_rate", "accuracy_budget", NULL};
	const config_setting_t *m;
	unsigned v;
	char *alg;

	l->name = xstrdup(config_setting_name(s));
	l->line = line_of(s);
	if (!config_setting_is_group(s)) {
		add_err(ld, l->line, "limit '%s' must be a group { rate = N; period = \"1s\"; }",
			l->name);
		return;
	}
	check_known(ld, s, "a limit", known);
	if (!name_ok(l->name))
		add_err(ld, l->line, "limit name '%s': use at most 64 of [A-Za-z0-9_.-]", l->name);
	alg = get_str(ld, s, "algorithm", "gcra");
	l->alg = limit_alg_parse(alg);
	if (l->alg < 0)
		add_err(ld, l->line,
			"limit '%s': unknown algorithm '%s' (known: gcra, token_bucket, "
			"fixed_window, sliding_log, sliding_window)",
			l->name, alg);
	free(alg);
	get_bool(ld, s, "shadow", &l->shadow);
	/* the default never leaves a limit unenforced while Redis is away */
	alg = get_str(ld, s, "on_failure", "local");
	if (strcmp(alg, "open") == 0)
		l->on_failure = FAIL_OPEN;
	else if (strcmp(alg, "closed") == 0)
		l->on_failure = FAIL_CLOSED;
	else if (strcmp(alg, "local") == 0)
		l->on_failure = FAIL_LOCAL;
	else
		add_err(ld, line_of(config_setting_get_member(s, "on_failure")),
			"limit '%s': on_failure '%s': use \"open\", \"closed\" or \"local\"",
			l->name, alg);
	free(alg);
	v = 0;
	get_uint(ld, s, "local_rate", 1, 1000000000LL, &v);
	l->local_rate = v;
	m = config_setting_get_member(s, "accuracy_budget");
	if (m) {
		double b = -1;

		if (config_setting_type(m) == CONFIG_TYPE_FLOAT)
			b = config_setting_get_float(m);
		else if (config_setting_type(m) == CONFIG_TYPE_INT && config_setting_get_int(m) == 0)
			b = 0;
		if (!(b >= 0 && b <= 0.5))
			add_err(ld, line_of(m),
				"limit '%s': 'accuracy_budget' must be a fraction from 0 to 0.5 "
				"(0.05 = 5%%)", l->name);
		else
			l->budget = b;
	}
	m = config_setting_get_member(s, "rate");
	if (!m) {
		add_err(ld, l->line, "limit '%s': 'rate' is required", l->name);
	} else {
		v = 0;
		get_uint(ld, s, "rate", 1, 1000000000LL, &v);
		l->rate = v;
	}
	m = config_setting_get_member(s, "period");
	if (!m) {
		add_err(ld, l->line, "limit '%s': 'period' is required", l->name);
	} else if (config_setting_type(m) != CONFIG_TYPE_STRING ||
		   parse_duration_ms(config_setting_get_string(m), &l->period_ms) < 0 ||
		   l->period_ms < 1 || l->period_ms > 366ULL * 86400000) {
		add_err(ld, line_of(m),
			"limit '%s': 'period' must be a duration like \"250ms\", \"1s\", \"1m\", "
			"\"1h\", \"1d\" (at most 366d)",
			l->name);
	}
	v = 0;
	get_uint(ld, s, "burst", 1, 1000000000LL, &v);
	l->burst = v ? v : l->rate;
	if (v && l->alg != ALG_GCRA)
		add_err(ld, line_of(config_setting_get_member(s, "burst")),
			"limit '%s': 'burst' applies to gcra/token_bucket only", l->name);
	if (l->alg == ALG_SLIDING_LOG && l->rate > LOG_RATE_MAX)
		add_err(ld, l->line,
			"limit '%s': sliding_log keeps one entry per token and Redis trims them "
			"while it serves nobody else: at most %d per period (use sliding_window)",
			l->name, LOG_RATE_MAX);
	if (l->alg == ALG_SLIDING_LOG && l->budget > 0)
		add_err(ld, line_of(config_setting_get_member(s, "accuracy_budget")),
			"limit '%s': sliding_log is exact, one entry per token: 'accuracy_budget' "
			"(batches of tokens) must be 0 (use sliding_window or gcra)",
			l->name);
	if (l->rate && l->period_ms &&
	    limit_params_check(l->alg, l->rate, l->period_ms, l->burst) < 0)
		add_err(ld, line_of(config_setting_get_member(s, v ? "burst" : "rate")),
			"limit '%s': a bucket of %llu tokens refilled at %llu per %llu ms takes "
			"longer than 2^49 us (~17.8 years) to refill: not representable, lower "
			"'burst' or raise 'rate'",
			l->name, (unsigned long long)l->burst, (unsigned long long)l->rate,
			(unsigned long long)l->period_ms);
}

static void load_tier(struct loader *ld, const config_setting_t *s, struct cfg_tier *t,
		      const char *name)
{
	static const char *const known_tier[] = {"limits", NULL};
	static const char *const known_anon[] = {"limits", "ipv4_prefix", "ipv6_prefix",
						 "without_address", NULL};
	const config_setting_t *list;
	int i, n;

	t->name = xstrdup(name);
	t->line = line_of(s);
	if (!config_setting_is_group(s)) {
		add_err(ld, t->line, "'%s' must be a group { limits = [ ... ]; }", name);
		return;
	}
	check_known(ld, s, name, strcmp(name, "anonymous") == 0 ? known_anon : known_tier);
	list = config_setting_get_member(s, "limits");
	if (!list || !(config_setting_is_array(list) || config_setting_is_list(list))) {
		add_err(ld, t->line, "'%s': 'limits' must be a list of limit names", name);
		return;
	}
	n = config_setting_length(list);
	if (n < 1 || n > STORE_MAX_LIMITS) {
		add_err(ld, line_of(list), "'%s': between 1 and %d limits", name, STORE_MAX_LIMITS);
		return;
	}
	t->limits = xcalloc((size_t)n, sizeof(char *));
	for (i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(list, (unsigned)i);
		size_t j;

		if (config_setting_type(e) != CONFIG_TYPE_STRING) {
			add_err(ld, line_of(list), "'%s': limit names must be strings", name);
			continue;
		}
		t->limits[t->nlimits] = xstrdup(config_setting_get_string(e));
		for (j = 0; j < t->nlimits; j++)
			if (strcmp(t->limits[j], t->limits[t->nlimits]) == 0)
				add_err(ld, line_of(list), "'%s': limit '%s' listed twice", name,
					t->limits[j]);
		t->nlimits++;
	}
}

static void check_tier_refs(struct loader *ld, const struct cfg_tier *t)
{
	size_t i, j;

	for (i = 0; i < t->nlimits; i++) {
		for (j = 0; j < ld->cfg->nlimits; j++)
			if (strcmp(t->limits[i], ld->cfg->limits[j].name) == 0)
				break;
		if (j == ld->cfg->nlimits)
			add_err(ld, t->line, "'%s' refers to unknown limit '%s'", t->name, t->limits[i]);
	}
}

/* Reads an optional list of limit names <name> of group <g> into <t>. */
static void load_name_list(struct loader *ld, const config_setting_t *g, const char *name,
			   const char *owner, struct cfg_tier *t)
{
	const config_setting_t *list = config_setting_get_member(g, name);
	int i, n;

	t->name = xasprintf("%s", owner);
	t->line = line_of(g);
	if (!list)
		return;
	if (!config_setting_is_array(list) && !config_setting_is_list(list)) {
		add_err(ld, line_of(list), "%s: '%s' must be a list of limit names", owner, name);
		return;
	}
	n = config_setting_length(list);
	if (n > STORE_MAX_LIMITS) {
		add_err(ld, line_of(list), "%s: at most %d limits in '%s'", owner, STORE_MAX_LIMITS,
			name);
		return;
	}
	t->limits = xcalloc((size_t)n, sizeof(char *));
	for (i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(list, (unsigned)i);

		if (config_setting_type(e) != CONFIG_TYPE_STRING)
			add_err(ld, line_of(list), "%s: limit names must be strings", owner);
		else
			t->limits[t->nlimits++] = xstrdup(config_setting_get_string(e));
		for (size_t j = 0; t->nlimits && j + 1 < t->nlimits; j++)
			if (strcmp(t->limits[j], t->limits[t->nlimits - 1]) == 0)
				add_err(ld, line_of(list), "%s: limit '%s' listed twice in '%s'", owner,
					t->limits[j], name);
	}
	check_tier_refs(ld, t);
}

/*
 * Reads post-charge group <name> of <g> into <p> (p->set when present), with
 * <msg> for the top level's `message`, NULL for an endpoint's.
 */
static void load_post(struct loader *ld, const config_setting_t *g, const char *name,
		      struct cfg_post *p, char **msg)
{
	static const char *const known[] = {"from", "per", "max", "message", NULL};
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;
	unsigned v;
	char *str;

	p->from = POST_FROM_CHARGE;
	p->per = 1;
	p->max = 1000000;
	if (!s)
		return;
	if (!config_setting_is_group(s)) {
		add_err(ld, line_of(s), "'%s' must be a group { from = \"charge\"; per = 1; }", name);
		return;
	}
	p->set = true;
	check_known(ld, s, name, known);
	if (msg) {
		free(*msg);
		*msg = get_str(ld, s, "message", "rl-res");
	} else if (config_setting_get_member(s, "message")) {
		add_err(ld, line_of(config_setting_get_member(s, "message")),
			"'%s.message' belongs to the top level's post_charge", name);
	}
	str = get_str(ld, s, "from", "charge");
	if (strcmp(str, "charge") == 0)
		p->from = POST_FROM_CHARGE;
	else if (strcmp(str, "bytes") == 0)
		p->from = POST_FROM_BYTES;
	else if (strcmp(str, "time") == 0)
		p->from = POST_FROM_TIME;
	else
		add_err(ld, line_of(config_setting_get_member(s, "from")),
			"%s.from '%s': use \"charge\", \"bytes\" or \"time\"", name, str);
	free(str);
	v = 1;
	get_uint(ld, s, "per", 1, 1000000000, &v);
	p->per = v;
	v = 1000000;
	get_uint(ld, s, "max", 0, 1000000, &v);
	p->max = v;
}

static void load_endpoint(struct loader *ld, const config_setting_t *g, struct cfg_endpoint *e)
{
	static const char *const known[] = {"name", "route", "path_prefix", "methods", "cost",
					    "limit_costs", "limits", "global_limits",
					    "post_charge", NULL};
	const config_setting_t *m;
	unsigned v;
	int i, n;

	e->line = line_of(g);
	e->cost = 1;
	if (!config_setting_is_group(g)) {
		add_err(ld, e->line, "an endpoint must be a group { name = ...; path_prefix = ...; }");
		e->name = xstrdup("?"); /* every endpoint has a name, even a rejected one */
		return;
	}
	check_known(ld, g, "an endpoint", known);
	e->name = get_str(ld, g, "name", NULL);
	if (!e->name || !name_ok(e->name)) {
		add_err(ld, e->line, "endpoint: 'name' is required, at most 64 of [A-Za-z0-9_.-]");
		free(e->name);
		e->name = xstrdup("?");
	}
	e->route = get_str(ld, g, "route", NULL);
	e->path_prefix = get_str(ld, g, "path_prefix", NULL);
	if (!e->route && !e->path_prefix)
		add_err(ld, e->line, "endpoint '%s': needs 'route' or 'path_prefix'", e->name);
	if (e->path_prefix && e->path_prefix[0] != '/')
		add_err(ld, e->line, "endpoint '%s': 'path_prefix' must start with '/'", e->name);
	/* matched against the normalised path (rules.c), which has neither and is bounded */
	if (e->path_prefix && strpbrk(e->path_prefix, "?#"))
		add_err(ld, e->line, "endpoint '%s': 'path_prefix' is a path: no '?' or '#'",
			e->name);
	if (e->path_prefix && strlen(e->path_prefix) > NORM_PATH_MAX)
		add_err(ld, e->line, "endpoint '%s': 'path_prefix' longer than %d bytes", e->name,
			NORM_PATH_MAX);
	m = config_setting_get_member(g, "methods");
	if (m && (config_setting_is_array(m) || config_setting_is_list(m))) {
		n = config_setting_length(m);
		e->methods = xcalloc((size_t)n, sizeof(char *));
		for (i = 0; i < n; i++) {
			const char *str = config_setting_get_string_elem(m, (unsigned)i);

			if (!str || !*str)
				add_err(ld, line_of(m), "endpoint '%s': methods must be strings",
					e->name);
			else
				e->methods[e->nmethods++] = xstrdup(str);
		}
	} else if (m) {
		add_err(ld, line_of(m), "endpoint '%s': 'methods' must be a list", e->name);
	}
	v = 1;
	get_uint(ld, g, "cost", 0, 1000000, &v);
	e->cost = v;
	m = config_setting_get_member(g, "limit_costs");
	if (m && !config_setting_is_group(m)) {
		add_err(ld, line_of(m), "endpoint '%s': 'limit_costs' must be a group", e->name);
	} else if (m) {
		n = config_setting_length(m);
		e->cost_limits = xcalloc((size_t)n, sizeof(char *));
		e->cost_values = xcalloc((size_t)n, sizeof(int64_t));
		for (i = 0; i < n; i++) {
			const config_setting_t *c = config_setting_get_elem(m, (unsigned)i);
			const char *lname = config_setting_name(c);
			struct cfg_tier one = {.limits = (char **)&lname, .nlimits = 1,
					       .name = e->name, .line = line_of(c)};

			v = 0;
			get_uint(ld, m, lname, 0, 1000000, &v);
			check_tier_refs(ld, &one);
			e->cost_limits[e->ncosts] = xstrdup(lname);
			e->cost_values[e->ncosts++] = v;
		}
	}
	load_name_list(ld, g, "limits", e->name, &e->limits);
	load_name_list(ld, g, "global_limits", e->name, &e->global);
	load_post(ld, g, "post_charge", &e->post, NULL);
}

/* Whether tier <t> lists the limit called <name>. */
static bool tier_has(const struct cfg_tier *t, const char *name)
{
	size_t i;

	for (i = 0; i < t->nlimits; i++)
		if (t->limits[i] && strcmp(t->limits[i], name) == 0)
			return true;
	return false;
}

/*
 * A sliding log adds one entry per token, and one script call at most
 * LOG_ADD_MAX of them (a larger cost is never admitted): reports every
 * endpoint whose cost for a sliding_log limit that applies to it (through a
 * tier, the anonymous limits or its own lists) is larger.
 */
static void check_log_costs(struct loader *ld)
{
	const struct agent_config *cfg = ld->cfg;
	size_t e, j, t;

	for (j = 0; j < cfg->nlimits; j++) {
		const struct cfg_limit *l = &cfg->limits[j];
		bool everywhere = tier_has(&cfg->anon, l->name);

		if (l->alg != ALG_SLIDING_LOG)
			continue;
		for (t = 0; t < cfg->ntiers; t++)
			everywhere = everywhere || tier_has(&cfg->tiers[t], l->name);
		for (e = 0; e < cfg->nendpoints; e++) {
			const struct cfg_endpoint *ep = &cfg->endpoints[e];
			int64_t cost = ep->cost;
			size_t k;

			if (!everywhere && !tier_has(&ep->limits, l->name) &&
			    !tier_has(&ep->global, l->name))
				continue;
			for (k = 0; k < ep->ncosts; k++)
				if (strcmp(ep->cost_limits[k], l->name) == 0)
					cost = ep->cost_values[k];
			if (cost > LOG_ADD_MAX)
				add_err(ld, ep->line,
					"endpoint '%s': cost %lld for sliding_log limit '%s': at most "
					"%d tokens a request (one entry each)",
					ep->name, (long long)cost, l->name, LOG_ADD_MAX);
		}
	}
}

static void load_endpoints(struct loader *ld, const config_setting_t *s)
{
	struct agent_config *cfg = ld->cfg;
	int i, n;

	if (!s)
		return;
	if (!config_setting_is_list(s) && !(config_setting_is_group(s) && !config_setting_length(s))) {
		add_err(ld, line_of(s), "'endpoints' must be a list ( { ... }, { ... } )");
		return;
	}
	n = config_setting_length(s);
	cfg->endpoints = xcalloc((size_t)n, sizeof(*cfg->endpoints));
	for (i = 0; i < n; i++) {
		size_t j;

		load_endpoint(ld, config_setting_get_elem(s, (unsigned)i),
			      &cfg->endpoints[cfg->nendpoints]);
		for (j = 0; j < cfg->nendpoints; j++)
			if (strcmp(cfg->endpoints[j].name, cfg->endpoints[cfg->nendpoints].name) == 0)
				add_err(ld, cfg->endpoints[cfg->nendpoints].line,
					"endpoint '%s' defined twice", cfg->endpoints[j].name);
		cfg->nendpoints++;
	}
}

/* anonymous.without_address: what an anonymous request without a source address gets */
static void load_no_address(struct loader *ld, const config_setting_t *s)
{
	char *str = get_str(ld, s, "without_address", "deny");

	if (strcmp(str, "deny") == 0)
		ld->cfg->no_address = NO_ADDRESS_DENY;
	else if (strcmp(str, "shared") == 0)
		ld->cfg->no_address = NO_ADDRESS_SHARED;
	else
		add_err(ld, line_of(config_setting_get_member(s, "without_address")),
			"anonymous.without_address '%s': use \"deny\" or \"shared\"", str);
	free(str);
}

static void load_tier_lookup(struct loader *ld, const config_setting_t *root)
{
	static const char *const known[] = {"redis_hash", "cache_ttl", "cache_size", NULL};
	struct agent_config *cfg = ld->cfg;
	const config_setting_t *s = config_setting_get_member(root, "tier_lookup");
	const config_setting_t *m;
	char *str;

	/* random keys must not buy a fresh budget each: per address by default */
	str = get_str(ld, root, "unknown_keys", "anonymous");
	if (strcmp(str, "default_tier") == 0)
		cfg->unknown_keys = UNKNOWN_DEFAULT_TIER;
	else if (strcmp(str, "anonymous") == 0)
		cfg->unknown_keys = UNKNOWN_ANONYMOUS;
	else
		add_err(ld, line_of(config_setting_get_member(root, "unknown_keys")),
			"unknown_keys '%s': use \"default_tier\" or \"anonymous\"", str);
	free(str);
	cfg->tier_cache_ttl_ms = 30000;
	cfg->tier_cache_size = 65536;
	if (!s)
		return;
	if (!config_setting_is_group(s)) {
		add_err(ld, line_of(s), "'tier_lookup' must be a group { redis_hash = \"...\"; }");
		return;
	}
	check_known(ld, s, "tier_lookup", known);
	cfg->tier_hash = get_str(ld, s, "redis_hash", NULL);
	if (!cfg->tier_hash || !*cfg->tier_hash)
		add_err(ld, line_of(s), "tier_lookup: 'redis_hash' is required");
	if (cfg->store != STORE_KIND_REDIS)
		add_err(ld, line_of(s), "tier_lookup needs store = \"redis\"");
	m = config_setting_get_member(s, "cache_ttl");
	if (m) {
		uint64_t ms;

		if (config_setting_type(m) != CONFIG_TYPE_STRING ||
		    parse_duration_ms(config_setting_get_string(m), &ms) < 0 || ms > 86400000)
			add_err(ld, line_of(m), "tier_lookup: 'cache_ttl' must be a duration up to 1d");
		else
			cfg->tier_cache_ttl_ms = (unsigned)ms;
	}
	get_uint(ld, s, "cache_size", 1, 1 << 20, &cfg->tier_cache_size);
}

/*
 * Loads a policy from group <g> (the top level, or the candidate section when
 * <cand>): limits, tiers, default_tier, anonymous and endpoints, into ld->cfg.
 */
static void load_policy(struct loader *ld, const config_setting_t *g, bool cand)
{
	struct agent_config *cfg = ld->cfg;
	const config_setting_t *s;
	int i, n;

	s = config_setting_get_member(g, "limits");
	if (!s || !config_setting_is_group(s)) {
		add_err(ld, line_of(s ? s : g), "'limits' must be a group of named limits");
	} else {
		n = config_setting_length(s);
		cfg->limits = xcalloc((size_t)n, sizeof(*cfg->limits));
		for (i = 0; i < n; i++)
			load_limit(ld, config_setting_get_elem(s, (unsigned)i),
				   &cfg->limits[cfg->nlimits++]);
	}

	s = config_setting_get_member(g, "tiers");
	if (!s || !config_setting_is_group(s) || config_setting_length(s) < 1) {
		add_err(ld, line_of(s ? s : g), "'tiers' must be a group with at least one tier");
	} else {
		n = config_setting_length(s);
		cfg->tiers = xcalloc((size_t)n, sizeof(*cfg->tiers));
		for (i = 0; i < n; i++) {
			config_setting_t *t = config_setting_get_elem(s, (unsigned)i);

			load_tier(ld, t, &cfg->tiers[cfg->ntiers], config_setting_name(t));
			check_tier_refs(ld, &cfg->tiers[cfg->ntiers]);
			cfg->ntiers++;
		}
	}

	cfg->default_tier = get_str(ld, g, "default_tier", NULL);
	if (!cfg->default_tier && cfg->ntiers) {
		cfg->default_tier = xstrdup(cfg->tiers[0].name);
	} else if (cfg->default_tier) {
		size_t j;

		for (j = 0; j < cfg->ntiers; j++)
			if (strcmp(cfg->tiers[j].name, cfg->default_tier) == 0)
				break;
		if (j == cfg->ntiers)
			add_err(ld, line_of(config_setting_get_member(g, "default_tier")),
				"default_tier '%s' is not a tier", cfg->default_tier);
	}

	s = config_setting_get_member(g, "anonymous");
	cfg->ipv4_prefix = 32;
	cfg->ipv6_prefix = 64;
	if (!s) {
		add_err(ld, line_of(g), "'anonymous' is required: { limits = [ ... ]; }");
	} else {
		load_tier(ld, s, &cfg->anon, "anonymous");
		check_tier_refs(ld, &cfg->anon);
		if (config_setting_is_group(s) && cand) {
			static const char *const shared[] = {"ipv4_prefix", "ipv6_prefix",
							     "without_address"};
			size_t k;

			/* principals are the enforced policy's: one bucket key for both */
			for (k = 0; k < ARRAY_SIZE(shared); k++)
				if (config_setting_get_member(s, shared[k]))
					add_err(ld, line_of(config_setting_get_member(s, shared[k])),
						"candidate: anonymous.%s is the enforced policy's "
						"(set it outside the candidate section)",
						shared[k]);
		} else if (config_setting_is_group(s)) {
			get_uint(ld, s, "ipv4_prefix", 1, 32, &cfg->ipv4_prefix);
			get_uint(ld, s, "ipv6_prefix", 1, 128, &cfg->ipv6_prefix);
			load_no_address(ld, s);
		}
	}

	load_endpoints(ld, config_setting_get_member(g, "endpoints"));
	check_log_costs(ld);
	/* a principal's limits go to Redis in one script call: bound their number */
	{
		size_t e, t;

		for (e = 0; e < cfg->nendpoints; e++) {
			const struct cfg_endpoint *ep = &cfg->endpoints[e];

			for (t = 0; t <= cfg->ntiers; t++) {
				const struct cfg_tier *tier = t < cfg->ntiers ? &cfg->tiers[t] : &cfg->anon;

				if (tier->nlimits + ep->limits.nlimits > STORE_MAX_LIMITS)
					add_err(ld, ep->line,
						"endpoint '%s' with tier '%s': more than %d limits",
						ep->name, tier->name ? tier->name : "?",
						STORE_MAX_LIMITS);
			}
		}
	}
}

/* The most limits one request gets from <cfg> in each of its two Redis calls. */
static void policy_max_limits(const struct agent_config *cfg, size_t *principal, size_t *global)
{
	size_t t, e, tier = cfg->anon.nlimits, extra = 0;

	*global = 0;
	for (t = 0; t < cfg->ntiers; t++)
		if (cfg->tiers[t].nlimits > tier)
			tier = cfg->tiers[t].nlimits;
	for (e = 0; e < cfg->nendpoints; e++) {
		if (cfg->endpoints[e].limits.nlimits > extra)
			extra = cfg->endpoints[e].limits.nlimits;
		if (cfg->endpoints[e].global.nlimits > *global)
			*global = cfg->endpoints[e].global.nlimits;
	}
	*principal = tier + extra;
}

/*
 * The candidate section: a policy of its own, loaded into a second config.
 * Its limits go to Redis in the same calls as the enforced ones, so both
 * together must fit the limits of one call.
 */
static void load_candidate(struct loader *ld, const config_setting_t *root)
{
	static const char *const known[] = {"limits", "tiers", "default_tier", "anonymous",
					    "endpoints", NULL};
	const config_setting_t *s = config_setting_get_member(root, "candidate");
	struct loader cl = {.file = ld->file, .errs = ld->errs};
	struct agent_config *cfg = ld->cfg, *c;
	size_t ep, eg, cp, cg;

	if (!s)
		return;
	if (!config_setting_is_group(s)) {
		add_err(ld, line_of(s), "'candidate' must be a group { limits = ...; tiers = ...; }");
		return;
	}
	check_known(ld, s, "candidate", known);
	c = cl.cfg = xcalloc(1, sizeof(*c));
	c->file = xstrdup(cfg->file);
	cfg->candidate = c;
	load_policy(&cl, s, true);
	/* what the compiled limits need of the rest: this configuration's */
	c->gateways = cfg->gateways;
	c->ipv4_prefix = cfg->ipv4_prefix;
	c->ipv6_prefix = cfg->ipv6_prefix;
	c->no_address = cfg->no_address;
	c->unknown_keys = cfg->unknown_keys;
	c->redis.key_prefix = xstrdup(cfg->redis.key_prefix);
	policy_max_limits(cfg, &ep, &eg);
	policy_max_limits(c, &cp, &cg);
	if (ep + cp > STORE_MAX_LIMITS || eg + cg > STORE_MAX_LIMITS)
		add_err(ld, line_of(s),
			"candidate: a request may get %zu limits of a principal and %zu global "
			"ones from the enforced policy, %zu and %zu from the candidate: each "
			"call decides at most %d limits of both together",
			ep, eg, cp, cg, STORE_MAX_LIMITS);
}

static void load_listen(struct loader *ld, const config_setting_t *s)
{
	struct agent_config *cfg = ld->cfg;
	int i, n;

	if (!s) {
		cfg->listen = xcalloc(1, sizeof(char *));
		cfg->listen[cfg->nlisten++] = xstrdup("127.0.0.1:12345");
		return;
	}
	if (config_setting_type(s) == CONFIG_TYPE_STRING) {
		cfg->listen = xcalloc(1, sizeof(char *));
		cfg->listen[cfg->nlisten++] = xstrdup(config_setting_get_string(s));
		return;
	}
	if (!config_setting_is_array(s) && !config_setting_is_list(s)) {
		add_err(ld, line_of(s), "'listen' must be an address or a list of addresses");
		return;
	}
	n = config_setting_length(s);
	if (n < 1) {
		add_err(ld, line_of(s), "'listen' is empty");
		return;
	}
	cfg->listen = xcalloc((size_t)n, sizeof(char *));
	for (i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);

		if (config_setting_type(e) != CONFIG_TYPE_STRING)
			add_err(ld, line_of(s), "'listen' entries must be strings");
		else
			cfg->listen[cfg->nlisten++] = xstrdup(config_setting_get_string(e));
	}
}

/*
 * One integer, duration, boolean or string setting of a group: its name, its
 * bounds (integers, durations in ms) and its default, and where it goes.
 */
struct cfg_key {
	const char *name;
	enum { KT_UINT, KT_DURATION, KT_BOOL, KT_STR } kind;
	long long lo, hi;
	long long dflt;                 /* KT_UINT, KT_DURATION, KT_BOOL */
	unsigned *u;                    /* KT_UINT, KT_DURATION */
	bool *b;                        /* KT_BOOL */
	char **s;                       /* KT_STR: owned copy, default NULL */
};

#define KEY_UINT(n, lo, hi, d, p)     {(n), KT_UINT, (lo), (hi), (d), (p), NULL, NULL}
#define KEY_DURATION(n, lo, hi, d, p) {(n), KT_DURATION, (lo), (hi), (d), (p), NULL, NULL}
#define KEY_BOOL(n, d, p)             {(n), KT_BOOL, 0, 0, (d), NULL, (p), NULL}
#define KEY_STR(n, p)                 {(n), KT_STR, 0, 0, 0, NULL, NULL, (p)}

/* Sets the defaults of <keys>, in order, then reads those group <g> (NULL: none) has. */
static void load_keys(struct loader *ld, const config_setting_t *g, const struct cfg_key *keys,
		      size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		const struct cfg_key *k = &keys[i];

		switch (k->kind) {
		case KT_UINT:
			*k->u = (unsigned)k->dflt;
			get_uint(ld, g, k->name, k->lo, k->hi, k->u);
			break;
		case KT_DURATION:
			*k->u = (unsigned)k->dflt;
			get_duration(ld, g, k->name, (uint64_t)k->lo, (uint64_t)k->hi, k->u);
			break;
		case KT_BOOL:
			*k->b = k->dflt != 0;
			get_bool(ld, g, k->name, k->b);
			break;
		case KT_STR:
			*k->s = get_str(ld, g, k->name, NULL);
			break;
		}
	}
}

/*
 * Group <name> of <root>, made of <keys> alone: an error if it is not a group
 * ("'<name>' must be a group<example>"), its unknown settings reported, its
 * keys read (their defaults when it is absent or not a group). Returns the
 * group, or NULL.
 */
static const config_setting_t *load_group(struct loader *ld, const config_setting_t *root,
					  const char *name, const char *example,
					  const struct cfg_key *keys, size_t n)
{
	const config_setting_t *s = config_setting_get_member(root, name);
	const char *known[16];
	size_t i;

	if (s && !config_setting_is_group(s)) {
		add_err(ld, line_of(s), "'%s' must be a group%s", name, example);
		s = NULL;
	} else if (s) {
		for (i = 0; i < n && i < ARRAY_SIZE(known) - 1; i++)
			known[i] = keys[i].name;
		known[i] = NULL;
		check_known(ld, s, name, known);
	}
	load_keys(ld, s, keys, n);
	return s;
}

static void load_log_level(struct loader *ld, const config_setting_t *root)
{
	char *str = get_str(ld, root, "log_level", "notice");

	ld->cfg->log_level = log_level_parse(str);
	if (ld->cfg->log_level < 0) {
		add_err(ld, line_of(config_setting_get_member(root, "log_level")),
			"log_level '%s': use err, warn, notice, info or debug", str);
		ld->cfg->log_level = LOG_NOTICE;
	}
	free(str);
}

static void load_store_kind(struct loader *ld, const config_setting_t *root)
{
	struct agent_config *cfg = ld->cfg;
	char *str = get_str(ld, root, "store", "redis");

	if (strcmp(str, "redis") == 0)
		cfg->store = STORE_KIND_REDIS;
	else if (strcmp(str, "allow") == 0)
		cfg->store = STORE_KIND_ALLOW;
	else if (strcmp(str, "memory") == 0)
		cfg->store = STORE_KIND_MEMORY;
	else
		add_err(ld, line_of(config_setting_get_member(root, "store")),
			"store '%s': use \"redis\", \"memory\" or \"allow\"", str);
	free(str);
}

/* The request's message, and the post-charge's (post_charge), which must differ. */
static void load_messages(struct loader *ld, config_setting_t *root)
{
	struct agent_config *cfg = ld->cfg;

	cfg->message = get_str(ld, root, "message", "rl-req");
	cfg->post_message = xstrdup("rl-res");
	load_post(ld, root, "post_charge", &cfg->post, &cfg->post_message);
	if (strcmp(cfg->post_message, cfg->message) == 0)
		add_err(ld, line_of(config_setting_get_member(root, "post_charge")),
			"post_charge.message '%s' is the request's message", cfg->post_message);
}

/* The settings of the top level that are plain numbers, durations or booleans. */
static void load_root_keys(struct loader *ld, const config_setting_t *root)
{
	struct agent_config *c = ld->cfg;
	const struct cfg_key keys[] = {
		KEY_UINT("max_frame_size", 16380, 1 << 24, 65532, &c->max_frame_size),
		KEY_BOOL("blocked_cache", true, &c->blocked_cache),
		KEY_UINT("workers", 1, 64, 1, &c->workers),
		KEY_UINT("max_inflight", 1, 65536, 256, &c->max_inflight),
		/* SPOP connections: how many, how long idle, how old a NOTIFY may get */
		KEY_UINT("max_connections", 1, 1000000, 4096, &c->max_conns),
		KEY_DURATION("idle_timeout", 100, 86400000, 300000, &c->idle_timeout_ms),
		KEY_DURATION("spoe_timeout", 0, 600000, 0, &c->spoe_timeout_ms),
	};

	load_keys(ld, root, keys, ARRAY_SIZE(keys));
}

/* redis { ... }: where Redis is, how the agent logs in, its timeouts and bounds. */
static void load_redis(struct loader *ld, const config_setting_t *root)
{
	static const char *const known_redis[] = {"address", "user", "password", "key_prefix",
						  "connect_timeout_ms", "command_timeout_ms",
						  "max_pending", "breaker_failures",
						  "breaker_cooldown_ms", "queue_timeout_ms",
						  "max_concurrency", "batch_max", "password_file",
						  "nameservers", "resolve_timeout_ms", "sentinel",
						  NULL};
	struct agent_config *cfg = ld->cfg;
	const config_setting_t *s = config_setting_get_member(root, "redis");
	const struct cfg_key keys[] = {
		KEY_UINT("connect_timeout_ms", 1, 60000, 200, &cfg->redis.connect_timeout_ms),
		KEY_UINT("command_timeout_ms", 1, 60000, 5, &cfg->redis.command_timeout_ms),
		KEY_UINT("max_pending", 1, 1000000, 10000, &cfg->redis.max_pending),
		/* 0: the command timeout */
		KEY_UINT("queue_timeout_ms", 1, 60000, 0, &cfg->redis.queue_timeout_ms),
		KEY_UINT("max_concurrency", 2, 100000, 256, &cfg->redis.max_concurrency),
		/* 64: STORE_BATCH_MAX, the most the store sends in one call */
		KEY_UINT("batch_max", 1, 64, 32, &cfg->redis.batch_max),
		KEY_UINT("breaker_failures", 1, 1000000, 5, &cfg->breaker_failures),
		KEY_UINT("breaker_cooldown_ms", 1, 600000, 500, &cfg->breaker_cooldown_ms),
	};

	if (s && !config_setting_is_group(s))
		add_err(ld, line_of(s), "'redis' must be a group");
	else if (s)
		check_known(ld, s, "redis", known_redis);
	cfg->redis.address = get_str(ld, s, "address", "127.0.0.1:6379");
	if (!redis_address_ok(cfg->redis.address))
		add_err(ld, line_of(config_setting_get_member(s ? s : root, "address")),
			"redis address '%s': use host:port, ip:port, [ipv6]:port or unix:/path",
			cfg->redis.address);
	cfg->redis.user = get_str(ld, s, "user", NULL);
	cfg->redis.password = get_str(ld, s, "password", NULL);
	load_password_file(ld, s, "redis", &cfg->redis.password, &cfg->redis.password_file,
			   &cfg->redis.password_line);
	load_resolver(ld, s);
	load_sentinel(ld, s);
	cfg->redis.key_prefix = get_str(ld, s, "key_prefix", "rl");
	if (!name_ok(cfg->redis.key_prefix) || strlen(cfg->redis.key_prefix) > 32)
		add_err(ld, line_of(s), "redis key_prefix: use at most 32 of [A-Za-z0-9_.-]");
	load_keys(ld, s, keys, ARRAY_SIZE(keys));
}

/*
 * The groups made of plain settings: fallback, local_quota, metrics,
 * overrides, reload, response.
 */
static void load_groups(struct loader *ld, const config_setting_t *root)
{
	struct agent_config *c = ld->cfg;
	const struct cfg_key fallback[] = {
		KEY_UINT("gateways", 1, 100000, 1, &c->gateways),
		KEY_UINT("deny_status", 400, 599, 503, &c->deny_status),
	};
	const struct cfg_key quota[] = {
		KEY_UINT("lease_ms", 10, 3600000, 1000, &c->quota.lease_ms),
		KEY_UINT("heartbeat_ms", 100, 60000, 1000, &c->quota.heartbeat_ms),
		KEY_UINT("flush_ms", 1, 60000, 100, &c->quota.flush_ms),
		KEY_UINT("horizon", 0, 10, 2, &c->quota.horizon),
		KEY_UINT("max_keys", 16, 1000000, 8192, &c->quota.max_keys),
		KEY_BOOL("precheck", true, &c->quota.precheck),
		KEY_BOOL("leases", true, &c->quota.leases),
		KEY_BOOL("coalesce", true, &c->quota.coalesce),
	};
	const struct cfg_key metrics[] = {
		KEY_UINT("max_connections", 1, 4096, 64, &c->metrics_max_conns),
		KEY_DURATION("idle_timeout", 100, 600000, 5000, &c->metrics_idle_timeout_ms),
		KEY_STR("listen", &c->metrics_listen),
	};
	const struct cfg_key overrides[] = {
		KEY_BOOL("enabled", true, &c->overrides.enabled),
		KEY_DURATION("poll", 10, 10000, 250, &c->overrides.poll_ms),
		KEY_UINT("max_entries", 1, 1000000, 10000, &c->overrides.max_entries),
		KEY_UINT("block_status", 400, 599, 429, &c->overrides.block_status),
	};
	const struct cfg_key reload[] = {
		KEY_BOOL("watch", false, &c->watch),
	};
	const struct cfg_key response[] = {
		KEY_BOOL("legacy_headers", true, &c->legacy_headers),
	};
	const config_setting_t *s;

	load_group(ld, root, "fallback", " { gateways = N; }", fallback, ARRAY_SIZE(fallback));
	load_group(ld, root, "local_quota", " { lease_ms = 1000; }", quota, ARRAY_SIZE(quota));
	s = load_group(ld, root, "metrics", " { listen = \"127.0.0.1:9100\"; }", metrics,
		       ARRAY_SIZE(metrics));
	if (s && c->metrics_listen && strncmp(c->metrics_listen, "unix:", 5) == 0)
		add_err(ld, line_of(s), "metrics: 'listen' must be ip:port");
	load_group(ld, root, "overrides", "", overrides, ARRAY_SIZE(overrides));
	load_group(ld, root, "reload", " { watch = true; }", reload, ARRAY_SIZE(reload));
	load_group(ld, root, "response", "", response, ARRAY_SIZE(response));
}

/* The whole file, section by section, in the order its errors are reported. */
static void load_root(struct loader *ld, config_t *lc)
{
	static const char *const known_root[] = {
		"listen", "log_level", "store", "message", "max_frame_size", "max_inflight", "redis",
		"limits", "tiers", "default_tier", "anonymous", "response", "endpoints",
		"unknown_keys", "tier_lookup", "reload", "fallback", "workers", "metrics", "blocked_cache",
		"local_quota", "overrides", "max_connections", "idle_timeout", "spoe_timeout",
		"candidate", "post_charge", NULL};
	config_setting_t *root = config_root_setting(lc);

	check_known(ld, root, "the top level", known_root);
	load_listen(ld, config_setting_get_member(root, "listen"));
	load_log_level(ld, root);
	load_store_kind(ld, root);
	load_messages(ld, root);
	load_root_keys(ld, root);
	load_redis(ld, root);
	load_policy(ld, root, false);
	load_tier_lookup(ld, root);
	load_groups(ld, root);
	load_candidate(ld, root);
}

/*
 * Reads and validates <file>. Returns 0 with a new config in <*out>, or -1 with
 * every problem found appended to <errs> (as "file:line: message").
 */
int config_load(const char *file, struct agent_config **out, struct cfg_errors *errs)
{
	struct loader ld = {.file = file, .errs = errs};
	size_t before = errs->n;
	config_t lc;

	ld.cfg = xcalloc(1, sizeof(*ld.cfg));
	ld.cfg->file = xstrdup(file);
	config_init(&lc);
	if (config_read_file(&lc, file) != CONFIG_TRUE) {
		if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
			add_err(&ld, 0, "cannot read: %s", strerror(errno));
		else
			add_err(&ld, config_error_line(&lc), "%s", config_error_text(&lc));
	} else {
		load_root(&ld, &lc);
	}
	config_destroy(&lc);
	if (errs->n != before) {
		config_free(ld.cfg);
		return -1;
	}
	*out = ld.cfg;
	return 0;
}

static void tier_release(struct cfg_tier *t)
{
	size_t i;

	for (i = 0; i < t->nlimits; i++)
		free(t->limits[i]);
	free(t->limits);
	free(t->name);
}

void config_free(struct agent_config *cfg)
{
	size_t i;

	if (!cfg)
		return;
	for (i = 0; i < cfg->nlisten; i++)
		free(cfg->listen[i]);
	free(cfg->listen);
	for (i = 0; i < cfg->nlimits; i++)
		free(cfg->limits[i].name);
	free(cfg->limits);
	for (i = 0; i < cfg->ntiers; i++)
		tier_release(&cfg->tiers[i]);
	free(cfg->tiers);
	tier_release(&cfg->anon);
	for (i = 0; i < cfg->nendpoints; i++) {
		struct cfg_endpoint *e = &cfg->endpoints[i];
		size_t j;

		free(e->name);
		free(e->route);
		free(e->path_prefix);
		for (j = 0; j < e->nmethods; j++)
			free(e->methods[j]);
		free(e->methods);
		for (j = 0; j < e->ncosts; j++)
			free(e->cost_limits[j]);
		free(e->cost_limits);
		free(e->cost_values);
		tier_release(&e->limits);
		tier_release(&e->global);
	}
	free(cfg->endpoints);
	free(cfg->tier_hash);
	free(cfg->metrics_listen);
	free(cfg->default_tier);
	free(cfg->message);
	free(cfg->post_message);
	free(cfg->redis.address);
	free(cfg->redis.user);
	free(cfg->redis.password);
	free(cfg->redis.nameservers);
	for (size_t k = 0; k < cfg->redis.nsentinels; k++)
		free(cfg->redis.sentinels[k]);
	free(cfg->redis.sentinels);
	free(cfg->redis.sentinel_master);
	free(cfg->redis.sentinel_user);
	free(cfg->redis.sentinel_password);
	free(cfg->redis.sentinel_password_file);
	free(cfg->redis.password_file);
	free(cfg->redis.key_prefix);
	free(cfg->file);
	config_free(cfg->candidate);
	free(cfg);
}

/*
 * What `-c` and the agent's start say of a Redis password written in the
 * configuration file <cfg> itself: formatted into <buf>; false when there is
 * none (no password, or one read from redis.password_file).
 */
bool config_password_advice(const struct agent_config *cfg, char *buf, size_t len)
{
	if (!cfg->redis.password_line)
		return false;
	snprintf(buf, len,
		 "%s:%d: warning: the Redis password is written in the configuration file: put it "
		 "in a file of its own, mode 0600 or 0640, named by redis.password_file (with "
		 "systemd, a LoadCredential= credential)",
		 cfg->file, cfg->redis.password_line);
	return true;
}

void cfg_errors_release(struct cfg_errors *errs)
{
	size_t i;

	for (i = 0; i < errs->n; i++)
		free(errs->msgs[i]);
	free(errs->msgs);
	errs->msgs = NULL;
	errs->n = 0;
}
