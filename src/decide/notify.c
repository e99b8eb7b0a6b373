/* SPDX-License-Identifier: MIT */
/*
 * A NOTIFY's messages: the request message (message, "rl-req") begins a
 * decision, the post-charge message (post_charge.message, "rl-res") a
 * post-charge; their arguments read.
 *
 * DESIGN
 * A NOTIFY carries our message (default "rl-req") with named arguments: key,
 * tier, ip, method, path, cost (and route). A NOTIFY with neither message is
 * answered without a verdict, and HAProxy lets the request pass.
 *
 * The post-charge message carries the request's arguments, the endpoint and
 * cost its ACK named, and the response's cost. It is answered at once (the
 * client has its response), its cost read as tokens, and charged through a
 * decision of its own that answers nobody: charge.c says what is charged.
 */
#include "notify.h"

#include <string.h>

#include "agent_int.h"
#include "answer.h"
#include "charge.h"
#include "decision.h"
#include "prepare.h"
#include "principal.h"
#include "rules.h"
#include "spoa.h"
#include "util.h"

#define COST_MAX 1000000

/*
 * With spoe_timeout set, a decision sent to Redis is answered by the time
 * CFG_ANSWER_SHARE of HAProxy's processing budget has passed since its NOTIFY
 * arrived (its answer_by: the store's deadline for it), by the failure ladder
 * if Redis has not answered (or has not been asked: a backlog's excess). The
 * rest of the budget is for the ACK's way back and HAProxy's own queueing;
 * past the budget HAProxy lets the request through with no limit at all, the
 * ladder at least applies the local one.
 */

/* What we read from the message. */
struct req_args {
	struct spop_str key;            /* API key (empty: anonymous) */
	struct spop_str tier;           /* tier name or empty */
	struct spop_str method, path, route;
	struct spop_data ip;            /* NULL type when absent */
	int64_t cost;                   /* -1 when not sent */
	bool cost_invalid;              /* sent, but not an integer in 0..COST_MAX */
	/* the post-charge message's */
	bool has_endpoint;              /* `endpoint` sent (NULL: the request matched none) */
	struct spop_str endpoint;       /* the endpoint the request's ACK named */
	int64_t charged;                /* the cost its ACK named (`charged`), -1 when not sent */
	struct spop_str shadow;         /* the shadow limit its ACK named (`shadow`), or empty */
	struct spop_data charge, bytes, time; /* NULL type when absent */
	int64_t slot;                   /* the concurrency slot its ACK named (`slot`), or 0 */
	struct spop_str cendpoint;      /* the candidate's endpoint its ACK named, or empty */
	bool degraded;                  /* its ACK said degraded: nothing to charge in Redis */
};

/* How a response's cost reads (post_tokens()). */
enum post_value {
	PV_OK      = 0,
	PV_CLAMPED = 1,         /* above post_charge.max: the max */
	PV_ABSENT  = 2,         /* not sent, or NULL (no such header) */
	PV_INVALID = 3,         /* not a non-negative decimal integer */
};

