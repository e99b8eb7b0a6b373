/* SPDX-License-Identifier: MIT */
/*
 * Metrics in shared memory, rendered as Prometheus text and as /top JSON.
 *
 * DESIGN
 * One region (mmap MAP_SHARED|MAP_ANONYMOUS) holds a header and one slot per
 * worker. A worker is the only writer of its slot; readers (the worker that
 * answers a scrape) see values that are at most one update old, which is what
 * Prometheus counters tolerate. New rows are filled before the row count that
 * publishes them is raised (release store), so a reader never sees a half
 * written name. A slot whose worker died keeps its values until the restarted
 * worker attaches to it: counters may then go back, which Prometheus treats as
 * a counter reset.
 */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

struct metrics {
	unsigned nslots;
	size_t size;                    /* bytes mapped */
	int64_t started;                /* Unix seconds: made by the agent's first process */
	size_t hist_next;               /* where the next point of hist goes */
	size_t nhist;                   /* points in hist (release store) */
	struct met_point hist[MET_HIST]; /* written by worker 0's slot only */
	struct met_slot slots[];
};

/*
 * Maps the shared region for <workers> slots (call before forking). Returns
 * NULL only if the mapping fails.
 */
struct metrics *metrics_new(unsigned workers)
{
	size_t size;
	struct metrics *m;

	if (workers < 1)
		workers = 1;
	if (workers > MET_WORKERS_MAX)
		workers = MET_WORKERS_MAX;
	size = sizeof(*m) + workers * sizeof(struct met_slot);
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	m->nslots = workers;
	m->size = size;
	m->started = (int64_t)time(NULL);
	return m;
}

void metrics_free(struct metrics *m)
{
	if (m)
		munmap(m, m->size);
}

/* Claims slot <worker> for the calling process, starting from zero. */
struct met_slot *metrics_attach(struct metrics *m, unsigned worker)
{
	struct met_slot *s = &m->slots[worker < m->nslots ? worker : 0];

	memset(s, 0, sizeof(*s));
	prom_hist_init_latency(&s->decision_lat);
	prom_hist_init_latency(&s->redis_lat);
	__atomic_store_n(&s->pid, getpid(), __ATOMIC_RELEASE);
	return s;
}

static void copy_name(char *dst, const char *src)
{
	snprintf(dst, MET_NAME, "%s", src ? src : "");
}

/* Counts one decision of tier <tier> decided by <rule> with <result>. */
void metrics_decision(struct met_slot *s, const char *tier, const char *rule, int result)
{
	struct met_row *row = NULL;
	size_t i;

	tier = tier ? tier : "";
	rule = rule ? rule : "";
	for (i = 0; i < s->nrows; i++) {
		if (strncmp(s->rows[i].tier, tier, MET_NAME - 1) == 0 &&
		    strncmp(s->rows[i].rule, rule, MET_NAME - 1) == 0) {
			row = &s->rows[i];
			break;
		}
	}
	if (!row) {
		if (s->nrows == MET_ROWS) {
			s->c[MC_ROWS_OVERFLOW]++;
			return;
		}
		row = &s->rows[s->nrows];
		memset(row, 0, sizeof(*row));
		copy_name(row->tier, tier);
		copy_name(row->rule, rule);
		__atomic_store_n(&s->nrows, s->nrows + 1, __ATOMIC_RELEASE);
	}
	switch (result) {
	case MR_ALLOWED:
		row->allowed++;
		break;
	case MR_DENIED:
		row->denied++;
		break;
	case MR_SHADOW_DENIED:
		row->shadow_denied++;
		break;
	case MR_LOCAL:
		row->local++;
		break;
	default:
		row->degraded++;
		break;
	}
}

/*
 * Counts one verdict of the candidate policy for tier <tier>: <rule> is the
 * candidate rule that would deny (MCR_WOULD_DENY, MCR_NEW_DENIAL), the
 * enforced rule that denied (MCR_LIFTED), or "-" (MCR_WOULD_ALLOW).
 */
void metrics_candidate(struct met_slot *s, const char *tier, const char *rule, int result)
{
	bool enforced = result == MCR_LIFTED;
	struct met_cand_row *row = NULL;
	size_t i;

	tier = tier ? tier : "";
	rule = rule ? rule : "";
	for (i = 0; i < s->ncand; i++) {
		if (s->cand[i].enforced == enforced &&
		    strncmp(s->cand[i].tier, tier, MET_NAME - 1) == 0 &&
		    strncmp(s->cand[i].rule, rule, MET_NAME - 1) == 0) {
			row = &s->cand[i];
			break;
		}
	}
	if (!row) {
		if (s->ncand == MET_CAND_ROWS) {
			s->c[MC_ROWS_OVERFLOW]++;
			return;
		}
		row = &s->cand[s->ncand];
		memset(row, 0, sizeof(*row));
		copy_name(row->tier, tier);
		copy_name(row->rule, rule);
		row->enforced = enforced;
		__atomic_store_n(&s->ncand, s->ncand + 1, __ATOMIC_RELEASE);
	}
	switch (result) {
	case MCR_WOULD_ALLOW:
		row->would_allow++;
		break;
	case MCR_WOULD_DENY:
		row->would_deny++;
		break;
	case MCR_NEW_DENIAL:
		row->new_denials++;
		break;
	default:
		row->lifted++;
		break;
	}
}

/*
 * The top-offender record of <rule> in slot <s> (created), or NULL when full;
 * a candidate's rules (MET_CAND_TOP) take at most half of the records.
 */
struct met_top *metrics_top(struct met_slot *s, const char *rule)
{
	struct met_top *t;
	size_t i, pl = strlen(MET_CAND_TOP), ncand = 0;
	bool cand = strncmp(rule, MET_CAND_TOP, pl) == 0;

