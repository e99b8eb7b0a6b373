/* SPDX-License-Identifier: MIT */
/*
 * The policy's sections of the configuration: limits, tiers, the anonymous
 * tier, endpoints and their costs, post_charge, the tier lookup, and the
 * candidate, a second policy of the same sections. config.c reads the rest
 * of the file and calls these in the order their errors are reported.
 */
#include "config_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "limiter.h"
#include "normalize.h"
#include "store.h"
#include "util.h"

/* on_failure: what the limit does while Redis cannot decide */
static void load_on_failure(struct loader *ld, const config_setting_t *s, struct cfg_limit *l)
{
	/* the default never leaves a limit unenforced while Redis is away */
	char *alg = get_str(ld, s, "on_failure", "local");

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
}

/*
 * A concurrency limit, `concurrency = N` (slots: requests in flight) with
 * `max_duration` (each slot's lease, "60s" by default): kept as rate = N and
 * period = the lease. The rate settings mean nothing to it and are refused.
 */
static void load_concurrency(struct loader *ld, const config_setting_t *s, struct cfg_limit *l)
{
	static const char *const rate_only[] = {"algorithm", "rate", "period", "burst",
						"accuracy_budget", NULL};
	const config_setting_t *m;
	unsigned v = 0;
	size_t i;

	l->alg = ALG_CONCURRENCY;
	for (i = 0; rate_only[i]; i++)
		if ((m = config_setting_get_member(s, rate_only[i])))
			add_err(ld, line_of(m),
				"limit '%s': '%s' is for rate limits; a concurrency limit takes "
				"'concurrency' (requests in flight) and 'max_duration' (a slot's "
				"lease) only: make it a limit of its own and list both in the tier",
				l->name, rate_only[i]);
	get_uint(ld, s, "concurrency", 1, 1000000, &v);
	l->rate = v;
	v = 60000;
	get_duration(ld, s, "max_duration", CONC_LEASE_MIN_MS, CONC_LEASE_MAX_MS, &v);
	l->period_ms = v;
	l->burst = l->rate;
	get_bool(ld, s, "shadow", &l->shadow);
	v = 0;
	get_uint(ld, s, "local_rate", 1, 1000000, &v);
	l->local_rate = v;
}

