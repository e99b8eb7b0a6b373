/* SPDX-License-Identifier: MIT */
/*
 * The status page: /status (HTML) and /status.json, from one model.
 *
 * DESIGN
 * The page is a list of panels (agent, decisions, denials, Redis, degraded
 * answers, local quotas, candidate policy, overrides). Each panel is a few
 * fields and tables of cells, built once per request from the merged view of
 * the metrics (metrics_view()) and the agent's state (struct status_info),
 * then written either way: as JSON (an object per panel, a table as an array
 * of objects) or as HTML (a definition list and tables, the same keys in
 * data-k / data-t / data-c attributes). The page's script polls
 * /status.json every few seconds and writes each value into the element that
 * names its key, rebuilds each table from its array (textContent only, never
 * markup) and redraws the chart; without the script the first paint is the
 * whole page. Each panel's "alert" is decided here, once, for both, with
 * its cause: the words, the number that tripped it and since when, listed
 * at the top of the page (and in /status.json's "causes") so that the first
 * screen says what is wrong before any panel does. The script gives each
 * fetch two seconds: an agent that stops answering is said so, above the
 * causes, and what it last said is greyed.
 *
 * Bounds: tables are bounded by the metrics (MET_ROWS, MET_TOP_RULES x
 * MET_TOP_K, MET_NODES per worker, MET_HIST points); the override of each
 * top offender is found with binary searches (ovr_match_prefix()).
 */
#include "status.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "digest.h"
#include "store.h"
#include "util.h"

/* ---------------------------------------------------------------- escaping */

/* Appends <s> as a JSON string; <, > and & as \u escapes (safe in any markup). */
void status_json_str(struct http_reply *r, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	const unsigned char *run = p;

	http_reply_append(r, "\"", 1);
	for (; *p; p++) {
		if (*p >= 0x20 && *p != '"' && *p != '\\' && *p != '<' && *p != '>' && *p != '&' &&
		    *p != 0x7f)
			continue;
		http_reply_append(r, (const char *)run, (size_t)(p - run));
		if (*p == '"' || *p == '\\')
			http_reply_printf(r, "\\%c", *p);
		else
			http_reply_printf(r, "\\u%04x", *p);
		run = p + 1;
	}
	http_reply_append(r, (const char *)run, (size_t)(p - run));
	http_reply_append(r, "\"", 1);
}

/* Appends <s> escaped for HTML text and quoted attribute values. */
void status_html_str(struct http_reply *r, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	const unsigned char *run = p;

	for (; *p; p++) {
		const char *e;

		switch (*p) {
		case '&': e = "&amp;"; break;
		case '<': e = "&lt;"; break;
		case '>': e = "&gt;"; break;
		case '"': e = "&quot;"; break;
		case '\'': e = "&#39;"; break;
		default:
			if (*p >= 0x20 && *p != 0x7f)
				continue;
			e = "\xef\xbf\xbd"; /* U+FFFD for a control byte */
			break;
		}
		http_reply_append(r, (const char *)run, (size_t)(p - run));
		http_reply_append(r, e, strlen(e));
		run = p + 1;
	}
	http_reply_append(r, (const char *)run, (size_t)(p - run));
}

/* Appends the string <s> (no formatting: the page is made of many small pieces). */
static void put(struct http_reply *r, const char *s)
{
	http_reply_append(r, s, strlen(s));
}

static void put_u64(struct http_reply *r, uint64_t v)
{
	char buf[24];

	if (v > INT64_MAX)
		http_reply_printf(r, "%llu", (unsigned long long)v);
	else
		http_reply_append(r, buf, fmt_i64(buf, (int64_t)v));
}

/* ---------------------------------------------------------------- the model */

enum cell_type {
	CT_NULL = 0,            /* no value: null, "-" */
	CT_STR,
	CT_U64,
	CT_NUM,                 /* a rate or a latency: 3 decimals */
	CT_BOOL,
	CT_COUNT                /* sentinel */
};

struct cell {
	enum cell_type t;
	const char *s;                  /* CT_STR: owned when <owned>, else lives as long */
	bool owned;                     /* as the view and the info the model is built from */
	uint64_t u;
	double d;
};

/* A table's column: its JSON member and HTML data-c, and its heading. */
struct col {
	const char *key;                /* static */
	const char *label;              /* static */
};

/* One value of a panel: its JSON member and HTML data-k (after the panel's id), its label. */
struct field {
	const char *key;                /* static */
	const char *label;              /* static */
	struct cell v;
};

/* Rows of cells: a JSON array of objects, an HTML table. */
struct table {
	const char *key;                /* static: its member in the panel, data-t */
	const char *title;              /* static: its heading */
	const struct col *cols;         /* static: ncols of them */
	size_t ncols;
	struct cell *cells;             /* owned: nrows * ncols, row by row */
	size_t nrows, cap;              /* rows filled, rows allocated */
	bool hidden;                    /* JSON only (the chart's data) */
};

#define PANEL_FIELDS    16
#define PANEL_TABLES    4

/* One panel of the page: an object of /status.json, a section of /status. */
struct panel {
	const char *id;                 /* static: its member, the section's id */
	const char *title;              /* static */
	bool alert;                     /* red: it needs the operator (doc/operations.md) */
	bool wide;                      /* the whole width of the page */
	const char *hint;               /* static: what the panel shows, one line */
	size_t nfields, ntables;
	struct field f[PANEL_FIELDS];
	struct table t[PANEL_TABLES];
};

/* in the order of the page: what an incident looks at first comes first */
enum { P_DECISIONS = 0, P_REDIS, P_DEGRADED, P_DENIALS, P_QUOTAS, P_CANDIDATE, P_OVERRIDES,
       P_AGENT, P_COUNT };

#define CAUSES_MAX      12
#define CAUSE_LEN       512

/* One thing that is wrong, in words with the number that tripped it: a red panel's reason. */
struct cause {
	int rank;                       /* the list's order: the most telling first */
	const char *panel;              /* static: the red panel's id, the page's #anchor */
	char what[CAUSE_LEN];
	int64_t since;                  /* Unix s it began as far as the agent knows, 0 unknown */
};

/* The whole page, built by model_build(), freed by model_free(). */
struct model {
	struct panel p[P_COUNT];
	struct cause causes[CAUSES_MAX];
	size_t ncauses;
	bool redis_trouble;             /* the Redis panel is red: the ladder answers now */
	const char *state;              /* static: "ok", "degraded", "not ready" */
	const char *health;             /* what is wrong with Redis, or NULL: health_buf,
					 * or the caller's status_info.health */
	char health_buf[1024];
};

/* A string cell, copied (<s> may go before the model). */
static struct cell c_str(const char *s)
{
	return (struct cell){.t = s ? CT_STR : CT_NULL, .s = s ? xstrdup(s) : NULL, .owned = !!s};
}

/* A string cell that refers to <s>, which outlives the model (the view's names, constants). */
static struct cell c_ref(const char *s)
{
	return (struct cell){.t = s ? CT_STR : CT_NULL, .s = s};
}

static struct cell c_u64(uint64_t u)
{
	return (struct cell){.t = CT_U64, .u = u};
}

static struct cell c_num(double d)
{
	return (struct cell){.t = isfinite(d) ? CT_NUM : CT_NULL, .d = d};
}

static struct cell c_bool(bool b)
{
	return (struct cell){.t = CT_BOOL, .u = b};
}

/* Adds a cause of <panel> (its words by format) since <since> (0: unknown), ranked <rank>. */
static void PRINTF(5, 6) cause(struct model *m, int rank, const char *panel, int64_t since,
			       const char *fmt, ...)
{
	struct cause *c;
	va_list ap;

	if (m->ncauses == CAUSES_MAX)
		return;
	c = &m->causes[m->ncauses++];
	c->rank = rank;
	c->panel = panel;
	c->since = since;
	va_start(ap, fmt);
	vsnprintf(c->what, sizeof(c->what), fmt, ap);
	va_end(ap);
}

