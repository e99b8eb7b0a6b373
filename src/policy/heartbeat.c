/* SPDX-License-Identifier: MIT */
/*
 * The gateway heartbeat (see heartbeat.h).
 *
 * DESIGN
 * Each agent process has an id of its own (host, pid and a random part) and
 * runs lua/heartbeat.lua every period: its score in the registry, a sorted set
 * <prefix>:{gw}:gateways, becomes Redis time; members silent for three periods
 * are removed; the answer is how many are left. Worker processes count one
 * each: each keeps its own local state and takes its share of the gateway's
 * traffic, so a rate divided by the count is right for both.
 *
 * Until the first answer (Redis not up yet) the count is unknown (0) and is
 * asked for again soon, backing off from 50 ms to the period. Afterwards a
 * failed heartbeat keeps the last count: during an outage the count is the
 * fleet's just before it. A reload that changes the prefix (another registry)
 * forgets the count.
 */
#include "heartbeat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "digest.h"
#include "list.h"
#include "store.h"
#include "util.h"

#define HB_RETRY_MIN 0.05       /* seconds: the first retry before any count */

struct heartbeat {
	struct ev_loop *loop;           /* ref */
	struct store *store;            /* ref */
	heartbeat_fn cb;
	void *arg;
	ev_timer tick;                  /* every period */
	ev_timer retry;                 /* before the first count: backing off */
	double period, backoff;
	bool busy;                      /* a heartbeat in flight */
	uint64_t gateways;              /* last count, 0 = none yet */
	char id[96];                    /* this agent in the registry */
	char key[STORE_KEY_MAX];
};

static void beat(struct heartbeat *hb);

static void beat_cb(enum store_status st, const char *val, size_t len, void *arg)
{
	struct heartbeat *hb = arg;
	char buf[24];
	long v;

	hb->busy = false;
	if (st == STORE_SHUTDOWN)
		return;
	if (st == STORE_OK && val && len > 0 && len < sizeof(buf)) {
		memcpy(buf, val, len);
		buf[len] = 0;
		v = strtol(buf, NULL, 10);
		if (v >= 1 && v <= 1000000) {
			hb->backoff = 0;
			if ((uint64_t)v != hb->gateways) {
				hb->gateways = (uint64_t)v;
				if (hb->cb)
					hb->cb(hb->gateways, hb->arg);
			}
			return;
		}
	}
	/* no count yet: ask again soon, backing off up to the period */
	if (!hb->gateways) {
		hb->backoff = hb->backoff ? 2 * hb->backoff : HB_RETRY_MIN;
		if (hb->backoff > hb->period)
			hb->backoff = hb->period;
		ev_timer_stop(hb->loop, &hb->retry);
		ev_timer_set(&hb->retry, hb->backoff, 0.);
		ev_timer_start(hb->loop, &hb->retry);
	}
}

static void beat(struct heartbeat *hb)
{
	if (hb->busy)
		return;
	if (store_heartbeat(hb->store, hb->key, hb->id, (unsigned)(3000 * hb->period), beat_cb,
			    hb) == 0)
		hb->busy = true;
	else
		beat_cb(STORE_DOWN, NULL, 0, hb);
}

static void tick_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	beat(container_of(t, struct heartbeat, tick));
}

static void retry_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	beat(container_of(t, struct heartbeat, retry));
}

/* (Re)applies what a reload may change: the registry's prefix and the period. */
void heartbeat_configure(struct heartbeat *hb, const char *key_prefix, unsigned period_ms)
{
	char key[STORE_KEY_MAX];

	snprintf(key, sizeof(key), "%s:{gw}:gateways", key_prefix);
	if (strcmp(key, hb->key) != 0) {
		memcpy(hb->key, key, sizeof(key));
		hb->gateways = 0; /* another registry: unknown until it answers */
		hb->backoff = 0;
	}
	hb->period = period_ms / 1000.;
	ev_timer_stop(hb->loop, &hb->tick);
	ev_timer_set(&hb->tick, 0., hb->period);
	ev_timer_start(hb->loop, &hb->tick);
}

struct heartbeat *heartbeat_new(struct ev_loop *loop, struct store *store, heartbeat_fn cb,
				void *arg)
{
	struct heartbeat *hb = xcalloc(1, sizeof(*hb));
	char host[64] = "?";
	uint8_t rnd[SHA256_LEN];
	char hex[17];
	struct timespec ts;

	hb->loop = loop;
	hb->store = store;
	hb->cb = cb;
	hb->arg = arg;
	hb->period = 1.;
	(void)gethostname(host, sizeof(host) - 1);
	host[sizeof(host) - 1] = 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(hb->id, sizeof(hb->id), "%s:%ld:%ld.%ld", host, (long)getpid(), (long)ts.tv_sec,
		 (long)ts.tv_nsec);
	sha256(hb->id, strlen(hb->id), rnd);
	hex_encode(rnd, 8, hex);
	snprintf(hb->id, sizeof(hb->id), "%.60s:%ld:%s", host, (long)getpid(), hex);
	ev_timer_init(&hb->tick, tick_cb, 0., 1.);
	ev_timer_init(&hb->retry, retry_cb, 0., 0.);
	return hb;
}

/* The live agents in the last answer (0: none yet). */
uint64_t heartbeat_gateways(const struct heartbeat *hb)
{
	return hb ? hb->gateways : 0;
}

/*
 * Frees <hb>. The store must be freed first: it answers the call in flight,
 * and nothing of ours may be called afterwards.
 */
void heartbeat_free(struct heartbeat *hb)
{
	if (!hb)
		return;
	ev_timer_stop(hb->loop, &hb->tick);
	ev_timer_stop(hb->loop, &hb->retry);
	free(hb);
}
