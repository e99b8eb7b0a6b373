/* SPDX-License-Identifier: MIT */
/*
 * What Redis and the Sentinels say about where things are: MOVED and ASK,
 * CLUSTER SLOTS entries, a Sentinel's master address, ROLE (see reply_parse.h).
 * Their callers act (store_cluster.c, sentinel.c, store_node.c); this file
 * only reads, so that every reply the fuzzer makes up can be read here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "crc16.h"
#include "reply_parse.h"

bool reply_int_in(const redisReply *e, long long lo, long long hi)
{
	return e->type == REDIS_REPLY_INTEGER && e->integer >= lo && e->integer <= hi;
}

int reply_redirect_parse(const char *err, struct reply_redirect *rd)
{
	const char *p, *colon;
	char *end;
	unsigned long slot;
	long port;

	if (strncmp(err, "MOVED ", 6) == 0) {
		rd->ask = false;
		p = err + 6;
	} else if (strncmp(err, "ASK ", 4) == 0) {
		rd->ask = true;
		p = err + 4;
	} else {
		return 1;
	}
	errno = 0;
	slot = strtoul(p, &end, 10);
	if (errno || end == p || *end != ' ' || slot >= CRC16_SLOTS)
		return -1;
	p = end + 1;
	colon = strrchr(p, ':');
	if (!colon)
		return -1;
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	/* the range is the caller's endpoint's too; checked here so that what is
	 * filled holds a port */
	if (errno || end == colon + 1 || *end || port < 1 || port > 65535)
		return -1;
	rd->slot = (unsigned)slot;
	rd->host = p;
	rd->hostlen = (size_t)(colon - p);
	rd->port = (int)port;
	return 0;
}

int reply_slots_entry(const redisReply *e, struct reply_slots_entry *se)
{
	const redisReply *m;

	if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
	    e->element[0]->type != REDIS_REPLY_INTEGER ||
	    e->element[1]->type != REDIS_REPLY_INTEGER)
		return -1;
	if (e->element[0]->integer < 0 || e->element[1]->integer >= CRC16_SLOTS ||
	    e->element[0]->integer > e->element[1]->integer)
		return -1;
	m = e->element[2];
	if (m->type != REDIS_REPLY_ARRAY || m->elements < 2)
		return -1;
	if (m->element[0]->type != REDIS_REPLY_STRING && m->element[0]->type != REDIS_REPLY_NIL)
		return -1;
	/* the host is used as a string: a NUL inside would cut it to another one */
	if (m->element[0]->type == REDIS_REPLY_STRING &&
	    memchr(m->element[0]->str, '\0', m->element[0]->len))
		return -1;
	if (m->element[1]->type != REDIS_REPLY_INTEGER)
		return -1;
	se->start = (unsigned)e->element[0]->integer;
	se->end = (unsigned)e->element[1]->integer;
	/* NULL or "": the node we asked (unknown or own endpoint) */
	if (m->element[0]->type == REDIS_REPLY_STRING) {
		se->host = m->element[0]->str;
		se->hostlen = m->element[0]->len;
	} else {
		se->host = "";
		se->hostlen = 0;
	}
	se->port = m->element[1]->integer;
	return 0;
}

int reply_master_addr(const redisReply *r, struct reply_master_addr *ma)
{
	long port;
	char *end;

	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
	    r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
		return -1;
	port = strtol(r->element[1]->str, &end, 10);
	/* a NUL inside either string would end it early: "6\0\0\0" is no port 6,
	 * nor "10.0.0.1\0junk" the address 10.0.0.1 */
	if (r->element[0]->len >= sizeof(ma->host) ||
	    memchr(r->element[0]->str, '\0', r->element[0]->len) ||
	    end != r->element[1]->str + r->element[1]->len || port < 1 || port > 65535)
		return -1;
	memcpy(ma->host, r->element[0]->str, r->element[0]->len + 1);
	ma->port = (int)port;
	return 0;
}

const char *reply_role(const redisReply *r)
{
	const redisReply *e;

	if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
		return NULL;
	e = r->element[0];
	/* "master\0..." is no master */
	if (e->type != REDIS_REPLY_STRING || memchr(e->str, '\0', e->len))
		return NULL;
	return e->str;
}