static void field(struct panel *p, const char *key, const char *label, struct cell v)
{
	BUG_ON(p->nfields == PANEL_FIELDS);
	p->f[p->nfields++] = (struct field){key, label, v};
}

static struct table *table(struct panel *p, const char *key, const char *title,
			   const struct col *cols, size_t ncols)
{
	struct table *t;

	BUG_ON(p->ntables == PANEL_TABLES);
	t = &p->t[p->ntables++];
	memset(t, 0, sizeof(*t));
	t->key = key;
	t->title = title;
	t->cols = cols;
	t->ncols = ncols;
	return t;
}

/* A new row of <t>, its cells null until set. */
static struct cell *row(struct table *t)
{
	struct cell *c;

	if (t->nrows == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 16;
		t->cells = xrealloc(t->cells, t->cap * t->ncols * sizeof(*t->cells));
	}
	c = &t->cells[t->nrows++ * t->ncols];
	memset(c, 0, t->ncols * sizeof(*c));
	return c;
}

static void model_free(struct model *m)
{
	size_t i, j, k;

	for (i = 0; i < P_COUNT; i++) {
		struct panel *p = &m->p[i];

		for (j = 0; j < p->nfields; j++)
			if (p->f[j].v.owned)
				free((char *)p->f[j].v.s);
		for (j = 0; j < p->ntables; j++) {
			for (k = 0; k < p->t[j].nrows * p->t[j].ncols; k++)
				if (p->t[j].cells[k].owned)
					free((char *)p->t[j].cells[k].s);
			free(p->t[j].cells);
		}
	}
}

/* ---------------------------------------------------------------- panels */

static const char *const result_keys[MET_RESULTS] = {"allowed", "denied", "shadow_denied",
						     "degraded", "local"};

/* The rate of each result between points <a> and <b> of the history (never negative). */
static void point_rates(const struct met_point *a, const struct met_point *b, double out[])
{
	double dt = (double)(b->t - a->t);
	int k;

	for (k = 0; k < MET_RESULTS; k++)
		out[k] = dt > 0 && b->v[k] > a->v[k] ? (double)(b->v[k] - a->v[k]) / dt : 0.;
}

/* The upper bound (ms) of the bucket of <h> where quantile <q> falls, NaN when empty. */
static double hist_quantile_ms(const struct prom_hist *h, double q)
{
	uint64_t need, seen = 0;
	size_t i;

	if (!h->count)
		return NAN;
	need = (uint64_t)ceil(q * (double)h->count);
	for (i = 0; i <= h->nbounds; i++) {
		seen += h->buckets[i];
		if (seen >= need)
			break;
	}
	if (i >= h->nbounds) /* +Inf: twice the last bound, "beyond it" */
		return 2e3 * h->bounds[h->nbounds - 1];
	return 1e3 * h->bounds[i];
}

/* The same for a node's latency buckets (store_lat_bound()). */
static double node_quantile_ms(const uint64_t lat[STORE_LAT_BUCKETS], double q, uint64_t *n)
{
	uint64_t need, seen = 0, count = 0;
	unsigned i;

	for (i = 0; i < STORE_LAT_BUCKETS; i++)
		count += lat[i];
	*n = count;
	if (!count)
		return NAN;
	need = (uint64_t)ceil(q * (double)count);
	for (i = 0; i < STORE_LAT_BUCKETS; i++) {
		seen += lat[i];
		if (seen >= need)
			break;
	}
	if (i + 1 >= STORE_LAT_BUCKETS)
		return 2e3 * store_lat_bound(STORE_LAT_BUCKETS - 2);
	return 1e3 * store_lat_bound(i);
}

