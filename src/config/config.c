/* SPDX-License-Identifier: MIT */
/*
 * libconfig front end. Every key is looked up through a small table of known
 * names per section so a typo is an error, not a silently ignored setting.
 *
 * This file reads the file's top level, redis and the groups of plain
 * settings, and frees a configuration; the policy's sections (limits, tiers,
 * endpoints, the tier lookup, the candidate) are config_policy.c's, the typed
 * readers config_read.c's (config_int.h).
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <libconfig.h>

#include "config_int.h"
#include "log.h"
#include "secret.h"
#include "store.h"
#include "store_reply.h"
#include "tls.h"
#include "util.h"

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
 * A `tls { ca_file; ca_dir; cert_file; key_file; server_name; verify;
 * min_version; }` group in <g> (<where> names it): built into an OpenSSL
 * context now, so a certificate or key that cannot be read or does not match
 * fails the load (a reload keeps the last good configuration). File names are
 * resolved like secret files (secret.c): absolute, a systemd credential, or
 * next to the configuration file. NULL when <g> has no such group.
 */
static struct tls_ctx *load_tls(struct loader *ld, const config_setting_t *g, const char *where)
{
	static const char *const known[] = {"ca_file", "ca_dir", "cert_file", "key_file",
					    "server_name", "verify", "min_version", NULL};
	const config_setting_t *t = g ? config_setting_get_member(g, "tls") : NULL;
	static const char *const files[] = {"ca_file", "ca_dir", "cert_file", "key_file"};
	char *val[4] = {NULL}, *name, *minv, *pem = NULL, err[512];
	struct tls_opts o = {.verify = true};
	struct tls_ctx *ctx = NULL;
	size_t i;

	if (!t)
		return NULL;
	if (!config_setting_is_group(t)) {
		add_err(ld, line_of(t), "%s.tls: a group { ca_file = \"...\"; ... }", where);
		return NULL;
	}
	check_known(ld, t, where, known);
	for (i = 0; i < ARRAY_SIZE(files); i++) {
		char *v = get_str(ld, t, files[i], NULL);

		if (v && !*v)
			add_err(ld, line_of(t), "%s.tls.%s is empty: name the file", where, files[i]);
		else if (v)
			val[i] = secret_path(v, ld->cfg->file);
		free(v);
	}
	name = get_str(ld, t, "server_name", NULL);
	minv = get_str(ld, t, "min_version", NULL);
	get_bool(ld, t, "verify", &o.verify);
	if (!o.verify && !ld->cfg->redis.noverify_line) {
		ld->cfg->redis.noverify_line = line_of(config_setting_get_member(t, "verify"));
		ld->cfg->redis.noverify_where = where;
	}
	if (name && !(host_name_ok(name) || host_is_numeric(name)))
		add_err(ld, line_of(t), "%s.tls.server_name '%s': a host name or an address",
			where, name);
	o.ca_file = val[0];
	o.ca_dir = val[1];
	o.cert_file = val[2];
	o.key_file = val[3];
	o.server_name = name;
	o.min_version = minv;
	if (o.key_file && secret_read_file(o.key_file, TLS_KEY_MAX, &pem, &o.key_len, err,
					   sizeof(err)) == -1)
		add_err(ld, line_of(t), "%s.tls.key_file '%s': %s", where, o.key_file, err);
	o.key_pem = pem;
	if (!ld->errs->n) {
		ctx = tls_ctx_new(&o, err, sizeof(err));
		if (!ctx)
			add_err(ld, line_of(t), "%s.tls: %s", where, err);
	}
	if (pem) {
		explicit_bzero(pem, o.key_len);
		free(pem);
	}
	for (i = 0; i < ARRAY_SIZE(val); i++)
		free(val[i]);
	free(name);
	free(minv);
	return ctx;
}

/*
 * redis.sentinel { addresses = ["ip:port", ...]; master = "name"; user = ...;
 * password = ...; }: the master is found by asking these Sentinels (src/store/sentinel.c)
 * instead of redis.address, which must then not be set.
 */