/* Reads our arguments from message <m>; unknown arguments are ignored. */
static void read_args(struct spop_msg *m, struct req_args *ra)
{
	struct spop_str name;
	struct spop_data v;
	int64_t i = 0;

	memset(ra, 0, sizeof(*ra));
	ra->cost = -1;
	ra->charged = -1;
	while (spop_arg_next(m, &name, &v) > 0) {
		bool str = v.type == SPOP_T_STR || v.type == SPOP_T_BIN;

		if (spop_str_eq(&name, "key")) {
			if (str)
				ra->key = v.v.s;
		} else if (spop_str_eq(&name, "tier")) {
			if (str)
				ra->tier = v.v.s;
		} else if (spop_str_eq(&name, "ip")) {
			if (v.type == SPOP_T_IPV4 || v.type == SPOP_T_IPV6)
				ra->ip = v;
		} else if (spop_str_eq(&name, "method")) {
			if (str)
				ra->method = v.v.s;
		} else if (spop_str_eq(&name, "path")) {
			if (str)
				ra->path = v.v.s;
		} else if (spop_str_eq(&name, "route")) {
			if (str)
				ra->route = v.v.s;
		} else if (spop_str_eq(&name, "endpoint")) {
			ra->has_endpoint = true;
			if (str)
				ra->endpoint = v.v.s;
		} else if (spop_str_eq(&name, "charge")) {
			ra->charge = v;
		} else if (spop_str_eq(&name, "charged")) {
			/* what we said in the request's ACK; anything else: as if not sent */
			if (spop_data_int(&v, &i) && i >= 0 && i <= COST_MAX)
				ra->charged = i;
		} else if (spop_str_eq(&name, "slot")) {
			/* what we said in the request's ACK; anything else: no slot */
			if (spop_data_int(&v, &i) && i > 0 && i <= CONC_SLOT_MAX)
				ra->slot = i;
		} else if (spop_str_eq(&name, "cendpoint")) {
			if (str)
				ra->cendpoint = v.v.s;
		} else if (spop_str_eq(&name, "degraded")) {
			ra->degraded = spop_data_int(&v, &i) && i != 0;
		} else if (spop_str_eq(&name, "shadow")) {
			if (str)
				ra->shadow = v.v.s;
		} else if (spop_str_eq(&name, "bytes")) {
			ra->bytes = v;
		} else if (spop_str_eq(&name, "time")) {
			ra->time = v;
		} else if (spop_str_eq(&name, "cost")) {
			/* NULL: HAProxy had no value, as if not sent. Anything but an
			 * integer in 0..COST_MAX is an error, never free: the maximum */
			if (v.type == SPOP_T_NULL)
				continue;
			if ((v.type == SPOP_T_UINT32 || v.type == SPOP_T_UINT64)
				    ? v.v.u <= COST_MAX
				    : spop_data_int(&v, &i) && i >= 0 && i <= COST_MAX) {
				ra->cost = v.type == SPOP_T_UINT32 || v.type == SPOP_T_UINT64
						   ? (int64_t)v.v.u
						   : i;
				ra->cost_invalid = false;
			} else {
				ra->cost = COST_MAX;
				ra->cost_invalid = true;
			}
		}
	}
}

/*
 * A new decision for the request of <ra> (its message read) with endpoint
 * <ep>, answering <req> (NULL: a post-charge, nothing to answer).
 */
static struct decision *decision_start(struct agent *a, struct spoa_req *req,
				       const struct req_args *ra, const struct rule_endpoint *ep)
{
	struct ruleset *rs = a->rs;
	struct decision *d = decision_new(a);

	d->t0 = mono();
	d->answer_by = 0;
	d->a = a;
	d->req = req;
	list_init(&d->park);
	d->rs = ruleset_ref(rs);
	d->ip = ra->ip;
	d->cost = ra->cost;
	d->ep = ep;
	if (rs->cand)
		d->cep = ruleset_endpoint(rs->cand, ra->route.p, ra->route.len, ra->method.p,
					  ra->method.len, ra->path.p, ra->path.len);
	d->keyed = ra->key.len > 0;
	if (d->keyed) {
		principal_key(d, ra->key.p, ra->key.len);
		d->sent_tier = ruleset_tier_find(rs, ra->tier.p, ra->tier.len);
		if (rs->cand)
			d->ctier = ruleset_tier_find(rs->cand, ra->tier.p, ra->tier.len);
	}
	return d;
}

/*
 * The tokens of value <v> under <pc>: a non-negative integer, or a string of
 * decimal digits (a header; surrounding blanks ignored), ceil(value / per),
 * at most max. Anything else is PV_INVALID; nothing wraps (any number of
 * digits saturates, then clamps to the max).
 */
static enum post_value post_tokens(const struct spop_data *v, const struct cfg_post *pc,
				   int64_t *tokens)
{
	uint64_t x = 0, t;
	int64_t i;

	if (v->type == SPOP_T_NULL)
		return PV_ABSENT;
	if (v->type == SPOP_T_STR || v->type == SPOP_T_BIN) {
		const char *p = v->v.s.p, *end = p + v->v.s.len;

		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if (p == end)
			return PV_INVALID;
		for (; p < end; p++) {
			if (*p < '0' || *p > '9')
				return PV_INVALID;
			x = x > (UINT64_MAX - 9) / 10 ? UINT64_MAX : x * 10 + (uint64_t)(*p - '0');
		}
	} else if (v->type == SPOP_T_UINT32 || v->type == SPOP_T_UINT64) {
		x = v->v.u;
	} else if (spop_data_int(v, &i) && i >= 0) {
		x = (uint64_t)i;
	} else {
		return PV_INVALID;
	}
	t = x / pc->per + (x % pc->per != 0);
	if (t > (uint64_t)pc->max) {
		*tokens = pc->max;
		return PV_CLAMPED;
	}
	*tokens = (int64_t)t;
	return PV_OK;
}