	for (i = 0; i < s->ntop; i++) {
		if (strncmp(s->top[i].rule, rule, MET_NAME - 1) == 0)
			return &s->top[i];
		ncand += strncmp(s->top[i].rule, MET_CAND_TOP, pl) == 0;
	}
	if (s->ntop == MET_TOP_RULES)
		return NULL;
	/* a candidate policy never takes more than half: the rules in force
	 * keep room for their top offenders, what an incident needs */
	if (cand && ncand >= MET_TOP_RULES / 2)
		return NULL;
	t = &s->top[s->ntop];
	memset(t, 0, sizeof(*t));
	copy_name(t->rule, rule);
	__atomic_store_n(&s->ntop, s->ntop + 1, __ATOMIC_RELEASE);
	return t;
}

static bool slot_live(const struct met_slot *s)
{
	return __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0;
}

/* ---------------------------------------------------------------- merging */

static int cmp_entry(const void *a, const void *b)
{
	const struct topk_entry *x = a, *y = b;

	if (x->count != y->count)
		return x->count < y->count ? 1 : -1;
	return strcmp(x->item, y->item);
}

/*
 * Merges the top-offender snapshots of every live slot, per rule (to be freed
 * with free_tops()). Each rule's entries are allocated for the workers there
 * are, not for MET_WORKERS_MAX: a scrape touches what it uses.
 */
static size_t merge_tops(const struct metrics *m, struct met_merged_top **out)
{
	struct met_merged_top *mt = xcalloc(MET_TOP_RULES, sizeof(*mt));
	size_t n = 0, w, i, j, k, cap = MET_TOP_SNAP * m->nslots;

	for (w = 0; w < m->nslots; w++) {
		const struct met_slot *s = &m->slots[w];
		size_t ntop;

		if (!slot_live(s))
			continue;
		ntop = __atomic_load_n(&s->ntop, __ATOMIC_ACQUIRE);
		for (i = 0; i < ntop; i++) {
			const struct met_top *t = &s->top[i];
			struct met_merged_top *d = NULL;

			for (j = 0; j < n; j++)
				if (strcmp(mt[j].rule, t->rule) == 0)
					d = &mt[j];
			if (!d) {
				if (n == MET_TOP_RULES)
					continue;
				d = &mt[n++];
				memcpy(d->rule, t->rule, MET_NAME);
				d->e = xmalloc(cap * sizeof(*d->e));
			}
			d->denied += t->denied;
			hll_merge(&d->hll, &t->hll);
			if (!d->n) {
				/* the first worker's list: its items are distinct already */
				d->n = t->n < MET_TOP_SNAP ? t->n : MET_TOP_SNAP;
				memcpy(d->e, t->top, d->n * sizeof(*d->e));
				continue;
			}
			for (j = 0; j < t->n && j < MET_TOP_SNAP; j++) {
				for (k = 0; k < d->n; k++) {
					if (strcmp(d->e[k].item, t->top[j].item) == 0) {
						d->e[k].count += t->top[j].count;
						d->e[k].error += t->top[j].error;
						break;
					}
				}
				if (k == d->n && d->n < cap)
					d->e[d->n++] = t->top[j];
			}
		}
	}
	for (j = 0; j < n; j++) {
		qsort(mt[j].e, mt[j].n, sizeof(mt[j].e[0]), cmp_entry);
		if (mt[j].n > MET_TOP_K)
			mt[j].n = MET_TOP_K;
	}
	*out = mt;
	return n;
}

static void free_tops(struct met_merged_top *mt, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		free(mt[i].e);
	free(mt);
}

/* ---------------------------------------------------------------- rendering */

static void sum_counter(const struct metrics *m, enum met_counter c, uint64_t *out)
{
	unsigned w;

	*out = 0;
	for (w = 0; w < m->nslots; w++)
		if (slot_live(&m->slots[w]))
			*out += m->slots[w].c[c];
}

static void family_u64(struct http_reply *r, const struct metrics *m, const char *name,
		       enum prom_type type, const char *help, enum met_counter c)
{
	uint64_t v;

	sum_counter(m, c, &v);
	prom_family(r, name, type, help);
	prom_sample_u64(r, name, NULL, 0, v);
}

/* The highest value of gauge <c> among the live workers. */
static uint64_t max_counter(const struct metrics *m, enum met_counter c)
{
	uint64_t v = 0;
	size_t w;

	for (w = 0; w < m->nslots; w++)
		if (slot_live(&m->slots[w]) && m->slots[w].c[c] > v)
			v = m->slots[w].c[c];
	return v;
}

/* One labelled sample of a counter family. */
struct labelled {
	const char *value;              /* the label's value */
	enum met_counter c;
};

/* Samples <name>{<label>=<t[i].value>} for the <n> counters of <t>, summed. */
static void samples_u64(struct http_reply *r, const struct metrics *m, const char *name,
			const char *label, const struct labelled *t, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		struct prom_label l = {label, t[i].value};
		uint64_t v;

		sum_counter(m, t[i].c, &v);
		prom_sample_u64(r, name, &l, 1, v);
	}
}

/* The name of rule <t> without the candidate prefix, or NULL when <t> is not <cand>'s. */
static const char *top_rule(const char *t, bool cand)
{
	size_t pl = strlen(MET_CAND_TOP);
	bool is_cand = strncmp(t, MET_CAND_TOP, pl) == 0;

	return is_cand != cand ? NULL : (cand ? t + pl : t);
}

/*
 * Distinct denied clients and top offenders per rule: of the enforced rules,
 * or of the candidate's (<cand>: families spoa_ratelimit_candidate_*).
 */