static void fmt_time(int64_t t, char *buf, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	if (!gmtime_r(&tt, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, len, "%lld", (long long)t);
}

static void panel_agent(struct model *m, const struct met_view *v, const struct status_info *si)
{
	struct panel *p = &m->p[P_AGENT];
	int64_t reload_at = (int64_t)v->max[MC_RELOAD_AT];
	char when[32];

	p->id = "agent";
	p->title = "Agent";
	p->hint = "version, uptime, the configuration in force and its last reload";
	field(p, "state", "State", c_str(m->state));
	field(p, "version", "Version", c_str(si->version));
	field(p, "now", "Now (Unix s)", c_u64((uint64_t)si->now));
	field(p, "uptime_s", "Uptime (s)",
	      c_u64(si->now > v->started ? (uint64_t)(si->now - v->started) : 0));
	field(p, "workers", "Workers", c_u64(v->live));
	field(p, "generation", "Configuration generation", c_u64(v->max[MC_GENERATION]));
	field(p, "reloads_ok", "Reloads applied", c_u64(v->sum[MC_RELOADS_OK]));
	field(p, "reloads_failed", "Reloads refused", c_u64(v->sum[MC_RELOADS_FAILED]));
	if (reload_at > 0) {
		fmt_time(reload_at, when, sizeof(when));
		field(p, "last_reload", "Last reload", c_str(when));
		field(p, "last_reload_ok", "Last reload applied", c_bool(v->reload_ok));
	} else {
		field(p, "last_reload", "Last reload", c_str(NULL));
		field(p, "last_reload_ok", "Last reload applied", c_str(NULL));
	}
	field(p, "store", "Store", c_str(si->store));
	field(p, "ready", "Ready", c_bool(si->ready));
	field(p, "spop_connections", "HAProxy connections", c_u64(v->sum[MC_CONNS]));
	p->alert = !si->ready || (reload_at > 0 && !v->reload_ok);
	if (!si->ready) {
		int64_t since = 0;
		size_t i;

		/* since the first node still down went down */
		for (i = 0; i < v->nnodes; i++)
			if (v->nodes[i].down_since > 0 &&
			    (!since || (int64_t)v->nodes[i].down_since < since))
				since = (int64_t)v->nodes[i].down_since;
		cause(m, 0, "agent", since, "Agent not ready (/ready answers 503): %s",
		      m->health ? m->health : "no Redis connection ready yet");
	}
	if (reload_at > 0 && !v->reload_ok)
		cause(m, 7, "agent", reload_at,
		      "The last reload was refused: configuration generation %llu still in force",
		      (unsigned long long)v->max[MC_GENERATION]);
}

static const char *const rate_labels[MET_RESULTS] = {
	"Allowed, last step (/s)", "Denied (/s)", "Shadow denied (/s)", "Degraded (/s)",
	"Local fallback (/s)"};

static const struct col series_cols[] = {{"t", "Unix s"},         {"allowed", "allowed/s"},
					 {"denied", "denied/s"},   {"shadow_denied", "shadow/s"},
					 {"degraded", "degraded/s"}, {"local", "local/s"}};
static const struct col rule_cols[] = {{"tier", "Tier"},     {"rule", "Rule"},
				       {"allowed", "Allowed"}, {"denied", "Denied"},
				       {"shadow_denied", "Shadow denied"},
				       {"degraded", "Degraded"}, {"local", "Local"}};

static void panel_decisions(struct model *m, const struct met_view *v, double *last,
			    uint64_t *total)
{
	struct panel *p = &m->p[P_DECISIONS];
	struct table *t;
	size_t i;
	int k;

	p->id = "decisions";
	p->title = "Decisions";
	p->hint = "decisions per second by result, the last 10 minutes";
	p->wide = true;
	memset(last, 0, MET_RESULTS * sizeof(*last));
	if (v->nhist >= 2)
		point_rates(&v->hist[v->nhist - 2], &v->hist[v->nhist - 1], last);
	for (k = 0; k < MET_RESULTS; k++)
		field(p, result_keys[k], rate_labels[k], c_num(last[k]));
	*total = 0;
	for (i = 0; i < v->nrows; i++)
		*total += v->rows[i].allowed + v->rows[i].denied + v->rows[i].shadow_denied +
			  v->rows[i].degraded + v->rows[i].local;
	field(p, "total", "Decisions since the start", c_u64(*total));
	field(p, "step_s", "Step (s)", c_u64(MET_HIST_STEP_S));
	field(p, "latency_p50_ms", "Decision latency p50 (ms, bucket bound)",
	      c_num(hist_quantile_ms(&v->decision_lat, 0.5)));
	field(p, "latency_p99_ms", "Decision latency p99 (ms, bucket bound)",
	      c_num(hist_quantile_ms(&v->decision_lat, 0.99)));
	t = table(p, "series", "History", series_cols, ARRAY_SIZE(series_cols));
	t->hidden = true;
	for (i = 1; i < v->nhist; i++) {
		struct cell *c = row(t);
		double r[MET_RESULTS];

		point_rates(&v->hist[i - 1], &v->hist[i], r);
		c[0] = c_u64((uint64_t)v->hist[i].t);
		for (k = 0; k < MET_RESULTS; k++)
			c[1 + k] = c_num(r[k]);
	}
	t = table(p, "rules", "By tier and rule (since the start)", rule_cols,
		  ARRAY_SIZE(rule_cols));
	for (i = 0; i < v->nrows; i++) {
		const struct met_row *rw = &v->rows[i];
		struct cell *c = row(t);

		c[0] = c_ref(rw->tier);
		c[1] = c_ref(rw->rule);
		c[2] = c_u64(rw->allowed);
		c[3] = c_u64(rw->denied);
		c[4] = c_u64(rw->shadow_denied);
		c[5] = c_u64(rw->degraded);
		c[6] = c_u64(rw->local);
	}
	p->alert = v->sum[MC_CONNS] == 0;
	if (p->alert)
		cause(m, 3, "decisions", 0, "No HAProxy connection to the agent (0 SPOP connections)");
}

static const struct col offender_cols[] = {{"rule", "Rule"},     {"rank", "#"},
					   {"client", "Client"}, {"denied", "Denied"},
					   {"error", "± error"}, {"override", "Override"}};
static const struct col denied_cols[] = {{"rule", "Rule"},
					 {"denied", "Denied"},
					 {"distinct_clients", "Distinct clients"}};

/* The override of <e> as one line: what, until when, by whom, why. */
static void describe(const struct ovr_entry *e, char *buf, size_t len)
{
	char what[256], when[32];

	ovr_describe(e, what, sizeof(what));
	fmt_time(e->until, when, sizeof(when));
	snprintf(buf, len, "%s until %s%s%s%s%s", what, when, e->by[0] ? " by " : "", e->by,
		 e->reason[0] ? ": " : "", e->reason);
}

/* Top offenders of the enforced rules (<cand> false) or of the candidate's, into <p>. */
static void offenders_tables(struct panel *p, const struct met_view *v,
			     const struct status_info *si, bool cand)
{
	size_t pl = strlen(MET_CAND_TOP), i, j;
	struct table *td, *to;

	td = table(p, cand ? "candidate_clients" : "rules", cand ? "Would-be denials by rule"
								 : "Denials by rule",
		   denied_cols, ARRAY_SIZE(denied_cols));
	to = table(p, cand ? "candidate_offenders" : "offenders",
		   cand ? "Top clients the candidate would deny" : "Top offenders",
		   offender_cols, ARRAY_SIZE(offender_cols) - (cand ? 1 : 0));
	for (j = 0; j < v->ntop; j++) {
		const struct met_merged_top *mt = &v->tops[j];
		bool is_cand = strncmp(mt->rule, MET_CAND_TOP, pl) == 0;
		const char *rule = is_cand ? mt->rule + pl : mt->rule;
		struct cell *c;

		if (is_cand != cand)
			continue;
		c = row(td);
		c[0] = c_ref(rule);
		c[1] = c_u64(mt->denied);
		c[2] = c_u64(hll_count(&mt->hll));
		for (i = 0; i < mt->n && i < MET_TOP_K; i++) {
			char err[8], target[TOPK_ITEM_MAX + 4], what[640];
			const struct ovr_entry *e;
			struct ovr_target t;

			c = row(to);
			c[0] = c_ref(rule);
			c[1] = c_u64(i + 1);
			c[2] = c_ref(mt->e[i].item);
			c[3] = c_u64(mt->e[i].count);
			c[4] = c_u64(mt->e[i].error);
			if (cand || !si->ovr)
				continue;
			/* a key's fingerprint reads as a target; an address prefix needs "ip:" */
			snprintf(target, sizeof(target), "%s%s",
				 strncmp(mt->e[i].item, "fp:", 3) == 0 ||
				 strncmp(mt->e[i].item, "k:", 2) == 0 ? "" : "ip:", mt->e[i].item);
			if (ovr_target_parse(target, strlen(target), &t, err, sizeof(err)) < 0)
				continue;
			e = ovr_match_prefix(si->ovr, &t, si->now);
			if (!e)
				continue;
			describe(e, what, sizeof(what));
			c[5] = c_str(what);
		}
	}
}

/*
 * The denials are judged against their own recent level, not a fixed share (a
 * public API denies a fifth of its requests on an ordinary day): their share of
 * the decisions over the last DENY_RECENT_S against their share over the rest
 * of the history (up to ten minutes, at least DENY_BASE_MIN_S of it). Red when
 * the recent share reaches base + max(base, DENY_MARGIN) -- twice the usual
 * share, and at least ten points above it -- with DENY_MIN denials at least.
 * With less history than that nothing is judged (doc/operations.md).
 */
#define DENY_RECENT_S   60
#define DENY_BASE_MIN_S 60
#define DENY_MARGIN     0.10
#define DENY_MIN        20

struct deny_judge {
	double recent, base, bound;     /* shares; base and bound NaN when not judged */
	uint64_t denied;                /* denials within DENY_RECENT_S */
	unsigned base_s;                /* seconds of history the base is made of */
	bool red;
};

/* The denials' share of the decisions between points <a> and <b>; 0 without any. */
static double deny_share(const struct met_point *a, const struct met_point *b, uint64_t *denied)
{
	uint64_t all = 0;
	int k;

	for (k = 0; k < MET_RESULTS; k++)
		all += b->v[k] > a->v[k] ? b->v[k] - a->v[k] : 0;
	*denied = b->v[MR_DENIED] > a->v[MR_DENIED] ? b->v[MR_DENIED] - a->v[MR_DENIED] : 0;
	return all ? (double)*denied / (double)all : 0.;
}

static void deny_judge(const struct met_view *v, struct deny_judge *j)
{
	size_t steps = DENY_RECENT_S / MET_HIST_STEP_S, mid;
	uint64_t ignored;

	j->recent = 0.;
	j->base = j->bound = NAN;
	j->denied = 0;
	j->base_s = 0;
	j->red = false;
	if (v->nhist < 2)
		return;
	mid = v->nhist - 1 > steps ? v->nhist - 1 - steps : 0;
	j->recent = deny_share(&v->hist[mid], &v->hist[v->nhist - 1], &j->denied);
	j->base_s = (unsigned)(v->hist[mid].t - v->hist[0].t);
	if (j->base_s < DENY_BASE_MIN_S)
		return;
	j->base = deny_share(&v->hist[0], &v->hist[mid], &ignored);
	j->bound = j->base + (j->base > DENY_MARGIN ? j->base : DENY_MARGIN);
	j->red = j->denied >= DENY_MIN && j->recent >= j->bound;
}

static void panel_denials(struct model *m, const struct met_view *v,
			  const struct status_info *si, const double *last)
{
	struct panel *p = &m->p[P_DENIALS];
	struct deny_judge dj;
	double all = 0;
	int k;

	p->id = "denials";
	p->title = "Denials";
	p->hint = "denials by rule and the clients denied most, with their overrides";
	p->wide = true;
	for (k = 0; k < MET_RESULTS; k++)
		all += last[k];
	field(p, "denied_share", "Denied, last step (share)",
	      c_num(all > 0 ? last[MR_DENIED] / all : 0.));
	deny_judge(v, &dj);
	field(p, "recent_share", "Denied, last minute (share)", c_num(dj.recent));
	field(p, "baseline_share", "Denied, the minutes before (share)", c_num(dj.base));
	field(p, "red_from", "Red from (share, last minute)", c_num(dj.bound));
	field(p, "blocked", "Denied by a block override", c_u64(v->sum[MC_OVR_BLOCKED]));
	field(p, "concurrency_held", "Concurrency slots held", c_u64(v->sum[MC_CONC_HELD]));
	field(p, "concurrency_released", "Concurrency slots given back",
	      c_u64(v->sum[MC_CONC_RELEASED]));
	field(p, "concurrency_release_lost", "... lost (their lease ends them)",
	      c_u64(v->sum[MC_CONC_RELEASE_LOST]));
	offenders_tables(p, v, si, false);
	/* far above their own recent level: an attack, or a limit too tight */
	p->alert = dj.red;
	if (p->alert)
		cause(m, 4, "denials", 0,
		      "Denials: %.0f%% of the decisions over the last minute (%llu denied), "
		      "against %.0f%% over the %u minutes before (red from %.0f%%)",
		      100 * dj.recent, (unsigned long long)dj.denied, 100 * dj.base,
		      dj.base_s / 60, 100 * dj.bound);
}

static const struct col node_cols[] = {
	{"name", "Node"},       {"state", "State"},        {"oldest_ms", "Oldest unanswered ms"},
	{"breaker_open", "Breaker open"},
	{"limit", "Limit"},     {"in_flight", "In flight"}, {"queued", "Queued"},
	{"p50_ms", "p50 ms"},   {"p90_ms", "p90 ms"},       {"p99_ms", "p99 ms"},
	{"replies", "Replies"}, {"errors", "Errors"},        {"down_since", "Down since"},
	{"trouble", "Trouble"}};

/* "HH:MM:SS UTC" of Unix seconds <t>. */
static void fmt_hms(int64_t t, char *buf, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	if (!gmtime_r(&tt, &tm) || !strftime(buf, len, "%H:%M:%S UTC", &tm))
		snprintf(buf, len, "%lld", (long long)t);
}

/* The cause a node gives when it is not well: its state, the oldest command it owes,
 * its breaker, what is wrong in words. */
static void node_cause(struct model *m, const struct store_node_stats *n, int64_t now)
{
	bool silent = strcmp(n->state, "not answering") == 0;
	char oldest[64] = "";
	int64_t since = n->down_since > 0 ? (int64_t)n->down_since : 0;

	if (!n->trouble[0] && !silent && !n->breaker_open)
		return;
	if (n->oldest_s > 0) {
		snprintf(oldest, sizeof(oldest), ", its oldest command unanswered for %.1f s",
			 n->oldest_s);
		int64_t sent = (int64_t)floor((double)now - n->oldest_s);

		if (!since || sent < since)
			since = sent;
	}
	/* the trouble says "breaker open" itself when it is why the node is down */
	cause(m, 1, "redis", since, "Redis %s %s%s%s%s%s", n->name, n->state, oldest,
	      n->breaker_open && !strstr(n->trouble, "breaker open") ? ", breaker open" : "",
	      n->trouble[0] ? ": " : "", n->trouble);
}
static const struct col errclass_cols[] = {{"class", "Class"}, {"count", "Errors"}};

static void panel_redis(struct model *m, const struct met_view *v, const struct status_info *si)
{
	static const enum met_counter ec[STORE_EC_COUNT] = {
		MC_REDIS_ERR_OOM, MC_REDIS_ERR_BUSY, MC_REDIS_ERR_LOADING, MC_REDIS_ERR_READONLY,
		MC_REDIS_ERR_OTHER, MC_REDIS_ERR_PROTOCOL};
	struct panel *p = &m->p[P_REDIS];
	struct table *t;
	bool silent = false;
	size_t i;
	int k;

	p->id = "redis";
	p->title = "Redis";
	p->hint = "per node: the oldest command unanswered, latency of the replies of the last "
		  "10-20 s, concurrency limit, queue, breaker";
	p->wide = true;
	field(p, "health", "Trouble", c_str(m->health));
	field(p, "oldest_ms", "Oldest command unanswered (ms)",
	      c_u64(v->max[MC_REDIS_OLDEST_MS]));
	field(p, "down", "Workers with a node down", c_u64(v->sum[MC_REDIS_DOWN]));
	field(p, "breaker_open", "Workers with a breaker open", c_u64(v->sum[MC_BREAKER_OPEN]));
	field(p, "breaker_opened", "Breaker openings", c_u64(v->sum[MC_BREAKER_OPENED]));
	field(p, "concurrency_limit", "Concurrency limit", c_u64(v->sum[MC_REDIS_CONCURRENCY]));
	field(p, "pending", "In flight", c_u64(v->sum[MC_REDIS_PENDING]));
	field(p, "queued", "Queued", c_u64(v->sum[MC_REDIS_QUEUED]));
	field(p, "shed", "Shed (overload)", c_u64(v->sum[MC_REDIS_SHED]));
	field(p, "late", "Late replies", c_u64(v->sum[MC_REDIS_LATE]));
	field(p, "commands", "Commands sent", c_u64(v->sum[MC_REDIS_SENT]));
	t = table(p, "nodes", "Nodes", node_cols, ARRAY_SIZE(node_cols));
	for (i = 0; i < v->nnodes; i++) {
		const struct store_node_stats *n = &v->nodes[i];
		struct cell *c = row(t);
		uint64_t replies, errs = 0;

		c[0] = c_ref(n->name);
		c[1] = c_ref(n->state);
		c[2] = c_u64((uint64_t)(n->oldest_s * 1000.));
		c[3] = c_bool(n->breaker_open);
		c[4] = c_u64(n->limit);
		c[5] = c_u64(n->out);
		c[6] = c_u64(n->queued);
		c[7] = c_num(node_quantile_ms(n->lat, 0.5, &replies));
		c[8] = c_num(node_quantile_ms(n->lat, 0.9, &replies));
		c[9] = c_num(node_quantile_ms(n->lat, 0.99, &replies));
		c[10] = c_u64(replies);
		for (k = 0; k < STORE_EC_COUNT; k++)
			errs += n->errors[k];
		c[11] = c_u64(errs);
		c[12] = n->down_since > 0 ? c_num(n->down_since) : c_num(NAN);
		c[13] = c_ref(n->trouble[0] ? n->trouble : NULL);
		silent |= strcmp(n->state, "not answering") == 0;
		node_cause(m, n, si->now);
	}
	t = table(p, "errors", "Error replies by class", errclass_cols, ARRAY_SIZE(errclass_cols));
	for (k = 0; k < STORE_EC_COUNT; k++) {
		struct cell *c = row(t);

		c[0] = c_ref(store_errclass_str(k));
		c[1] = c_u64(v->sum[ec[k]]);
	}
	p->alert = m->health != NULL || v->sum[MC_BREAKER_OPEN] > 0 || v->sum[MC_REDIS_DOWN] > 0 ||
		   silent;
	m->redis_trouble = p->alert;
	/* every red panel says why: what no node said */
	for (i = 0; i < m->ncauses; i++)
		if (strcmp(m->causes[i].panel, "redis") == 0)
			break;
	if (p->alert && i == m->ncauses)
		cause(m, 1, "redis", 0, "Redis: %s (workers with a node down: %llu, with a breaker "
		      "open: %llu)", m->health ? m->health : "trouble",
		      (unsigned long long)v->sum[MC_REDIS_DOWN],
		      (unsigned long long)v->sum[MC_BREAKER_OPEN]);
}

/* Degraded and local answers counted since history point <p> (the step under way). */
static uint64_t step_degraded(const struct met_view *v, const struct met_point *p)
{
	uint64_t now = 0;
	size_t i;

	for (i = 0; i < v->nrows; i++)
		now += v->rows[i].degraded + v->rows[i].local;
	return now > p->v[MR_DEGRADED] + p->v[MR_LOCAL] ? now - p->v[MR_DEGRADED] - p->v[MR_LOCAL]
							 : 0;
}

static const struct col reason_cols[] = {{"reason", "Reason"}, {"count", "Decisions"}};
static const struct col ladder_cols[] = {{"answer", "Answer"}, {"count", "Decisions"}};

static void panel_degraded(struct model *m, const struct met_view *v,
			   const struct status_info *si, const double *last)
{
	static const struct {
		const char *name;
		enum met_counter c;
	} ladder[] = {{"open (allowed, no verdict)", MC_FB_OPEN},
		      {"local fallback allowed", MC_FB_LOCAL_ALLOWED},
		      {"local fallback denied", MC_FB_LOCAL_DENIED},
		      {"closed (denied)", MC_FB_CLOSED}};
	struct panel *p = &m->p[P_DEGRADED];
	struct table *t;
	uint64_t total = 0, now_deg;
	char count[64];
	int64_t since;
	size_t i;

	p->id = "degraded";
	p->title = "Degraded answers";
	p->hint = "decisions Redis could not make: why, and what the failure ladder answered";
	for (i = 0; i < STORE_COUNT; i++)
		if (i != STORE_OK)
			total += v->degraded[i];
	field(p, "total", "Degraded since the start", c_u64(total));
	field(p, "rate", "Degraded and local, last step (/s)",
	      c_num(last[MR_DEGRADED] + last[MR_LOCAL]));
	field(p, "fallback", "While Redis cannot", c_str(si->fallback));
	t = table(p, "reasons", "By reason", reason_cols, ARRAY_SIZE(reason_cols));
	for (i = 0; i < STORE_COUNT; i++) {
		struct cell *c;

		if (i == STORE_OK)
			continue;
		c = row(t);
		c[0] = c_ref(store_status_str((int)i));
		c[1] = c_u64(v->degraded[i]);
	}
	t = table(p, "ladder", "What the ladder answered", ladder_cols, ARRAY_SIZE(ladder_cols));
	for (i = 0; i < ARRAY_SIZE(ladder); i++) {
		struct cell *c = row(t);

		c[0] = c_ref(ladder[i].name);
		c[1] = c_u64(v->sum[ladder[i].c]);
	}
	/* the state now, not the last step's: red while Redis is in trouble, or while
	 * the step under way (at most MET_HIST_STEP_S old) counts degraded answers */
	now_deg = v->nhist ? step_degraded(v, &v->hist[v->nhist - 1]) : 0;
	p->alert = m->redis_trouble || now_deg > 0;
	if (p->alert) {
		/* since: the start of the run of steps with degraded answers up to now */
		since = 0;
		if (v->nhist && now_deg) {
			for (i = v->nhist - 1; i > 0; i--)
				if (v->hist[i].v[MR_DEGRADED] + v->hist[i].v[MR_LOCAL] <=
				    v->hist[i - 1].v[MR_DEGRADED] + v->hist[i - 1].v[MR_LOCAL])
					break;
			since = v->hist[i].t;
		}
		if (now_deg)
			snprintf(count, sizeof(count), "%llu in the step under way",
				 (unsigned long long)now_deg);
		else
			snprintf(count, sizeof(count), "none yet in the step under way");
		cause(m, 2, "degraded", since, "Degraded answers: %s, %.1f/s the last step; "
		      "meanwhile the failure ladder answers: %s", count,
		      last[MR_DEGRADED] + last[MR_LOCAL], si->fallback ? si->fallback : "-");
	}
}

static void panel_quotas(struct model *m, const struct met_view *v,
			 const struct status_info *si, uint64_t decisions)
{
	struct panel *p = &m->p[P_QUOTAS];

	p->id = "quotas";
	p->title = "Local quotas";
	p->hint = "keys tracked, lease calls per decision, live gateways";
	field(p, "enabled", "Configured", c_bool(si->quotas));
	field(p, "keys", "Keys tracked", c_u64(v->sum[MC_QUOTA_KEYS]));
	field(p, "lease_grants", "Lease calls", c_u64(v->sum[MC_LEASE_GRANTS]));
	field(p, "lease_calls_per_decision", "Lease calls per decision",
	      c_num(decisions ? (double)v->sum[MC_LEASE_GRANTS] / (double)decisions : 0.));
	field(p, "outstanding", "Leased, not spent", c_u64(v->sum[MC_LEASE_OUTSTANDING]));
	field(p, "unreported", "Pre-checked, not reported", c_u64(v->sum[MC_UNREPORTED]));
	field(p, "report_lost", "Reports lost", c_u64(v->sum[MC_REPORT_LOST]));
	field(p, "untracked", "Untracked (table full)", c_u64(v->sum[MC_QUOTA_FULL]));
	field(p, "gateways", "Live gateways", c_u64(v->max[MC_GATEWAYS]));
	p->alert = si->quotas && si->store && strcmp(si->store, "redis") == 0 &&
		   v->max[MC_GATEWAYS] == 0;
	if (p->alert)
		cause(m, 5, "quotas", 0, "Local quotas: no live gateway counted yet (0 heartbeats "
		      "in Redis)");
}

static const struct col cand_cols[] = {{"tier", "Tier"},
				       {"rule", "Rule"},
				       {"would_deny", "Would deny"},
				       {"new_denials", "New denials"}};
static const struct col lifted_cols[] = {{"tier", "Tier"},
					 {"rule", "Enforced rule"},
					 {"lifted", "Denials lifted"}};

static void panel_candidate(struct model *m, const struct met_view *v,
			    const struct status_info *si)
{
	struct panel *p = &m->p[P_CANDIDATE];
	struct table *tc, *tl;
	uint64_t would = 0, fresh = 0, lifted = 0, enforced = 0;
	size_t i;

	p->id = "candidate";
	p->title = "Candidate policy";
	p->hint = "what the candidate would deny, beside what is denied today";
	for (i = 0; i < v->nrows; i++)
		enforced += v->rows[i].denied;
	tc = table(p, "rules", "Candidate rules", cand_cols, ARRAY_SIZE(cand_cols));
	tl = table(p, "lifted_rules", "Enforced denials the candidate would lift", lifted_cols,
		   ARRAY_SIZE(lifted_cols));
	for (i = 0; i < v->ncand; i++) {
		const struct met_cand_row *cr = &v->cand[i];
		struct cell *c;

		if (cr->enforced) {
			lifted += cr->lifted;
			c = row(tl);
			c[0] = c_ref(cr->tier);
			c[1] = c_ref(cr->rule);
			c[2] = c_u64(cr->lifted);
			continue;
		}
		would += cr->would_deny;
		fresh += cr->new_denials;
		if (!cr->would_deny && !cr->new_denials)
			continue;
		c = row(tc);
		c[0] = c_ref(cr->tier);
		c[1] = c_ref(cr->rule);
		c[2] = c_u64(cr->would_deny);
		c[3] = c_u64(cr->new_denials);
	}
	field(p, "configured", "Configured", c_bool(si->candidate));
	field(p, "enforced_denied", "Denied today", c_u64(enforced));
	field(p, "would_deny", "Would deny", c_u64(would));
	field(p, "new_denials", "New denials", c_u64(fresh));
	field(p, "lifted", "Denials lifted", c_u64(lifted));
	field(p, "unevaluated", "Unevaluated", c_u64(v->sum[MC_CAND_UNEVALUATED]));
	offenders_tables(p, v, si, true);
	p->alert = si->candidate && fresh > 0;
	if (p->alert)
		cause(m, 6, "candidate", 0, "The candidate policy would deny %llu requests allowed "
		      "today", (unsigned long long)fresh);
}

static void panel_overrides(struct model *m, const struct met_view *v,
			    const struct status_info *si)
{
	struct panel *p = &m->p[P_OVERRIDES];

	p->id = "overrides";
	p->title = "Overrides";
	p->hint = "blocks and limits set with spoa-ratelimit ctl (the list: /overrides)";
	field(p, "enabled", "Enabled", c_bool(si->ovr != NULL));
	field(p, "entries", "Entries in force", c_u64(v->max[MC_OVR_ENTRIES]));
	field(p, "blocked", "Requests blocked", c_u64(v->sum[MC_OVR_BLOCKED]));
	field(p, "limited", "Decisions with changed limits", c_u64(v->sum[MC_OVR_LIMITED]));
	field(p, "poll_errors", "Poll errors", c_u64(v->sum[MC_OVR_POLL_ERRORS]));
	field(p, "skipped", "Entries skipped", c_u64(v->sum[MC_OVR_SKIPPED]));
	p->alert = false;
}

/*
 * What is wrong with Redis, in the words of /ready: every node's trouble as its
 * workers report it (store_node_stats(), merged by metrics_view(): the first
 * worker down says why), or <si>'s when no node reports any (NULL: nothing).
 */
static const char *model_health(struct model *m, const struct met_view *v,
				const struct status_info *si)
{
	size_t i, off = 0;
	int w;

	for (i = 0; i < v->nnodes && off < sizeof(m->health_buf); i++) {
		if (!v->nodes[i].trouble[0])
			continue;
		w = snprintf(m->health_buf + off, sizeof(m->health_buf) - off, "%sredis %s %s",
			     off ? "; " : "", v->nodes[i].name, v->nodes[i].trouble);
		if (w > 0)
			off += (size_t)w;
	}
	return off ? m->health_buf : si->health;
}

/* The causes by rank, those of one rank in the order they were found (a stable sort). */
static void causes_sort(struct model *m)
{
	struct cause tmp;
	size_t i, j;

	for (i = 1; i < m->ncauses; i++) {
		tmp = m->causes[i];
		for (j = i; j > 0 && m->causes[j - 1].rank > tmp.rank; j--)
			m->causes[j - 1 + 1] = m->causes[j - 1];
		m->causes[j] = tmp;
	}
}

static void model_build(struct model *m, const struct met_view *v, const struct status_info *si)
{
	double last[MET_RESULTS];
	uint64_t total;

	memset(m, 0, sizeof(*m));
	m->health = model_health(m, v, si);
	panel_decisions(m, v, last, &total);
	panel_denials(m, v, si, last);
	panel_redis(m, v, si);
	panel_degraded(m, v, si, last);
	panel_quotas(m, v, si, total);
	panel_candidate(m, v, si);
	panel_overrides(m, v, si);
	/* degraded: Redis is in trouble (a node silent too): the failure ladder answers, or
	 * may any moment; degraded answers alone (a blip, shedding) are the causes' to say */
	m->state = !si->ready ? "not ready" : m->health || m->p[P_REDIS].alert ? "degraded" : "ok";
	panel_agent(m, v, si);
	causes_sort(m);
}

/* ---------------------------------------------------------------- JSON */

static void json_cell(struct http_reply *r, const struct cell *c)
{
	switch (c->t) {
	case CT_STR:
		status_json_str(r, c->s);
		break;
	case CT_U64:
		put_u64(r, c->u);
		break;
	case CT_NUM:
		http_reply_printf(r, "%.3f", c->d);
		break;
	case CT_BOOL:
		put(r, c->u ? "true" : "false");
		break;
	default:
		put(r, "null");
		break;
	}
}

/*
 * Renders the status as JSON: {"schema":1, "state":..., "alerts":{panel:bool},
 * then one object per panel: its fields, and its tables as arrays of objects}.
 */
void status_render_json(const struct met_view *v, const struct status_info *si,
			struct http_reply *r)
{
	struct model m;
	size_t i, j, k, c;

	model_build(&m, v, si);
	http_reply_printf(r, "{\"schema\":%d,\"state\":", STATUS_SCHEMA);
	status_json_str(r, m.state);
	put(r, ",\"causes\":[");
	for (i = 0; i < m.ncauses; i++) {
		http_reply_printf(r, "%s{\"panel\":\"%s\",\"what\":", i ? "," : "",
				  m.causes[i].panel);
		status_json_str(r, m.causes[i].what);
		put(r, ",\"since\":");
		if (m.causes[i].since > 0)
			put_u64(r, (uint64_t)m.causes[i].since);
		else
			put(r, "null");
		put(r, "}");
	}
	http_reply_printf(r, "],\"alerts\":{");
	for (i = 0; i < P_COUNT; i++)
		http_reply_printf(r, "%s\"%s\":%s", i ? "," : "", m.p[i].id,
				  m.p[i].alert ? "true" : "false");
	http_reply_printf(r, "}");
	for (i = 0; i < P_COUNT; i++) {
		const struct panel *p = &m.p[i];

		http_reply_printf(r, ",\"%s\":{", p->id);
		for (j = 0; j < p->nfields; j++) {
			http_reply_printf(r, "%s\"%s\":", j ? "," : "", p->f[j].key);
			json_cell(r, &p->f[j].v);
		}
		for (j = 0; j < p->ntables; j++) {
			const struct table *t = &p->t[j];

			http_reply_printf(r, "%s\"%s\":[", j || p->nfields ? "," : "", t->key);
			for (k = 0; k < t->nrows; k++) {
				put(r, k ? ",{" : "{");
				for (c = 0; c < t->ncols; c++) {
					put(r, c ? ",\"" : "\"");
					put(r, t->cols[c].key);
					put(r, "\":");
					json_cell(r, &t->cells[k * t->ncols + c]);
				}
				put(r, "}");
			}
			http_reply_printf(r, "]");
		}
		http_reply_printf(r, "}");
	}
	http_reply_printf(r, "}\n");
	model_free(&m);
}

/* ---------------------------------------------------------------- HTML */

/*
 * The page's style and script. The Content-Security-Policy allows exactly
 * these two (by their SHA-256), so any change here changes the header with it.
 */
static const char page_css[] =
	"body{font:14px/1.35 system-ui,-apple-system,\"Segoe UI\",sans-serif;margin:0 auto;"
	"max-width:1200px;padding:8px;color:#222;background:#fafafa}"
	"header{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:baseline}"
	"h1{font-size:18px;margin:4px 0}h2{font-size:15px;margin:0 0 4px}"
	"h3{font-size:13px;margin:8px 0 2px;color:#555}"
	".state{font-weight:bold;padding:1px 8px;border-radius:4px;background:#2a7;color:#fff}"
	".state.bad{background:#c33}small{color:#666}"
	".causes{background:#fff;border:1px solid #ccc;border-left:6px solid #2a7;"
	"border-radius:4px;padding:6px 8px;margin:8px 0}"
	".causes.bad{border-left-color:#c33;background:#fff4f4}"
	".causes ul{margin:0;padding-left:20px}.causes li{margin:2px 0;overflow-wrap:anywhere}"
	".causes a{color:#a11}"
	"#gone{background:#c33;color:#fff;font-weight:bold;padding:6px 8px;border-radius:4px;"
	"margin:8px 0}"
	".stale{opacity:.45;filter:grayscale(1)}"
	"main{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:8px}"
	"section{background:#fff;border:1px solid #ccc;border-left:6px solid #2a7;"
	"border-radius:4px;padding:6px 8px;min-width:0}"
	"section.red{border-left-color:#c33;background:#fff4f4}"
	"section.wide{grid-column:1/-1}"
	"dl{display:grid;grid-template-columns:auto minmax(0,1fr);gap:0 12px;margin:0}"
	"dt{color:#555}dd{margin:0;text-align:right;font-variant-numeric:tabular-nums;"
	"overflow-wrap:anywhere}"
	".tw{overflow-x:auto}table{border-collapse:collapse;width:100%;font-size:13px}"
	"th,td{padding:1px 6px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}"
	"td{overflow-wrap:break-word}"
	"td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}"
	"section.wide dl{grid-template-columns:repeat(auto-fill,minmax(190px,1fr) minmax(60px,auto))}"
	"svg{width:100%;max-width:640px;height:auto;display:block}.legend span{margin-right:10px}"
	".k0{color:#2a7}.k1{color:#c33}.k2{color:#888}.k3{color:#e80}.k4{color:#36c}";

/*
 * The script polls every POLL_MS and gives each fetch TIMEOUT_MS (an
 * AbortController): an agent stopped or gone is said at the top within
 * about four seconds, the pill turns red, and every panel is greyed (the
 * class "stale") until it answers again.
 */
static const char page_js[] =
	"(function(){\"use strict\";\n"
	"var COL=[\"#2a7\",\"#c33\",\"#888\",\"#e80\",\"#36c\"],"
	"KEYS=[\"allowed\",\"denied\",\"shadow_denied\",\"degraded\",\"local\"],"
	"NS=\"http://www.w3.org/2000/svg\",POLL_MS=2000,TIMEOUT_MS=2000,gone=0,lastOk=0;\n"
	"function get(o,k){var p=k.split(\".\");for(var i=0;i<p.length;i++){"
	"if(o===null||o===undefined)return null;o=o[p[i]];}return o;}\n"
	"function fmt(v){if(v===null||v===undefined)return \"-\";"
	"if(typeof v===\"boolean\")return v?\"yes\":\"no\";"
	"if(typeof v===\"number\")return String(Math.round(v*1000)/1000);return String(v);}\n"
	"function hms(ms){return new Date(ms).toISOString().slice(11,19)+\" UTC\";}\n"
	"function $(id){return document.getElementById(id);}\n"
	"function el(n,a){var e=document.createElementNS(NS,n);"
	"for(var k in a)e.setAttribute(k,a[k]);return e;}\n"
	"function chart(svg,s){while(svg.firstChild)svg.removeChild(svg.firstChild);"
	"var W=600,H=150,max=1;s.forEach(function(p){KEYS.forEach(function(k){"
	"if(p[k]>max)max=p[k];});});"
	"svg.appendChild(el(\"rect\",{x:0,y:0,width:W,height:H,fill:\"#fff\",stroke:\"#ddd\"}));"
	"var t=el(\"text\",{x:4,y:12,\"font-size\":11,fill:\"#555\"});"
	"t.textContent=fmt(max)+\"/s\";svg.appendChild(t);"
	"if(s.length<2)return;var t0=s[0].t,t1=s[s.length-1].t;"
	"t=el(\"text\",{x:4,y:146,\"font-size\":11,fill:\"#555\"});t.textContent=\"-\"+(t1-t0)+\"s\";"
	"svg.appendChild(t);t=el(\"text\",{x:596,y:146,\"font-size\":11,fill:\"#555\","
	"\"text-anchor\":\"end\"});t.textContent=\"now\";svg.appendChild(t);"
	"KEYS.forEach(function(k,i){var pts=s.map(function(p){"
	"return (((p.t-t0)/(t1-t0))*(W-2)+1).toFixed(1)+\",\"+(H-1-(p[k]/max)*(H-16)).toFixed(1);"
	"}).join(\" \");svg.appendChild(el(\"polyline\",{points:pts,fill:\"none\","
	"stroke:COL[i],\"stroke-width\":1.5}));});}\n"
	"function causes(cs){var ul=document.createElement(\"ul\");ul.id=\"causelist\";"
	"cs.forEach(function(c){var li=document.createElement(\"li\"),"
	"a=document.createElement(\"a\");a.href=\"#\"+c.panel;a.textContent=c.what;"
	"li.appendChild(a);if(c.since){var s=document.createElement(\"small\");"
	"s.textContent=\"since \"+hms(c.since*1000);li.appendChild(document.createTextNode(\" \"));"
	"li.appendChild(s);}ul.appendChild(li);});"
	"var o=$(\"causelist\");o.parentNode.replaceChild(ul,o);"
	"$(\"verdict\").textContent=cs.length?\"What is wrong\":"
	"\"Nothing wrong: every panel is green\";$(\"causes\").classList.toggle(\"bad\",cs.length>0);}\n"
	"function apply(d){document.querySelectorAll(\"[data-k]\").forEach(function(e){"
	"e.textContent=fmt(get(d,e.getAttribute(\"data-k\")));});"
	"document.querySelectorAll(\"section[data-a]\").forEach(function(e){"
	"e.classList.toggle(\"red\",!!get(d.alerts,e.getAttribute(\"data-a\")));});"
	"$(\"state\").classList.toggle(\"bad\",d.state!==\"ok\");causes(d.causes||[]);"
	"document.querySelectorAll(\"table[data-t]\").forEach(function(t){"
	"var rows=get(d,t.getAttribute(\"data-t\"))||[],cols=[];"
	"t.querySelectorAll(\"th[data-c]\").forEach(function(h){cols.push(h.getAttribute(\"data-c\"));});"
	"var b=document.createElement(\"tbody\");rows.forEach(function(r){"
	"var tr=document.createElement(\"tr\");cols.forEach(function(c){"
	"var td=document.createElement(\"td\");td.textContent=fmt(r[c]);"
	"if(typeof r[c]===\"number\")td.className=\"n\";tr.appendChild(td);});b.appendChild(tr);});"
	"if(!rows.length){var tr=document.createElement(\"tr\"),td=document.createElement(\"td\");"
	"td.colSpan=cols.length;td.textContent=\"none\";tr.appendChild(td);b.appendChild(tr);}"
	"t.replaceChild(b,t.tBodies[0]);});"
	"chart($(\"chart\"),d.decisions.series);}\n"
	"function live(s){$(\"live\").textContent=s;}\n"
	"function stale(on){document.querySelectorAll(\"section[data-a],#causes\").forEach("
	"function(e){e.classList.toggle(\"stale\",on);});$(\"gone\").hidden=!on;}\n"
	"function fail(why){if(!gone)gone=Date.now();stale(true);var st=$(\"state\");"
	"st.textContent=\"not answering\";st.classList.add(\"bad\");"
	"$(\"gone\").textContent=\"Agent not answering since \"+hms(gone)+\" (\"+why+\"): \"+"
	"(lastOk?\"what follows is its last answer, at \"+hms(lastOk):"
	"\"what follows is the page's first snapshot\");"
	"live(\"not answering since \"+hms(gone)+\", retrying\");}\n"
	"function poll(){var ac=new AbortController(),tm=setTimeout(function(){ac.abort();},"
	"TIMEOUT_MS);fetch(\"status.json\",{cache:\"no-store\",signal:ac.signal}).then(function(r){"
	"if(!r.ok)throw new Error(\"HTTP \"+r.status);return r.json();}).then(function(d){"
	"gone=0;lastOk=Date.now();stale(false);apply(d);live(\"live, \"+hms(d.agent.now*1000));"
	"}).catch(function(e){fail(e.name===\"AbortError\"?\"no answer within \"+"
	"TIMEOUT_MS/1000+\" s\":e.message);"
	"}).then(function(){clearTimeout(tm);setTimeout(poll,POLL_MS);});}\n"
	"poll();})();\n";

static void base64(const uint8_t *in, size_t n, char *out)
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i, o = 0;

	for (i = 0; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];

		out[o++] = a[v >> 18];
		out[o++] = a[(v >> 12) & 63];
		out[o++] = a[(v >> 6) & 63];
		out[o++] = a[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);

		out[o++] = a[v >> 18];
		out[o++] = a[(v >> 12) & 63];
		out[o++] = i + 1 < n ? a[(v >> 6) & 63] : '=';
		out[o++] = '=';
	}
	out[o] = 0;
}