static void load_limit(struct loader *ld, const config_setting_t *s, struct cfg_limit *l)
{
	static const char *const known[] = {"algorithm", "rate", "period", "burst", "shadow",
					    "on_failure", "local_rate", "accuracy_budget",
					    "concurrency", "max_duration", NULL};
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
	if (config_setting_get_member(s, "concurrency")) {
		load_concurrency(ld, s, l);
		load_on_failure(ld, s, l);
		return;
	}
	if ((m = config_setting_get_member(s, "max_duration")))
		add_err(ld, line_of(m),
			"limit '%s': 'max_duration' is a concurrency limit's (with 'concurrency = N')",
			l->name);
	alg = get_str(ld, s, "algorithm", "gcra");
	l->alg = limit_alg_parse(alg);
	if (l->alg < 0)
		add_err(ld, l->line,
			"limit '%s': unknown algorithm '%s' (known: gcra, token_bucket, "
			"fixed_window, sliding_log, sliding_window)",
			l->name, alg);
	free(alg);
	get_bool(ld, s, "shadow", &l->shadow);
	load_on_failure(ld, s, l);
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
	} else if (config_setting_type(m) == CONFIG_TYPE_STRING &&
		   strcmp(config_setting_get_string(m), LIMIT_MONTH) == 0) {
		/* a calendar month: from 00:00 UTC on the 1st, by Redis time */
		if (l->alg == ALG_FIXED_WINDOW)
			l->alg = ALG_FIXED_MONTH;
		else if (l->alg >= 0)
			add_err(ld, line_of(m),
				"limit '%s': period \"1mo\" (a calendar month) is for fixed_window "
				"only: a bucket or a sliding window has no month to reset with; use "
				"algorithm = \"fixed_window\", or a period in days (\"30d\")",
				l->name);
		l->period_ms = LIMIT_MONTH_MS;
	} else if (config_setting_type(m) != CONFIG_TYPE_STRING ||
		   parse_duration_ms(config_setting_get_string(m), &l->period_ms) < 0 ||
		   l->period_ms < 1 || l->period_ms > 366ULL * 86400000) {
		add_err(ld, line_of(m),
			"limit '%s': 'period' must be a duration like \"250ms\", \"1s\", \"1m\", "
			"\"1h\", \"1d\" (at most 366d), or \"1mo\" (a calendar month)",
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
void load_post(struct loader *ld, const config_setting_t *g, const char *name,
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

void load_tier_lookup(struct loader *ld, const config_setting_t *root)
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
void load_policy(struct loader *ld, const config_setting_t *g, bool cand)
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
 * candidate.mode ("exact", the default, or "sampled") and candidate.sample,
 * the share of clients a sampled candidate evaluates (0 < sample <= 1, 0.1 by
 * default), into <c>, the candidate's configuration.
 */
static void load_cand_mode(struct loader *ld, const config_setting_t *s, struct agent_config *c)
{
	const config_setting_t *m = config_setting_get_member(s, "sample");
	char *mode = get_str(ld, s, "mode", "exact");
	double f = -1;

	c->cand_mode.share = 1;
	if (strcmp(mode, "sampled") == 0)
		c->cand_mode.sampled = true;
	else if (strcmp(mode, "exact") != 0)
		add_err(ld, line_of(config_setting_get_member(s, "mode")),
			"candidate: mode '%s': use \"exact\" or \"sampled\"", mode);
	free(mode);
	if (m && !c->cand_mode.sampled) {
		add_err(ld, line_of(m), "candidate: 'sample' is for mode = \"sampled\"");
		return;
	}
	if (!c->cand_mode.sampled)
		return;
	if (!m) {
		c->cand_mode.share = 0.1;
		return;
	}
	if (config_setting_type(m) == CONFIG_TYPE_FLOAT)
		f = config_setting_get_float(m);
	else if (config_setting_type(m) == CONFIG_TYPE_INT && config_setting_get_int(m) == 1)
		f = 1;
	if (!(f > 0 && f <= 1))
		add_err(ld, line_of(m),
			"candidate: 'sample' must be a fraction above 0, at most 1 (0.1 = 10%% of "
			"the clients)");
	else
		c->cand_mode.share = f;
}

/*
 * The candidate section: a policy of its own, loaded into a second config.
 * Its limits go to Redis in the same calls as the enforced ones, so both
 * together must fit the limits of one call.
 */
void load_candidate(struct loader *ld, const config_setting_t *root)
{
	static const char *const known[] = {"limits", "tiers", "default_tier", "anonymous",
					    "endpoints", "mode", "sample", NULL};
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
	load_cand_mode(ld, s, c);
	load_policy(&cl, s, true);
	/* what the compiled limits need of the rest: this configuration's */
	c->gateways = cfg->gateways;
	c->ipv4_prefix = cfg->ipv4_prefix;
	c->ipv6_prefix = cfg->ipv6_prefix;
	c->no_address = cfg->no_address;
	c->unknown_keys = cfg->unknown_keys;
	c->redis.key_prefix = xstrdup(cfg->redis.key_prefix);
	c->redis.key_layout = cfg->redis.key_layout;
	c->redis.key_layout_fallback = cfg->redis.key_layout_fallback;
	policy_max_limits(cfg, &ep, &eg);
	policy_max_limits(c, &cp, &cg);
	if (ep + cp > STORE_MAX_LIMITS || eg + cg > STORE_MAX_LIMITS)
		add_err(ld, line_of(s),
			"candidate: a request may get %zu limits of a principal and %zu global "
			"ones from the enforced policy, %zu and %zu from the candidate: each "
			"call decides at most %d limits of both together",
			ep, eg, cp, cg, STORE_MAX_LIMITS);
}