static void render_tops(struct http_reply *r, const struct met_merged_top *mt, size_t ntop, bool cand)
{
	const char *dc = cand ? "spoa_ratelimit_candidate_denied_clients"
			      : "spoa_ratelimit_denied_clients";
	const char *td = cand ? "spoa_ratelimit_candidate_top_denied" : "spoa_ratelimit_top_denied";
	size_t i, j;

	prom_family(r, dc, PROM_GAUGE,
		    cand ? "Distinct clients the candidate policy would deny, by candidate rule "
			   "(HyperLogLog estimate)."
			 : "Distinct clients denied by a rule (HyperLogLog estimate).");
	for (j = 0; j < ntop; j++) {
		const char *rule = top_rule(mt[j].rule, cand);
		struct prom_label l = {"rule", rule};

		if (rule)
			prom_sample_u64(r, dc, &l, 1, hll_count(&mt[j].hll));
	}
	prom_family(r, td, PROM_GAUGE,
		    cand ? "Would-be denials of the heaviest clients the candidate policy would "
			   "deny, per candidate rule (space-saving top-K, as real denials)."
			 : "Denials of the heaviest denied clients per rule (space-saving top-K; "
			   "the client is a key fingerprint or an address prefix).");
	for (j = 0; j < ntop; j++) {
		const char *rule = top_rule(mt[j].rule, cand);

		for (i = 0; rule && i < mt[j].n; i++) {
			char rank[24];
			struct prom_label l[3] = {{"rule", rule},
						  {"rank", rank},
						  {"client", mt[j].e[i].item}};

			snprintf(rank, sizeof(rank), "%zu", i + 1);
			prom_sample_u64(r, td, l, 3, mt[j].e[i].count);
		}
	}
}

/* The candidate policy's verdicts, summed over the live workers (<*n> rows, to be freed). */
static struct met_cand_row *merge_cand(const struct metrics *m, size_t *n_out)
{
	struct met_cand_row *rows = xcalloc(MET_CAND_ROWS * m->nslots, sizeof(*rows));
	size_t nrows = 0, i, j;
	unsigned w;

	for (w = 0; w < m->nslots; w++) {
		const struct met_slot *s = &m->slots[w];
		size_t n;

		if (!slot_live(s))
			continue;
		n = __atomic_load_n(&s->ncand, __ATOMIC_ACQUIRE);
		for (i = 0; i < n; i++) {
			const struct met_cand_row *src = &s->cand[i];

			for (j = 0; j < nrows; j++)
				if (rows[j].enforced == src->enforced &&
				    strcmp(rows[j].tier, src->tier) == 0 &&
				    strcmp(rows[j].rule, src->rule) == 0)
					break;
			if (j == nrows) {
				rows[nrows++] = (struct met_cand_row){0};
				memcpy(rows[j].tier, src->tier, MET_NAME);
				memcpy(rows[j].rule, src->rule, MET_NAME);
				rows[j].enforced = src->enforced;
			}
			rows[j].would_allow += src->would_allow;
			rows[j].would_deny += src->would_deny;
			rows[j].new_denials += src->new_denials;
			rows[j].lifted += src->lifted;
		}
	}
	*n_out = nrows;
	return rows;
}

/* The candidate policy's verdicts, summed over the live workers. */
static void render_candidate(const struct metrics *m, struct http_reply *r)
{
	size_t nrows, j;
	struct met_cand_row *rows = merge_cand(m, &nrows);

	prom_family(r, "spoa_ratelimit_candidate_decisions_total", PROM_COUNTER,
		    "Verdicts of the candidate policy (never enforced), by candidate tier and "
		    "the candidate rule that would deny (\"-\" when it would allow).");
	for (j = 0; j < nrows; j++) {
		static const char *const res[2] = {"would_allow", "would_deny"};
		uint64_t v[2] = {rows[j].would_allow, rows[j].would_deny};
		int k;

		for (k = 0; k < 2; k++) {
			struct prom_label l[3] = {{"tier", rows[j].tier},
						  {"rule", rows[j].rule},
						  {"result", res[k]}};

			if (v[k])
				prom_sample_u64(r, "spoa_ratelimit_candidate_decisions_total", l, 3,
						v[k]);
		}
	}
	prom_family(r, "spoa_ratelimit_candidate_changes_total", PROM_COUNTER,
		    "Requests the two policies decide differently: new_denial = the candidate "
		    "rule would deny what is allowed today; lifted_denial = the enforced rule "
		    "denies what the candidate would allow.");
	for (j = 0; j < nrows; j++) {
		struct prom_label l[3] = {{"tier", rows[j].tier},
					  {"rule", rows[j].rule},
					  {"change", rows[j].enforced ? "lifted_denial" : "new_denial"}};
		uint64_t v = rows[j].enforced ? rows[j].lifted : rows[j].new_denials;

		if (v)
			prom_sample_u64(r, "spoa_ratelimit_candidate_changes_total", l, 3, v);
	}
	family_u64(r, m, "spoa_ratelimit_candidate_unevaluated_total", PROM_COUNTER,
		   "Decisions made without the candidate's verdict (a Redis call failed, or "
		   "answered without Redis).",
		   MC_CAND_UNEVALUATED);
	free(rows);
}

/* ---------------------------------------------------------------- /metrics */

/* The live workers' slots merged: the decision rows, the histograms, the counts by reason. */
struct merged {
	struct met_row *rows;           /* owned: nrows of them */
	size_t nrows;
	struct prom_hist dl, rl;        /* decision and Redis latencies */
	uint64_t deg[STORE_COUNT];      /* degraded answers by reason */
	uint64_t errs[SPOP_ST_RES + 1]; /* AGENT-DISCONNECTs by status */
	unsigned live;                  /* workers reporting */
};