static void load_sentinel(struct loader *ld, const config_setting_t *s)
{
	static const char *const known[] = {"addresses", "master", "user", "password",
					    "password_file", "tls", NULL};
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
	/* the Sentinels speak TLS as the Redis they watch, unless told otherwise */
	if (config_setting_get_member(g, "tls") &&
	    config_setting_type(config_setting_get_member(g, "tls")) == CONFIG_TYPE_BOOL) {
		bool on = true;

		get_bool(ld, g, "tls", &on);
		cfg->redis.sentinel_tls = on ? tls_ctx_ref(cfg->redis.tls) : NULL;
	} else if (config_setting_get_member(g, "tls")) {
		cfg->redis.sentinel_tls = load_tls(ld, g, "redis.sentinel");
	} else {
		cfg->redis.sentinel_tls = tls_ctx_ref(cfg->redis.tls);
	}
	list = config_setting_get_member(g, "addresses");
	n = list && (config_setting_is_array(list) || config_setting_is_list(list))
		    ? config_setting_length(list) : 0;
	if (n < 1 || n > 16) {
		add_err(ld, line_of(list ? list : g),
			"redis.sentinel.addresses: a list of 1 to 16 \"host:port\"");
		return;
	}
	cfg->redis.sentinels = xcalloc((size_t)n, sizeof(char *));
	for (i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(list, (unsigned)i);
		const char *v = config_setting_type(e) == CONFIG_TYPE_STRING
					? config_setting_get_string(e) : "";
		char host[256];
		int port;

		if (hostport_split(v, host, sizeof(host), &port) < 0 ||
		    !(host_is_numeric(host) || (v[0] != '[' && host_name_ok(host)))) {
			add_err(ld, line_of(list), "redis.sentinel.addresses: '%s' is no host:port, "
				"ip:port or [ipv6]:port", v);
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
	enum { KT_UINT, KT_UINT_AUTO, KT_DURATION, KT_BOOL, KT_STR, KT_OTHER } kind;
	long long lo, hi;
	long long dflt;                 /* KT_UINT, KT_DURATION, KT_BOOL */
	unsigned *u;                    /* KT_UINT, KT_DURATION */
	bool *b;                        /* KT_BOOL */
	char **s;                       /* KT_STR: owned copy, default NULL */
};

#define KEY_UINT(n, lo, hi, d, p)     {(n), KT_UINT, (lo), (hi), (d), (p), NULL, NULL}
/* an integer, or "auto": 0 */
#define KEY_UINT_AUTO(n, lo, hi, p)   {(n), KT_UINT_AUTO, (lo), (hi), 0, (p), NULL, NULL}
#define KEY_DURATION(n, lo, hi, d, p) {(n), KT_DURATION, (lo), (hi), (d), (p), NULL, NULL}
#define KEY_BOOL(n, d, p)             {(n), KT_BOOL, 0, 0, (d), NULL, (p), NULL}
#define KEY_STR(n, p)                 {(n), KT_STR, 0, 0, 0, NULL, NULL, (p)}
/* a setting of the group read by a function of its own */
#define KEY_OTHER(n)                  {(n), KT_OTHER, 0, 0, 0, NULL, NULL, NULL}

/* Sets the defaults of <keys>, in order, then reads those group <g> (NULL: none) has. */
/* Key <k> of the group being read, at its default (absent): written to ld->defaults. */
static void note_default(struct loader *ld, const struct cfg_key *k)
{
	const char *g = ld->group ? ld->group : "";

	switch (k->kind) {
	case KT_UINT:
		fprintf(ld->defaults, "%s%s%s = %lld\n", g, *g ? "." : "", k->name, k->dflt);
		break;
	case KT_UINT_AUTO:
		fprintf(ld->defaults, "%s%s%s = \"auto\"\n", g, *g ? "." : "", k->name);
		break;
	case KT_DURATION:
		fprintf(ld->defaults, "%s%s%s = %lldms\n", g, *g ? "." : "", k->name, k->dflt);
		break;
	case KT_BOOL:
		fprintf(ld->defaults, "%s%s%s = %s\n", g, *g ? "." : "", k->name,
			k->dflt ? "true" : "false");
		break;
	default: /* no default (a string), or read by a function of its own */
		break;
	}
}

static void load_keys(struct loader *ld, const config_setting_t *g, const struct cfg_key *keys,
		      size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		const struct cfg_key *k = &keys[i];

		if (ld->defaults && !(g && config_setting_get_member(g, k->name)))
			note_default(ld, k);
		switch (k->kind) {
		case KT_UINT:
			*k->u = (unsigned)k->dflt;
			get_uint(ld, g, k->name, k->lo, k->hi, k->u);
			break;
		case KT_UINT_AUTO: {
			const config_setting_t *v = g ? config_setting_get_member(g, k->name) : NULL;

			*k->u = 0;
			if (v && config_setting_type(v) == CONFIG_TYPE_STRING) {
				if (strcmp(config_setting_get_string(v), "auto") != 0)
					add_err(ld, line_of(v),
						"'%s' must be \"auto\" or an integer from %lld to %lld",
						k->name, k->lo, k->hi);
			} else {
				get_uint(ld, g, k->name, k->lo, k->hi, k->u);
			}
			break;
		}
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
		case KT_OTHER:
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
	ld->group = name;
	load_keys(ld, s, keys, n);
	ld->group = NULL;
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

/*
 * redis.batch_wait_us counts in the deadline of every decision that waits: at
 * most half of what a decision is given for its reply (spoe_timeout's share
 * when set, else the command timeout), or the decisions of a partial batch
 * would be answered degraded for the wait alone.
 */
static void check_batch_wait(struct loader *ld, const config_setting_t *s)
{
	const struct agent_config *cfg = ld->cfg;
	unsigned budget_ms = config_answer_budget_ms(cfg);

	if (!budget_ms)
		budget_ms = config_command_timeout_ms(cfg);
	if (s && cfg->redis.batch_wait_us > budget_ms * 500u)
		add_err(ld, line_of(config_setting_get_member(s, "batch_wait_us")),
			"redis.batch_wait_us = %u: at most %u, half of the %u ms a decision is "
			"given for its reply (%s): lower it, or raise that",
			cfg->redis.batch_wait_us, budget_ms * 500u, budget_ms,
			config_answer_budget_ms(cfg) ? "spoe_timeout's share"
						     : "redis.command_timeout_ms");
}

/* redis { ... }: where Redis is, how the agent logs in, its timeouts and bounds. */
static void load_redis(struct loader *ld, const config_setting_t *root)
{
	static const char *const known_redis[] = {"address", "user", "password", "key_prefix",
						  "connect_timeout_ms", "command_timeout_ms",
						  "max_pending", "breaker_failures",
						  "breaker_cooldown_ms", "queue_timeout_ms",
						  "max_concurrency", "batch_max", "batch_wait_us",
						  "password_file",
						  "nameservers", "resolve_timeout_ms", "sentinel",
						  "tls", "max_reply_bytes", "max_reply_elements",
						  "max_reply_depth", "key_layout",
						  "key_layout_fallback", NULL};
	struct agent_config *cfg = ld->cfg;
	const config_setting_t *s = config_setting_get_member(root, "redis");
	const struct cfg_key keys[] = {
		KEY_UINT("connect_timeout_ms", 1, 60000, 200, &cfg->redis.connect_timeout_ms),
		/* 0: derived, config_command_timeout_ms() */
		KEY_UINT("command_timeout_ms", 1, 60000, 0, &cfg->redis.command_timeout_ms),
		KEY_UINT("max_pending", 1, 1000000, 10000, &cfg->redis.max_pending),
		/* 0: the command timeout */
		KEY_UINT("queue_timeout_ms", 1, 60000, 0, &cfg->redis.queue_timeout_ms),
		KEY_UINT("max_concurrency", 2, 100000, 256, &cfg->redis.max_concurrency),
		/* 64: STORE_BATCH_MAX, the most the store sends in one call */
		KEY_UINT("batch_max", 1, 64, 32, &cfg->redis.batch_max),
		/* 0: a batch leaves at the end of the turn that made it */
		KEY_UINT("batch_wait_us", 0, 5000, 0, &cfg->redis.batch_wait_us),
		/* what one reply may be (store_reply.h): far above the largest asked for */
		KEY_UINT("max_reply_bytes", 1 << 16, 1 << 30, REPLY_MAX_BYTES_DEFAULT,
			 &cfg->redis.max_reply_bytes),
		KEY_UINT("max_reply_elements", 1024, 1 << 24, REPLY_MAX_ELEMENTS_DEFAULT,
			 &cfg->redis.max_reply_elements),
		KEY_UINT("max_reply_depth", 4, 64, REPLY_MAX_DEPTH_DEFAULT,
			 &cfg->redis.max_reply_depth),
		KEY_UINT("breaker_failures", 1, 1000000, 5, &cfg->breaker_failures),
		KEY_UINT("breaker_cooldown_ms", 1, 600000, 500, &cfg->breaker_cooldown_ms),
		/* where the limits' states live (lua/state.lua) */
		KEY_UINT("key_layout", 1, 2, 1, &cfg->redis.key_layout),
		KEY_BOOL("key_layout_fallback", true, &cfg->redis.key_layout_fallback),
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
	cfg->redis.tls = load_tls(ld, s, "redis");
	if (cfg->redis.tls && strncmp(cfg->redis.address, "unix:", 5) == 0 &&
	    !config_setting_get_member(s, "sentinel"))
		add_err(ld, line_of(config_setting_get_member(s, "tls")),
			"redis.tls: TLS goes over TCP: redis.address is a unix socket");
	load_sentinel(ld, s);
	cfg->redis.key_prefix = get_str(ld, s, "key_prefix", "rl");
	if (!name_ok(cfg->redis.key_prefix) || strlen(cfg->redis.key_prefix) > 32)
		add_err(ld, line_of(s), "redis key_prefix: use at most 32 of [A-Za-z0-9_.-]");
	ld->group = "redis";
	load_keys(ld, s, keys, ARRAY_SIZE(keys));
	ld->group = NULL;
	check_batch_wait(ld, s);
}

/*
 * metrics.<name>: a string or a list of strings into <*out> (<*n> of them),
 * each checked by <ok> (NULL: any non-empty string; else an error message).
 */
static void get_str_list(struct loader *ld, const config_setting_t *g, const char *name,
			 const char *(*ok)(const char *v, char *err, size_t errlen), char ***out,
			 size_t *n)
{
	const config_setting_t *v = g ? config_setting_get_member(g, name) : NULL;
	int i, len;

	*out = NULL;
	*n = 0;
	if (!v)
		return;
	if (config_setting_type(v) == CONFIG_TYPE_STRING)
		len = 1;
	else if (config_setting_is_array(v) || config_setting_is_list(v))
		len = config_setting_length(v);
	else
		len = -1;
	*out = len > 0 ? xcalloc((size_t)len, sizeof(**out)) : NULL;
	for (i = 0; i < len; i++) {
		const config_setting_t *e = config_setting_type(v) == CONFIG_TYPE_STRING
					    ? v : config_setting_get_elem(v, (unsigned)i);
		const char *s = config_setting_type(e) == CONFIG_TYPE_STRING
				? config_setting_get_string(e) : NULL;
		char err[160];
		const char *why = !s || !*s ? "each entry a non-empty string"
				  : ok ? ok(s, err, sizeof(err)) : NULL;

		if (why) {
			add_err(ld, line_of(v), "metrics.%s: %s", name, why);
			continue;
		}
		(*out)[(*n)++] = xstrdup(s);
	}
	if (len < 0)
		add_err(ld, line_of(v), "metrics.%s: a string or a list of strings", name);
}

static const char *network_ok(const char *v, char *err, size_t errlen)
{
	struct ip_net net;

	return ip_net_parse(v, &net, err, errlen) < 0 ? err : NULL;
}

static const char *host_name_entry_ok(const char *v, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	return strcmp(v, "*") == 0 || host_name_ok(v) ? NULL
	       : "each entry a host name (letters, digits, '-' and '.'), or \"*\" for any";
}

/* Whether the metrics listener's address is a loopback one. */
static bool metrics_listen_loopback(const char *listen)
{
	char host[256];
	struct ip_net net;
	int port;

	return listen && hostport_split(listen, host, sizeof(host), &port) == 0 &&
	       ip_net_parse(host, &net, NULL, 0) == 0 && ip_net_is_loopback(&net);
}

/*
 * Who may ask the metrics listener: metrics.allow (default: loopback when the
 * listener is on loopback, else whoever reaches it: `-c` warns then, without a
 * token), metrics.host_names, metrics.token_file (read like password_file).
 */
/* The names of response.headers, by enum header_dialect. */
static const char *const header_dialects[HDR_COUNT] = {"structured+legacy", "structured",
							 "draft7", "legacy"};

/*
 * response.headers (group <s>, or NULL), or from response.legacy_headers
 * where it is not set (false: the structured fields alone). Both set is an
 * error: they could disagree.
 */
static void load_header_dialect(struct loader *ld, const config_setting_t *s)
{
	struct agent_config *c = ld->cfg;
	const config_setting_t *m = s ? config_setting_get_member(s, "headers") : NULL;
	const char *v;
	int i;

	c->headers = c->legacy_headers ? HDR_STRUCTURED_LEGACY : HDR_STRUCTURED;
	if (!m)
		return;
	if (config_setting_get_member(s, "legacy_headers")) {
		add_err(ld, line_of(m), "response: 'headers' replaces 'legacy_headers': set one "
			"(legacy_headers = false is headers = \"structured\")");
		return;
	}
	v = config_setting_type(m) == CONFIG_TYPE_STRING ? config_setting_get_string(m) : "";
	for (i = 0; i < HDR_COUNT; i++) {
		if (strcmp(v, header_dialects[i]) == 0) {
			c->headers = (enum header_dialect)i;
			c->legacy_headers = i == HDR_STRUCTURED_LEGACY || i == HDR_LEGACY;
			return;
		}
	}
	add_err(ld, line_of(m), "response.headers: use \"structured+legacy\" (the default), "
		"\"structured\", \"draft7\" or \"legacy\" (see doc/haproxy.md, \"Headers\")");
}

static void load_metrics_access(struct loader *ld, const config_setting_t *s)
{
	struct agent_config *c = ld->cfg;
	const config_setting_t *tf = s ? config_setting_get_member(s, "token_file") : NULL;
	char err[256], *name;

	get_str_list(ld, s, "allow", network_ok, &c->metrics_allow, &c->metrics_nallow);
	c->metrics_allow_set = s && config_setting_get_member(s, "allow");
	if (c->metrics_allow_set && !c->metrics_nallow && !ld->errs->n)
		add_err(ld, line_of(config_setting_get_member(s, "allow")),
			"metrics.allow is empty: nobody could ask; name networks, or leave it out");
	if (!c->metrics_allow_set && metrics_listen_loopback(c->metrics_listen)) {
		c->metrics_allow = xcalloc(2, sizeof(*c->metrics_allow));
		c->metrics_allow[0] = xstrdup("127.0.0.0/8");
		c->metrics_allow[1] = xstrdup("::1");
		c->metrics_nallow = 2;
	}
	get_str_list(ld, s, "host_names", host_name_entry_ok, &c->metrics_hosts,
		     &c->metrics_nhosts);
	if (!tf)
		return;
	name = get_str(ld, s, "token_file", NULL);
	if (!name)
		return;
	if (!*name) {
		add_err(ld, line_of(tf), "metrics.token_file is empty: name the file");
	} else {
		c->metrics_token_file = secret_path(name, ld->file);
		if (secret_read(c->metrics_token_file, &c->metrics_token, err, sizeof(err)) < 0)
			add_err(ld, line_of(tf), "metrics.token_file '%s': %s",
				c->metrics_token_file, err);
		else if (strlen(c->metrics_token) < 16)
			add_err(ld, line_of(tf), "metrics.token_file '%s': the token is shorter "
				"than 16 characters: make a longer one (openssl rand -hex 32)",
				c->metrics_token_file);
	}
	free(name);
}

/*
 * The secret the fingerprints shown to people are keyed with (see digest.h):
 * metrics.fingerprint_secret_file, read like password_file, at least
 * FP_SECRET_MIN bytes. Without it, a random secret drawn once per process
 * tree (the master's, inherited by its workers, kept across reloads): the
 * fingerprints are then this agent's own, and `-c` says so. Never unkeyed.
 */
#define FP_SECRET_MIN 16

/*
 * Fills <buf> with <len> bytes from the kernel's random source (getrandom(),
 * else /dev/urandom). A secret is never made of clocks: without either,
 * the process stops.
 */
static void random_bytes(uint8_t *buf, size_t len)
{
	size_t got = 0;
	int fd;

	while (got < len) {
		ssize_t n = getrandom(buf + got, len - got, 0);

		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1)
			break;
		got += (size_t)n;
	}
	if (got == len)
		return;
	fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	while (fd != -1 && got < len) {
		ssize_t n = read(fd, buf + got, len - got);

		if (n == -1 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (fd != -1)
		close(fd);
	if (got != len) {
		fprintf(stderr, "no random source (getrandom, /dev/urandom) for the fingerprint "
				"secret: set metrics.fingerprint_secret_file\n");
		abort();
	}
}
static void load_fingerprint_secret(struct loader *ld, const config_setting_t *s)
{
	static uint8_t random_secret[32];
	static bool drawn;
	struct agent_config *c = ld->cfg;
	const config_setting_t *f = s ? config_setting_get_member(s, "fingerprint_secret_file")
				      : NULL;
	char err[256], *name, *secret = NULL;

	name = f ? get_str(ld, s, "fingerprint_secret_file", NULL) : NULL;
	if (!name) {
		if (!drawn) {
			random_bytes(random_secret, sizeof(random_secret));
			drawn = true;
		}
		fp_key_init(&c->fp, random_secret, sizeof(random_secret));
		c->fp_random = true;
		return;
	}
	if (!*name) {
		add_err(ld, line_of(f), "metrics.fingerprint_secret_file is empty: name the file");
		free(name);
		return;
	}
	c->fp_secret_file = secret_path(name, ld->file);
	free(name);
	if (secret_read(c->fp_secret_file, &secret, err, sizeof(err)) < 0) {
		add_err(ld, line_of(f), "metrics.fingerprint_secret_file '%s': %s",
			c->fp_secret_file, err);
		return;
	}
	if (strlen(secret) < FP_SECRET_MIN)
		add_err(ld, line_of(f), "metrics.fingerprint_secret_file '%s': the secret is "
			"shorter than %d characters: make a longer one (openssl rand -hex 32)",
			c->fp_secret_file, FP_SECRET_MIN);
	else
		fp_key_init(&c->fp, secret, strlen(secret));
	explicit_bzero(secret, strlen(secret));
	free(secret);
}

/*
 * The groups made of plain settings: fallback, local_quota, metrics,
 * overrides, reload, response.
 */
static void load_groups(struct loader *ld, const config_setting_t *root)
{
	struct agent_config *c = ld->cfg;
	const struct cfg_key fallback[] = {
		KEY_UINT_AUTO("gateways", 1, 100000, &c->gateways),
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
		KEY_UINT("max_requests", 1, 100000, 100, &c->metrics_max_requests),
		KEY_DURATION("keepalive_timeout", 100, 600000, 20000, &c->metrics_keepalive_ms),
		KEY_STR("listen", &c->metrics_listen),
		KEY_OTHER("allow"),
		KEY_OTHER("host_names"),
		KEY_OTHER("token_file"),
		KEY_OTHER("fingerprint_secret_file"),
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
		KEY_OTHER("headers"),
	};
	const config_setting_t *s;

	load_group(ld, root, "fallback", " { gateways = N; }", fallback, ARRAY_SIZE(fallback));
	load_group(ld, root, "local_quota", " { lease_ms = 1000; }", quota, ARRAY_SIZE(quota));
	s = load_group(ld, root, "metrics", " { listen = \"127.0.0.1:9100\"; }", metrics,
		       ARRAY_SIZE(metrics));
	if (s && c->metrics_listen && strncmp(c->metrics_listen, "unix:", 5) == 0)
		add_err(ld, line_of(s), "metrics: 'listen' must be ip:port");
	load_metrics_access(ld, s);
	load_fingerprint_secret(ld, s);
	s = load_group(ld, root, "overrides", "", overrides, ARRAY_SIZE(overrides));
	/* the overrides hash in one reply: two elements an entry, room for as many stale */
	if (c->overrides.max_entries > c->redis.max_reply_elements / 4)
		add_err(ld, line_of(s ? s : root),
			"overrides.max_entries = %u does not fit one reply from Redis: raise "
			"redis.max_reply_elements to %u or more (and redis.max_reply_bytes, "
			"~100 bytes an entry)", c->overrides.max_entries,
			c->overrides.max_entries * 4);
	load_group(ld, root, "reload", " { watch = true; }", reload, ARRAY_SIZE(reload));
	s = load_group(ld, root, "response", "", response, ARRAY_SIZE(response));
	load_header_dialect(ld, s);
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
 * The share of spoe_timeout a decision's Redis reply gets, in whole ms (at
 * least 1), or 0 when spoe_timeout is not set: decisions are answered by
 * then, whatever redis.command_timeout_ms says.
 */
unsigned config_answer_budget_ms(const struct agent_config *cfg)
{
	unsigned ms = (unsigned)(cfg->spoe_timeout_ms * CFG_ANSWER_SHARE);

	if (!cfg->spoe_timeout_ms)
		return 0;
	return ms ? ms : 1;
}

/*
 * The deadline of a Redis command no NOTIFY waits on (and of every command
 * without spoe_timeout): redis.command_timeout_ms if set, else derived from
 * HAProxy's budget (config_answer_budget_ms()), else 5 ms.
 */
unsigned config_command_timeout_ms(const struct agent_config *cfg)
{
	unsigned budget = config_answer_budget_ms(cfg);

	if (cfg->redis.command_timeout_ms)
		return cfg->redis.command_timeout_ms;
	return budget ? budget : STORE_COMMAND_TIMEOUT_MS;
}

/* What one reply from Redis may be (redis.max_reply_*), for every connection's reader. */
void config_reply_limits(const struct agent_config *cfg, struct reply_limits *out)
{
	out->max_bytes = cfg->redis.max_reply_bytes;
	out->max_elements = cfg->redis.max_reply_elements;
	out->max_depth = cfg->redis.max_reply_depth;
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

/*
 * Writes to <out> every setting read from a table of keys, at its default, as
 * "group.key = value" (durations in ms): what a configuration that does not
 * set them gets. doc/configuration.md is checked against it. Returns 0, or
 * -1 (printed) if the minimal configuration it reads was refused.
 */
int config_defaults(FILE *out)
{
	static const char minimal[] =
		"limits = { l = { rate = 1; period = \"1s\"; }; };\n"
		"tiers = { t = { limits = [\"l\"]; }; };\ndefault_tier = \"t\";\n"
		"anonymous = { limits = [\"l\"]; };\n";
	struct cfg_errors errs = {0};
	struct loader ld = {.file = "(defaults)", .errs = &errs, .defaults = out};
	config_t lc;
	size_t i;

	ld.cfg = xcalloc(1, sizeof(*ld.cfg));
	ld.cfg->file = xstrdup(ld.file);
	config_init(&lc);
	if (config_read_string(&lc, minimal) == CONFIG_TRUE)
		load_root(&ld, &lc);
	else
		add_err(&ld, config_error_line(&lc), "%s", config_error_text(&lc));
	config_destroy(&lc);
	config_free(ld.cfg);
	for (i = 0; i < errs.n; i++)
		fprintf(stderr, "%s\n", errs.msgs[i]);
	cfg_errors_release(&errs);
	return i ? -1 : 0;
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
	for (size_t k = 0; k < cfg->metrics_nallow; k++)
		free(cfg->metrics_allow[k]);
	free(cfg->metrics_allow);
	for (size_t k = 0; k < cfg->metrics_nhosts; k++)
		free(cfg->metrics_hosts[k]);
	free(cfg->metrics_hosts);
	if (cfg->metrics_token)
		memset(cfg->metrics_token, 0, strlen(cfg->metrics_token));
	free(cfg->metrics_token);
	free(cfg->metrics_token_file);
	free(cfg->fp_secret_file);
	explicit_bzero(&cfg->fp, sizeof(cfg->fp));
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
	tls_ctx_free(cfg->redis.tls);
	tls_ctx_free(cfg->redis.sentinel_tls);
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
/*
 * A warning when the metrics listener shows fingerprints (/top, the status
 * page, /overrides) and no metrics.fingerprint_secret_file is set: they are
 * keyed with a random secret of this agent's, so they differ between gateways
 * (and from one start to the next).
 */
bool config_fingerprint_advice(const struct agent_config *cfg, char *buf, size_t len)
{
	if (!cfg->fp_random || !cfg->metrics_listen)
		return false;
	snprintf(buf, len,
		 "%s: warning: no metrics.fingerprint_secret_file: key fingerprints (/top, the "
		 "status page, /overrides, logs) are keyed with a random secret of this agent's "
		 "own, drawn at start: they differ between gateways and across restarts, so a "
		 "block by fp:<hex> taken from one agent's /top matches on that agent only until "
		 "it restarts; give every gateway the same secret file (openssl rand -hex 32)",
		 cfg->file);
	return true;
}

/* A warning when the metrics listener answers beyond loopback to anyone, without a token. */
bool config_metrics_advice(const struct agent_config *cfg, char *buf, size_t len)
{
	if (!cfg->metrics_listen || cfg->metrics_token || metrics_listen_loopback(cfg->metrics_listen))
		return false;
	for (size_t k = 0; k < cfg->metrics_nallow; k++) {
		struct ip_net net;

		if (ip_net_parse(cfg->metrics_allow[k], &net, NULL, 0) == 0 &&
		    !ip_net_is_loopback(&net))
			goto open;
	}
	if (cfg->metrics_allow_set)
		return false;
open:
	snprintf(buf, len,
		 "%s: warning: metrics.listen = \"%s\" answers beyond loopback without a token: "
		 "anyone who reaches it reads /status, /top and /overrides (client addresses, "
		 "Redis addresses); set metrics.token_file, and metrics.allow to the networks "
		 "of your scrapers", cfg->file, cfg->metrics_listen);
	return true;
}

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

/*
 * What `-c` and the agent's start say of a TLS group with `verify = false`:
 * formatted into <buf>; false when there is none.
 */
bool config_tls_advice(const struct agent_config *cfg, char *buf, size_t len)
{
	if (!cfg->redis.noverify_line)
		return false;
	snprintf(buf, len,
		 "%s:%d: warning: %s.tls.verify = false: the server's certificate is not checked, "
		 "so anyone on the path can pose as Redis and read what the agent sends, its "
		 "password included; name the CA with ca_file instead",
		 cfg->file, cfg->redis.noverify_line, cfg->redis.noverify_where);
	return true;
}

/*
 * How the agent reaches Redis, for `-c`: the address (or the Sentinels) and
 * whether in clear text or over TLS, its certificate verified or not.
 */
void config_redis_transport(const struct agent_config *cfg, char *buf, size_t len)
{
	const struct tls_ctx *t = cfg->redis.tls;
	const char *how = !t ? "in clear text"
			  : tls_ctx_verify(t) ? "over TLS, the server's certificate verified"
					      : "over TLS, the server's certificate NOT verified "
						"(tls.verify = false)";

	if (cfg->redis.nsentinels)
		snprintf(buf, len, "the master '%s' named by %zu Sentinel(s), %s%s",
			 cfg->redis.sentinel_master, cfg->redis.nsentinels, how,
			 cfg->redis.sentinel_tls ? "; the Sentinels over TLS" : "");
	else
		snprintf(buf, len, "%s, %s", cfg->redis.address ? cfg->redis.address : "?", how);
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