/* The page's Content-Security-Policy: its own script and style, requests to itself. */
static const char *page_csp(void)
{
	static char csp[400];
	uint8_t h[SHA256_LEN];
	char js[48], css[48];

	if (csp[0])
		return csp;
	sha256(page_js, sizeof(page_js) - 1, h);
	base64(h, sizeof(h), js);
	sha256(page_css, sizeof(page_css) - 1, h);
	base64(h, sizeof(h), css);
	snprintf(csp, sizeof(csp),
		 "default-src 'none'; script-src 'sha256-%s'; style-src 'sha256-%s'; "
		 "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
		 "frame-ancestors 'none'",
		 js, css);
	return csp;
}

static void html_cell(struct http_reply *r, const struct cell *c)
{
	switch (c->t) {
	case CT_STR:
		status_html_str(r, c->s);
		break;
	case CT_U64:
		put_u64(r, c->u);
		break;
	case CT_NUM:
		http_reply_printf(r, "%.15g", round(c->d * 1000) / 1000);
		break;
	case CT_BOOL:
		put(r, c->u ? "yes" : "no");
		break;
	default:
		put(r, "-");
		break;
	}
}

/* The chart of the decision history, as the script draws it. */
static void html_chart(struct http_reply *r, const struct table *t)
{
	static const char *const col[MET_RESULTS] = {"#2a7", "#c33", "#888", "#e80", "#36c"};
	const double W = 600, H = 150;
	double max = 1, t0, t1;
	size_t i;
	int k;

	for (i = 0; i < t->nrows; i++)
		for (k = 0; k < MET_RESULTS; k++)
			if (t->cells[i * t->ncols + 1 + k].d > max)
				max = t->cells[i * t->ncols + 1 + k].d;
	http_reply_printf(r,
			  "<svg id=\"chart\" viewBox=\"0 0 600 150\" role=\"img\" "
			  "aria-label=\"decisions per second\">"
			  "<rect x=\"0\" y=\"0\" width=\"600\" height=\"150\" fill=\"#fff\" "
			  "stroke=\"#ddd\"/><text x=\"4\" y=\"12\" font-size=\"11\" fill=\"#555\">"
			  "%g/s</text>",
			  round(max * 1000) / 1000);
	if (t->nrows >= 2) {
		t0 = (double)t->cells[0].u;
		t1 = (double)t->cells[(t->nrows - 1) * t->ncols].u;
		http_reply_printf(r, "<text x=\"4\" y=\"146\" font-size=\"11\" fill=\"#555\">"
				     "-%gs</text><text x=\"596\" y=\"146\" font-size=\"11\" "
				     "fill=\"#555\" text-anchor=\"end\">now</text>", t1 - t0);
		for (k = 0; k < MET_RESULTS; k++) {
			http_reply_printf(r, "<polyline fill=\"none\" stroke=\"%s\" "
					     "stroke-width=\"1.5\" points=\"", col[k]);
			for (i = 0; i < t->nrows; i++) {
				const struct cell *c = &t->cells[i * t->ncols];

				http_reply_printf(r, "%s%.1f,%.1f", i ? " " : "",
						  ((double)c->u - t0) / (t1 - t0) * (W - 2) + 1,
						  H - 1 - c[1 + k].d / max * (H - 16));
			}
			http_reply_printf(r, "\"/>");
		}
	}
	http_reply_printf(r, "</svg><div class=\"legend\">");
	for (k = 0; k < MET_RESULTS; k++)
		http_reply_printf(r, "<span class=\"k%d\">&#9632; %s</span>", k, result_keys[k]);
	http_reply_printf(r, "</div>");
}