/* Merges the live slots of <m> into <mg> (mg->rows to be freed). */
static void merge_slots(const struct metrics *m, struct merged *mg)
{
	struct met_row *rows = xcalloc(MET_ROWS * m->nslots, sizeof(*rows));
	size_t nrows = 0, i, j;
	unsigned w;

	memset(mg, 0, sizeof(*mg));
	prom_hist_init_latency(&mg->dl);
	prom_hist_init_latency(&mg->rl);
	for (w = 0; w < m->nslots; w++) {
		const struct met_slot *s = &m->slots[w];
		size_t n;

		if (!slot_live(s))
			continue;
		mg->live++;
		prom_hist_merge(&mg->dl, &s->decision_lat);
		prom_hist_merge(&mg->rl, &s->redis_lat);
		for (i = 0; i < STORE_COUNT; i++)
			mg->deg[i] += s->degraded[i];
		for (i = 0; i <= SPOP_ST_RES; i++)
			mg->errs[i] += s->spop_errors[i];
		n = __atomic_load_n(&s->nrows, __ATOMIC_ACQUIRE);
		for (i = 0; i < n; i++) {
			const struct met_row *src = &s->rows[i];

			for (j = 0; j < nrows; j++)
				if (strcmp(rows[j].tier, src->tier) == 0 &&
				    strcmp(rows[j].rule, src->rule) == 0)
					break;
			if (j == nrows)
				rows[nrows++] = (struct met_row){0};
			memcpy(rows[j].tier, src->tier, MET_NAME);
			memcpy(rows[j].rule, src->rule, MET_NAME);
			rows[j].allowed += src->allowed;
			rows[j].denied += src->denied;
			rows[j].shadow_denied += src->shadow_denied;
			rows[j].degraded += src->degraded;
			rows[j].local += src->local;
		}
	}
	mg->rows = rows;
	mg->nrows = nrows;
}

/* Decisions by tier, rule and result; degraded ones by reason; the two latencies. */
static void render_decisions(struct http_reply *r, const struct merged *mg)
{
	static const char *const results[MR_COUNT] = {"allowed", "denied", "shadow_denied",
						      "degraded", "local"};
	size_t i, j;

	prom_family(r, "spoa_ratelimit_decisions_total", PROM_COUNTER,
		    "Decisions by tier, deciding rule and result.");
	for (j = 0; j < mg->nrows; j++) {
		const struct met_row *row = &mg->rows[j];
		uint64_t v[MR_COUNT] = {row->allowed, row->denied, row->shadow_denied,
					row->degraded, row->local};
		int k;

		for (k = 0; k < MR_COUNT; k++) {
			struct prom_label l[3] = {{"tier", row->tier},
						  {"rule", row->rule},
						  {"result", results[k]}};

			if (v[k])
				prom_sample_u64(r, "spoa_ratelimit_decisions_total", l, 3, v[k]);
		}
	}
	prom_family(r, "spoa_ratelimit_degraded_total", PROM_COUNTER,
		    "Decisions Redis could not make, by reason (answered by the failure ladder).");
	for (i = 0; i < STORE_COUNT; i++) {
		struct prom_label l = {"reason", store_status_str((int)i)};

		if (i != STORE_OK)
			prom_sample_u64(r, "spoa_ratelimit_degraded_total", &l, 1, mg->deg[i]);
	}
	prom_family(r, "spoa_ratelimit_decision_seconds", PROM_HISTOGRAM,
		    "Time from NOTIFY to ACK inside the agent.");
	prom_hist_render(r, "spoa_ratelimit_decision_seconds", NULL, 0, &mg->dl);
	prom_family(r, "spoa_ratelimit_redis_seconds", PROM_HISTOGRAM,
		    "Round trip of one script call to Redis.");
	prom_hist_render(r, "spoa_ratelimit_redis_seconds", NULL, 0, &mg->rl);
}

/* AGENT-DISCONNECT frames by status: those seen, and always 0 (normal), 3 and 4. */
static void render_spop_errors(struct http_reply *r, const struct merged *mg)
{
	size_t i;

	prom_family(r, "spoa_ratelimit_spop_errors_total", PROM_COUNTER,
		    "AGENT-DISCONNECT frames sent, by SPOP status.");
	for (i = 0; i <= SPOP_ST_RES; i++) {
		char st[24];
		struct prom_label l = {"status", st};

		snprintf(st, sizeof(st), "%zu", i);
		if (mg->errs[i] || i == SPOP_ST_NORMAL || i == SPOP_ST_TOO_BIG ||
		    i == SPOP_ST_INVALID)
			prom_sample_u64(r, "spoa_ratelimit_spop_errors_total", &l, 1, mg->errs[i]);
	}
}

/*
 * A family made of counters alone: one counter summed over the workers, or
 * its highest value among them (max), or one summed counter per value of a
 * label (label, values).
 */
struct family {
	const char *name;
	enum prom_type type;
	const char *help;
	enum met_counter c;             /* unless labelled */
	bool max;                       /* the highest value, not the sum */
	const char *label;              /* NULL: one sample, of c */
	const struct labelled *values;  /* the label's values and their counters */
	size_t nvalues;
};

#define FAM_SUM(n, t, h, c)           {(n), (t), (h), (c), false, NULL, NULL, 0}
#define FAM_MAX(n, h, c)              {(n), PROM_GAUGE, (h), (c), true, NULL, NULL, 0}
#define FAM_LABELLED(n, t, h, l, v)   {(n), (t), (h), MC_COUNT, false, (l), (v), ARRAY_SIZE(v)}

static void render_families(struct http_reply *r, const struct metrics *m,
			    const struct family *f, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++, f++) {
		if (f->label) {
			prom_family(r, f->name, f->type, f->help);
			samples_u64(r, m, f->name, f->label, f->values, f->nvalues);
		} else if (f->max) {
			prom_family(r, f->name, f->type, f->help);
			prom_sample_u64(r, f->name, NULL, 0, max_counter(m, f->c));
		} else {
			family_u64(r, m, f->name, f->type, f->help, f->c);
		}
	}
}