/*
 * The post-charge message <m> of <req>: answered at once, then the cost read
 * and, if there is one, charged through a decision of its own (the request's
 * principal, tier and limits) that answers nobody. The same decision gives
 * back the request's concurrency slot (`slot`), cost or none; a request the
 * failure ladder answered (`degraded`) is charged nothing more, its slot is
 * given back all the same (it may be held in Redis or in the local count).
 */
static void post_begin(struct agent *a, struct spoa_req *req, struct spop_msg *m)
{
	const struct ruleset *rs = a->rs;
	const struct rule_endpoint *ep = NULL;
	const struct cfg_post *pc;
	const struct spop_data *v;
	struct decision *d;
	struct req_args ra;
	int64_t tokens = 0;

	read_args(m, &ra);
	decision_answer_request(req);
	if (rs->cfg->store == STORE_KIND_ALLOW)
		return;
	if (ra.has_endpoint)
		ep = ruleset_endpoint_named(rs, ra.endpoint.p, ra.endpoint.len);
	else
		ep = ruleset_endpoint(rs, ra.route.p, ra.route.len, ra.method.p, ra.method.len,
				      ra.path.p, ra.path.len);
	pc = ep ? ep->post : &rs->cfg->post;
	v = pc->from == POST_FROM_BYTES ? &ra.bytes : pc->from == POST_FROM_TIME ? &ra.time
										  : &ra.charge;
	switch (ra.degraded ? PV_ABSENT : post_tokens(v, pc, &tokens)) {
	case PV_ABSENT:
		post_counted(a, POST_ABSENT);
		tokens = -1;
		break;
	case PV_INVALID:
		post_counted(a, POST_INVALID);
		tokens = -1;
		break;
	case PV_CLAMPED:
		a->st.notify.post_clamped++;
		break;
	case PV_OK:
		break;
	}
	if (ra.cost_invalid && tokens >= 0) {
		/* the request was charged the maximum for its bad cost: that stands */
		post_counted(a, POST_INVALID);
		tokens = -1;
	}
	/* nothing to charge: a slot this process kept goes back as it was taken */
	if (tokens < 0 && (!ra.slot || slots_release(a, ra.slot)))
		return;
	d = decision_start(a, NULL, &ra, ep);
	d->post = true;
	d->post_cost = tokens;
	d->slot = ra.slot;
	/* the message has no path: the candidate's endpoint is the one its ACK named */
	if (d->rs->cand)
		d->cep = ruleset_endpoint_named(d->rs->cand, ra.cendpoint.p, ra.cendpoint.len);
	/* the endpoint's cost when the request was charged, not after a reload since */
	if (d->cost < 0 && ra.charged >= 0)
		d->cost = ra.charged;
	/* a shadow limit that would have denied the request was not charged for it */
	for (size_t i = 0; ra.shadow.len && i < d->rs->cfg->nlimits; i++) {
		const struct rule_limit *l = &d->rs->limits[i];

		if (l->shadow && strlen(l->name) == ra.shadow.len &&
		    memcmp(l->name, ra.shadow.p, ra.shadow.len) == 0)
			d->post_shadow = l;
	}
	decision_begin(d);
}

void notify_receive(struct spoa_req *req, struct spop_rd *msgs, void *arg)
{
	struct agent *a = arg;
	struct ruleset *rs = a->rs;
	struct decision *d;
	struct req_args ra;
	struct spop_msg m;
	bool found = false;
	int ret;

	while ((ret = spop_msg_next(msgs, &m)) > 0) {
		if (spop_str_eq(&m.name, rs->cfg->message)) {
			found = true;
			break;
		}
		if (spop_str_eq(&m.name, rs->cfg->post_message)) {
			post_begin(a, req, &m);
			return;
		}
	}
	if (!found) {
		/* nothing to decide: answer without a verdict, HAProxy lets it pass */
		ignore_request(a, req);
		return;
	}
	read_args(&m, &ra);
	if (rs->cfg->store == STORE_KIND_ALLOW) {
		allow_all(a, req);
		return;
	}
	if (ra.cost_invalid)
		a->st.notify.invalid_costs++;
	d = decision_start(a, req, &ra,
			   ruleset_endpoint(rs, ra.route.p, ra.route.len, ra.method.p,
					    ra.method.len, ra.path.p, ra.path.len));
	if (rs->cfg->spoe_timeout_ms)
		d->answer_by = d->t0 + rs->cfg->spoe_timeout_ms * (CFG_ANSWER_SHARE / 1000.) -
			       spoa_req_age_us(req) / 1e6;
	decision_begin(d);
}