static void html_table(struct http_reply *r, const struct panel *p, const struct table *t)
{
	size_t i, c;

	http_reply_printf(r, "<h3>");
	status_html_str(r, t->title);
	http_reply_printf(r, "</h3><div class=\"tw\"><table data-t=\"%s.%s\"><thead><tr>", p->id,
			  t->key);
	for (c = 0; c < t->ncols; c++) {
		http_reply_printf(r, "<th data-c=\"%s\">", t->cols[c].key);
		status_html_str(r, t->cols[c].label);
		http_reply_printf(r, "</th>");
	}
	http_reply_printf(r, "</tr></thead><tbody>");
	for (i = 0; i < t->nrows; i++) {
		put(r, "<tr>");
		for (c = 0; c < t->ncols; c++) {
			const struct cell *cl = &t->cells[i * t->ncols + c];

			put(r, cl->t == CT_U64 || cl->t == CT_NUM ? "<td class=\"n\">" : "<td>");
			html_cell(r, cl);
			put(r, "</td>");
		}
		put(r, "</tr>");
	}
	if (!t->nrows)
		http_reply_printf(r, "<tr><td colspan=\"%zu\">none</td></tr>", t->ncols);
	http_reply_printf(r, "</tbody></table></div>");
}

static void html_panel(struct http_reply *r, const struct panel *p)
{
	size_t j;

	http_reply_printf(r, "<section id=\"%s\" data-a=\"%s\" class=\"%s%s\"><h2>", p->id, p->id,
			  p->alert ? "red" : "", p->wide ? " wide" : "");
	status_html_str(r, p->title);
	http_reply_printf(r, " <small>");
	status_html_str(r, p->hint);
	http_reply_printf(r, "</small></h2>");
	for (j = 0; j < p->ntables; j++)
		if (p->t[j].hidden)
			html_chart(r, &p->t[j]);
	http_reply_printf(r, "<dl>");
	for (j = 0; j < p->nfields; j++) {
		const struct field *f = &p->f[j];

		http_reply_printf(r, "<dt>");
		status_html_str(r, f->label);
		http_reply_printf(r, "</dt><dd data-k=\"%s.%s\">", p->id, f->key);
		html_cell(r, &f->v);
		http_reply_printf(r, "</dd>");
	}
	http_reply_printf(r, "</dl>");
	for (j = 0; j < p->ntables; j++)
		if (!p->t[j].hidden)
			html_table(r, p, &p->t[j]);
	http_reply_printf(r, "</section>");
}