static const struct labelled spop_frames[] = {{"hello", MC_HELLOS},
					      {"healthcheck", MC_HEALTHCHECKS},
					      {"notify", MC_NOTIFY},
					      {"ack", MC_ACKS},
					      {"haproxy_disconnect", MC_HAPROXY_DISCONNECTS}};

/* The SPOP connections and frames, before their errors. */
static const struct family spop_families[] = {
	FAM_SUM("spoa_ratelimit_spop_connections", PROM_GAUGE,
		"SPOP connections from HAProxy open now.", MC_CONNS),
	FAM_SUM("spoa_ratelimit_spop_connections_total", PROM_COUNTER,
		"SPOP connections accepted.", MC_ACCEPTED),
	FAM_LABELLED("spoa_ratelimit_spop_frames_total", PROM_COUNTER, "SPOP frames by type.",
		     "type", spop_frames),
};

static const struct labelled spop_closed[] = {{"evicted", MC_SPOP_EVICTED},
					      {"idle_timeout", MC_SPOP_IDLE_TIMEOUTS},
					      {"refused", MC_SPOP_REFUSED}};
static const struct labelled fallback_outcomes[] = {{"open", MC_FB_OPEN},
						    {"local_allowed", MC_FB_LOCAL_ALLOWED},
						    {"local_denied", MC_FB_LOCAL_DENIED},
						    {"closed", MC_FB_CLOSED}};
static const struct labelled post_outcomes[] = {{"charged", MC_POST_CHARGED},
						{"refunded", MC_POST_REFUNDED},
						{"unchanged", MC_POST_UNCHANGED},
						{"absent", MC_POST_ABSENT},
						{"invalid", MC_POST_INVALID},
						{"failed", MC_POST_FAILED}};
static const struct labelled quota_requests[] = {
	{"leased", MC_LEASE_UNITS},          {"lease_spent", MC_LEASE_SPENT},
	{"lease_expired", MC_LEASE_EXPIRED}, {"lease_returned", MC_LEASE_RETURNED},
	{"prechecked", MC_PRECHECK_LOCAL},
	{"precheck_over", MC_PRECHECK_OVER}, {"report_lost", MC_REPORT_LOST},
	{"coalesced", MC_COALESCED},         {"undone", MC_UNDONE},
	{"untracked", MC_QUOTA_FULL}};
static const struct labelled quota_errors[] = {{"under", MC_LEASE_EXPIRED},
					       {"over", MC_PRECHECK_OVER}};
static const struct labelled redis_errors[] = {
	{"oom", MC_REDIS_ERR_OOM},         {"busy", MC_REDIS_ERR_BUSY},
	{"loading", MC_REDIS_ERR_LOADING}, {"readonly", MC_REDIS_ERR_READONLY},
	{"other", MC_REDIS_ERR_OTHER},     {"protocol", MC_REDIS_ERR_PROTOCOL}};
static const struct labelled local_keys[] = {{"memory", MC_MEMORY_KEYS},
					     {"fallback", MC_LOCAL_KEYS}};
static const struct labelled heap[] = {{"in_use", MC_HEAP_IN_USE}, {"free", MC_HEAP_FREE}};
static const struct labelled reloads[] = {{"ok", MC_RELOADS_OK}, {"failed", MC_RELOADS_FAILED}};