/*
 * The first thing on the page: is it fine, and if not what is wrong, each cause
 * in words with the number that tripped it, since when, and a link to its
 * panel. The script rebuilds it from /status.json's "causes" the same way, and
 * says above it when the agent itself stops answering (#gone).
 */
static void html_causes(struct http_reply *r, const struct model *m)
{
	char since[32];
	size_t i;

	http_reply_printf(r, "<p id=\"gone\" hidden></p><div id=\"causes\" class=\"causes%s\">"
			     "<h2 id=\"verdict\">%s</h2><ul id=\"causelist\">",
			  m->ncauses ? " bad" : "",
			  m->ncauses ? "What is wrong" : "Nothing wrong: every panel is green");
	for (i = 0; i < m->ncauses; i++) {
		http_reply_printf(r, "<li><a href=\"#%s\">", m->causes[i].panel);
		status_html_str(r, m->causes[i].what);
		put(r, "</a>");
		if (m->causes[i].since > 0) {
			fmt_hms(m->causes[i].since, since, sizeof(since));
			http_reply_printf(r, " <small>since %s</small>", since);
		}
		put(r, "</li>");
	}
	http_reply_printf(r, "</ul></div><main>");
}

/*
 * Renders the status page: the whole snapshot in HTML (readable without
 * JavaScript), the inline style and script the CSP header allows, and sets
 * the reply's Content-Type and security headers.
 */