/* Every other family of counters, in the order of the exposition. */
static const struct family families[] = {
	FAM_SUM("spoa_ratelimit_spop_stale_total", PROM_COUNTER,
		"NOTIFYs older than spoe_timeout when read (HAProxy had given up on them), "
		"answered with an empty ACK without a decision.", MC_SPOP_STALE),
	FAM_LABELLED("spoa_ratelimit_spop_connections_closed_total", PROM_COUNTER,
		     "SPOP connections closed by the agent to stay available, by reason.",
		     "reason", spop_closed),
	FAM_SUM("spoa_ratelimit_http_connections_evicted_total", PROM_COUNTER,
		"Idle metrics connections closed to admit a new one.", MC_HTTP_EVICTED),
	FAM_SUM("spoa_ratelimit_orphans_total", PROM_COUNTER,
		"Decisions completed after HAProxy closed their connection.", MC_ORPHANS),
	FAM_SUM("spoa_ratelimit_refunds_total", PROM_COUNTER,
		"Charges taken back after a decision split over two calls was denied.",
		MC_REFUNDS),
	FAM_SUM("spoa_ratelimit_refunds_lost_total", PROM_COUNTER,
		"Refunds whose Redis call failed (shed, timed out, Redis down): the charge stays.",
		MC_REFUNDS_LOST),
	FAM_SUM("spoa_ratelimit_concurrency_released_total", PROM_COUNTER,
		"Concurrency slots given back by responses (the post-charge message's slot).",
		MC_CONC_RELEASED),
	FAM_SUM("spoa_ratelimit_concurrency_release_lost_total", PROM_COUNTER,
		"Slots given back whose Redis call failed: held until their lease (max_duration) "
		"ends.",
		MC_CONC_RELEASE_LOST),
	FAM_SUM("spoa_ratelimit_concurrency_slots_held", PROM_GAUGE,
		"Concurrency slots the requests this agent admitted hold (given back by their "
		"responses, or by a clean stop).",
		MC_CONC_HELD),
	FAM_SUM("spoa_ratelimit_local_decisions_total", PROM_COUNTER,
		"Decisions made by local fallback limits while Redis failed.",
		MC_LOCAL_DECISIONS),
	FAM_LABELLED("spoa_ratelimit_fallback_decisions_total", PROM_COUNTER,
		     "Decisions Redis could not make, by what the failure ladder answered.",
		     "outcome", fallback_outcomes),
	FAM_SUM("spoa_ratelimit_invalid_costs_total", PROM_COUNTER,
		"Costs from HAProxy that were not an integer in 0..1000000 (charged 1000000).",
		MC_INVALID_COSTS),
	FAM_LABELLED("spoa_ratelimit_post_charges_total", PROM_COUNTER,
		     "Response costs (post-charges), by what became of them.", "outcome",
		     post_outcomes),
	FAM_SUM("spoa_ratelimit_post_charge_clamped_total", PROM_COUNTER,
		"Response costs above post_charge.max (charged the max).", MC_POST_CLAMPED),
	FAM_SUM("spoa_ratelimit_no_address_total", PROM_COUNTER,
		"Anonymous requests without a source address (anonymous.without_address).",
		MC_NO_ADDRESS),
	FAM_SUM("spoa_ratelimit_blocked_cache_hits_total", PROM_COUNTER,
		"Denials answered locally, without Redis, until their Retry-After.",
		MC_BLOCKED_HITS),
	FAM_SUM("spoa_ratelimit_override_blocked_total", PROM_COUNTER,
		"Requests denied by a block override (rule \"blocked\"), without Redis.",
		MC_OVR_BLOCKED),
	FAM_SUM("spoa_ratelimit_override_limited_total", PROM_COUNTER,
		"Decisions made with limits changed by a limit override.", MC_OVR_LIMITED),
	FAM_MAX("spoa_ratelimit_override_entries",
		"Override entries loaded from Redis (the largest count among workers).",
		MC_OVR_ENTRIES),
	FAM_SUM("spoa_ratelimit_override_loads_total", PROM_COUNTER,
		"Override tables loaded (the version in Redis changed).", MC_OVR_LOADS),
	FAM_SUM("spoa_ratelimit_override_skipped_total", PROM_COUNTER,
		"Override entries skipped: not parsable, or beyond overrides.max_entries.",
		MC_OVR_SKIPPED),
	FAM_SUM("spoa_ratelimit_override_poll_errors_total", PROM_COUNTER,
		"Override version checks or loads that failed (the loaded table stays).",
		MC_OVR_POLL_ERRORS),
	FAM_SUM("spoa_ratelimit_lease_grants_total", PROM_COUNTER,
		"Redis calls that granted a lease of tokens to spend locally.", MC_LEASE_GRANTS),
	FAM_LABELLED("spoa_ratelimit_local_quota_requests_total", PROM_COUNTER,
		     "Requests (units) handled by local quotas, by what happened to them.", "what",
		     quota_requests),
	FAM_LABELLED("spoa_ratelimit_local_quota_error_requests_total", PROM_COUNTER,
		     "Admission error attributable to local quotas, in requests: under = leased "
		     "tokens that expired unused, over = pre-checked requests Redis could not fit.",
		     "direction", quota_errors),
	FAM_SUM("spoa_ratelimit_precheck_reports_total", PROM_COUNTER,
		"Batches of pre-checked usage reported to Redis.", MC_PRECHECK_REPORTS),
	FAM_SUM("spoa_ratelimit_precheck_report_failures_total", PROM_COUNTER,
		"Reports that failed (reported again after an error reply; after a timeout "
		"or a lost connection the script may have run: counted as report_lost).",
		MC_REPORT_FAILED),
	FAM_SUM("spoa_ratelimit_local_quota_keys", PROM_GAUGE,
		"Keys tracked for leases, pre-checks and coalescing.", MC_QUOTA_KEYS),
	FAM_SUM("spoa_ratelimit_lease_outstanding", PROM_GAUGE,
		"Leased requests held locally, not spent yet.", MC_LEASE_OUTSTANDING),
	FAM_SUM("spoa_ratelimit_precheck_unreported", PROM_GAUGE,
		"Pre-checked requests not reported to Redis yet.", MC_UNREPORTED),
	FAM_MAX("spoa_ratelimit_gateways",
		"Live gateways (agent processes) counted by the heartbeats in Redis, 0 before "
		"the first.", MC_GATEWAYS),
	FAM_MAX("spoa_ratelimit_fallback_gateways",
		"Gateways a local fallback limit divides its rate by: fallback.gateways, or with "
		"\"auto\" the live gateways last counted (1 before the first).",
		MC_FALLBACK_GATEWAYS),
	FAM_MAX("spoa_ratelimit_fallback_gateways_auto",
		"1 when fallback.gateways is \"auto\" (the live count), 0 when configured.",
		MC_FALLBACK_GATEWAYS_AUTO),
	FAM_SUM("spoa_ratelimit_tier_cache_hits_total", PROM_COUNTER,
		"Tier lookups answered by the local cache.", MC_TIER_HITS),
	FAM_SUM("spoa_ratelimit_tier_cache_misses_total", PROM_COUNTER,
		"Tier lookups sent to Redis.", MC_TIER_MISSES),
	FAM_SUM("spoa_ratelimit_redis_commands_total", PROM_COUNTER,
		"Commands sent to Redis.", MC_REDIS_SENT),
	FAM_SUM("spoa_ratelimit_redis_late_replies_total", PROM_COUNTER,
		"Replies that arrived after their deadline (discarded).", MC_REDIS_LATE),
	FAM_SUM("spoa_ratelimit_redis_pending", PROM_GAUGE,
		"Commands in flight to Redis.", MC_REDIS_PENDING),
	FAM_MAX("spoa_ratelimit_redis_oldest_unanswered_ms",
		"Age in milliseconds of the oldest command a Redis node has not answered, "
		"across reconnections it left unanswered (0: nothing owed); a frozen Redis "
		"makes it grow while the latency histograms, made of replies, see nothing.",
		MC_REDIS_OLDEST_MS),
	FAM_SUM("spoa_ratelimit_redis_breaker_open", PROM_GAUGE,
		"Workers whose Redis circuit breaker is open.", MC_BREAKER_OPEN),
	FAM_SUM("spoa_ratelimit_redis_down", PROM_GAUGE,
		"Workers with a Redis node down: a connection refused, timed out, failed "
		"(TLS, AUTH, SCRIPT LOAD) or lost, and none ready since.",
		MC_REDIS_DOWN),
	FAM_SUM("spoa_ratelimit_redis_breaker_opened_total", PROM_COUNTER,
		"Times a circuit breaker opened.", MC_BREAKER_OPENED),
	FAM_SUM("spoa_ratelimit_redis_concurrency_limit", PROM_GAUGE,
		"Adaptive limits on commands in flight, summed over Redis nodes and workers.",
		MC_REDIS_CONCURRENCY),
	FAM_SUM("spoa_ratelimit_redis_queued", PROM_GAUGE,
		"Commands waiting for room under the concurrency limit.", MC_REDIS_QUEUED),
	FAM_SUM("spoa_ratelimit_redis_shed_total", PROM_COUNTER,
		"Commands not sent within their queue budget (answered by the failure ladder, "
		"reason overload).",
		MC_REDIS_SHED),
	FAM_SUM("spoa_ratelimit_redis_batch_calls_total", PROM_COUNTER,
		"Script calls that carried several decisions (redis.batch_max).",
		MC_REDIS_BATCH_CALLS),
	FAM_SUM("spoa_ratelimit_redis_batched_decisions_total", PROM_COUNTER,
		"Decisions sent in those calls.", MC_REDIS_BATCHED),
	FAM_SUM("spoa_ratelimit_redis_cross_slot_calls_total", PROM_COUNTER,
		"Of those calls, in a cluster, those over several hash slots of one master.",
		MC_REDIS_CROSS_SLOT),
	FAM_SUM("spoa_ratelimit_redis_cross_slot_solo_total", PROM_COUNTER,
		"Decisions a cross-slot call found on another node, sent again alone.",
		MC_REDIS_CROSS_SOLO),
	FAM_LABELLED("spoa_ratelimit_redis_errors_total", PROM_COUNTER,
		     "Redis error replies (and replies of the wrong shape), by class; protocol: connections closed on malformed RESP or a reply past redis.max_reply_*.", "class",
		     redis_errors),
	FAM_LABELLED("spoa_ratelimit_local_keys", PROM_GAUGE,
		     "Entries kept in process memory, by store.", "store", local_keys),
	FAM_LABELLED("spoa_ratelimit_heap_bytes", PROM_GAUGE,
		     "Workers' heap as their C library counts it, summed, sampled every 5 s: "
		     "in_use = allocated (live state, and what is kept for reuse), free = freed "
		     "but held by the allocator. RSS keeps the high-water mark of their sum; a "
		     "leak is in_use growing under steady traffic.",
		     "state", heap),
	FAM_MAX("spoa_ratelimit_config_generation",
		"Generation of the configuration in force (highest among workers).",
		MC_GENERATION),
	FAM_LABELLED("spoa_ratelimit_reloads_total", PROM_COUNTER, "Reloads by result.", "result",
		     reloads),
	FAM_SUM("spoa_ratelimit_metric_rows_overflow_total", PROM_COUNTER,
		"Decisions not counted by tier and rule because the row table was full.",
		MC_ROWS_OVERFLOW),
};

/*
 * Renders every metric, summed over the live workers, in the Prometheus text
 * exposition format.
 */
void metrics_render(const struct metrics *m, struct http_reply *r)
{
	struct met_merged_top *mt;
	struct merged mg;
	size_t ntop;

	merge_slots(m, &mg);
	render_decisions(r, &mg);
	render_families(r, m, spop_families, ARRAY_SIZE(spop_families));
	render_spop_errors(r, &mg);
	render_families(r, m, families, ARRAY_SIZE(families));
	prom_family(r, "spoa_ratelimit_workers", PROM_GAUGE, "Worker processes reporting.");
	prom_sample_u64(r, "spoa_ratelimit_workers", NULL, 0, mg.live);

	ntop = merge_tops(m, &mt);
	render_tops(r, mt, ntop, false);
	render_candidate(m, r);
	render_tops(r, mt, ntop, true);
	free_tops(mt, ntop);
	free(mg.rows);
}

/* Renders the merged top offenders as JSON (the /top view). */
void metrics_render_top(const struct metrics *m, struct http_reply *r)
{
	struct met_merged_top *mt;
	size_t ntop = merge_tops(m, &mt), i, j;

	int cand;

	/* the enforced rules' denials, then the candidate rules' would-be denials */
	for (cand = 0; cand < 2; cand++) {
		bool first = true;

		http_reply_printf(r, cand ? "],\"candidate\":[" : "{\"rules\":[");
		for (j = 0; j < ntop; j++) {
			const char *rule = top_rule(mt[j].rule, cand);

			if (!rule)
				continue;
			http_reply_printf(r,
					  "%s{\"rule\":\"%s\",\"denied\":%llu,"
					  "\"distinct_clients\":%llu,\"top\":[",
					  first ? "" : ",", rule, (unsigned long long)mt[j].denied,
					  (unsigned long long)hll_count(&mt[j].hll));
			first = false;
			for (i = 0; i < mt[j].n; i++)
				http_reply_printf(r,
						  "%s{\"client\":\"%s\",\"count\":%llu,"
						  "\"error\":%llu}",
						  i ? "," : "", mt[j].e[i].item,
						  (unsigned long long)mt[j].e[i].count,
						  (unsigned long long)mt[j].e[i].error);
			http_reply_printf(r, "]}");
		}
	}
	http_reply_printf(r, "]}\n");
	free_tops(mt, ntop);
}

/* ---------------------------------------------------------------- the status page */