void status_render_html(const struct met_view *v, const struct status_info *si,
			struct http_reply *r)
{
	struct model m;
	size_t i;

	model_build(&m, v, si);
	http_reply_status(r, 200, "text/html; charset=utf-8");
	/* nosniff, no-referrer and no-store: the server's own, on every route */
	http_reply_header(r, "Content-Security-Policy", page_csp());
	http_reply_printf(r, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
			     "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
			     "<title>spoa-ratelimit status</title><style>%s</style></head><body>"
			     "<header><h1>spoa-ratelimit ",
			  page_css);
	status_html_str(r, si->version);
	http_reply_printf(r, "</h1><span id=\"state\" class=\"state%s\" data-k=\"state\">",
			  strcmp(m.state, "ok") != 0 ? " bad" : "");
	status_html_str(r, m.state);
	http_reply_printf(r, "</span><small>generation <span data-k=\"agent.generation\">%llu"
			     "</span> &middot; <span id=\"live\">snapshot</span> &middot; "
			     "<a href=\"status.json\">JSON</a> &middot; "
			     "<a href=\"metrics\">metrics</a></small></header>",
			  (unsigned long long)v->max[MC_GENERATION]);
	html_causes(r, &m);
	for (i = 0; i < P_COUNT; i++)
		html_panel(r, &m.p[i]);
	http_reply_printf(r, "</main><script>%s</script></body></html>\n", page_js);
	model_free(&m);
}