/* Every decision counted by the live workers, by result. */
static void sum_results(const struct metrics *m, uint64_t v[MET_RESULTS])
{
	unsigned w;
	size_t i;

	memset(v, 0, MET_RESULTS * sizeof(v[0]));
	for (w = 0; w < m->nslots; w++) {
		const struct met_slot *s = &m->slots[w];
		size_t n;

		if (!slot_live(s))
			continue;
		n = __atomic_load_n(&s->nrows, __ATOMIC_ACQUIRE);
		for (i = 0; i < n; i++) {
			v[MR_ALLOWED] += s->rows[i].allowed;
			v[MR_DENIED] += s->rows[i].denied;
			v[MR_SHADOW_DENIED] += s->rows[i].shadow_denied;
			v[MR_DEGRADED] += s->rows[i].degraded;
			v[MR_LOCAL] += s->rows[i].local;
		}
	}
}

/*
 * Adds a point to the decision history when <now> (Unix seconds) has entered
 * a new MET_HIST_STEP_S step; only the first worker's slot <s> writes (one
 * writer), the others return at once. A reader may see the oldest point torn
 * while it is overwritten: the page clamps a negative rate to zero.
 */
void metrics_sample(struct metrics *m, const struct met_slot *s, int64_t now)
{
	int64_t t = now - now % MET_HIST_STEP_S;
	size_t last;
	struct met_point *p;

	if (s != &m->slots[0])
		return;
	last = (m->hist_next + MET_HIST - 1) % MET_HIST;
	if (m->nhist && m->hist[last].t >= t)
		return;
	p = &m->hist[m->hist_next];
	p->t = t;
	sum_results(m, p->v);
	__atomic_store_n(&m->hist_next, (m->hist_next + 1) % MET_HIST, __ATOMIC_RELEASE);
	if (m->nhist < MET_HIST)
		__atomic_store_n(&m->nhist, m->nhist + 1, __ATOMIC_RELEASE);
}

/* Merges the Redis nodes the live workers report, by name. */
static void merge_nodes(const struct metrics *m, struct met_view *v)
{
	unsigned w;
	size_t i, j, k;

	v->nodes = xcalloc(MET_NODES * m->nslots, sizeof(*v->nodes));
	for (w = 0; w < m->nslots; w++) {
		const struct met_slot *s = &m->slots[w];
		size_t n;

		if (!slot_live(s))
			continue;
		n = __atomic_load_n(&s->nnodes, __ATOMIC_ACQUIRE);
		for (i = 0; i < n && i < MET_NODES; i++) {
			const struct store_node_stats *src = &s->nodes[i];
			struct store_node_stats *d;

			for (j = 0; j < v->nnodes; j++)
				if (strcmp(v->nodes[j].name, src->name) == 0)
					break;
			d = &v->nodes[j];
			if (j == v->nnodes) {
				v->nnodes++;
				*d = *src;
				continue;
			}
			/* a worker whose connection is not ready tells, and the
			 * first one down says since when and why */
			if (strcmp(src->state, "ready") != 0)
				memcpy(d->state, src->state, sizeof(d->state));
			if (src->down_since > 0 &&
			    (d->down_since <= 0 || src->down_since < d->down_since)) {
				d->down_since = src->down_since;
				memcpy(d->trouble, src->trouble, sizeof(d->trouble));
			} else if (!d->trouble[0]) {
				memcpy(d->trouble, src->trouble, sizeof(d->trouble));
			}
			d->breaker_open |= src->breaker_open;
			if (src->oldest_s > d->oldest_s)
				d->oldest_s = src->oldest_s;
			d->limit += src->limit;
			d->out += src->out;
			d->queued += src->queued;
			for (k = 0; k < STORE_EC_COUNT; k++)
				d->errors[k] += src->errors[k];
			for (k = 0; k < STORE_LAT_BUCKETS; k++)
				d->lat[k] += src->lat[k];
		}
	}
}

/*
 * What the status page shows, merged from every live worker: counters summed
 * (and their highest values), decisions by rule, the candidate's verdicts,
 * top offenders, Redis nodes, latencies and the decision history. To be freed
 * with metrics_view_free().
 */
struct met_view *metrics_view(const struct metrics *m)
{
	struct met_view *v = xcalloc(1, sizeof(*v));
	int64_t reload_at = -1;
	struct merged mg;
	size_t n, first, i;
	unsigned w, k;

	merge_slots(m, &mg);
	v->live = mg.live;
	v->started = m->started;
	v->rows = mg.rows;
	v->nrows = mg.nrows;
	v->decision_lat = mg.dl;
	v->redis_lat = mg.rl;
	memcpy(v->degraded, mg.deg, sizeof(v->degraded));
	for (w = 0; w < m->nslots; w++) {
		const struct met_slot *s = &m->slots[w];

		if (!slot_live(s))
			continue;
		for (k = 0; k < MC_COUNT; k++) {
			v->sum[k] += s->c[k];
			if (s->c[k] > v->max[k])
				v->max[k] = s->c[k];
		}
		if (s->c[MC_RELOAD_AT] && (int64_t)s->c[MC_RELOAD_AT] > reload_at) {
			reload_at = (int64_t)s->c[MC_RELOAD_AT];
			v->reload_ok = s->c[MC_RELOAD_OK] != 0;
		}
	}
	v->cand = merge_cand(m, &v->ncand);
	v->ntop = merge_tops(m, &v->tops);
	merge_nodes(m, v);
	n = __atomic_load_n(&m->nhist, __ATOMIC_ACQUIRE);
	first = (__atomic_load_n(&m->hist_next, __ATOMIC_ACQUIRE) + MET_HIST - n) % MET_HIST;
	for (i = 0; i < n; i++)
		v->hist[i] = m->hist[(first + i) % MET_HIST];
	v->nhist = n;
	return v;
}

/* Frees <v> and what it owns (NULL is a no-op). */
void metrics_view_free(struct met_view *v)
{
	if (!v)
		return;
	free(v->rows);
	free(v->cand);
	free_tops(v->tops, v->ntop);
	free(v->nodes);
	free(v);
}
