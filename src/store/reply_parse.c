/* SPDX-License-Identifier: MIT */
/*
 * What Redis and the Sentinels say about where things are: MOVED and ASK,
 * CLUSTER SLOTS entries, a Sentinel's master address and +switch-master
 * messages, ROLE (see reply_parse.h).
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

/* Copies the field at <p> (up to a space or <end>) into <dst> of <size> bytes;
 * returns where it ends, or NULL when it is empty, too long or holds a NUL. */
static const char *field(const char *p, const char *end, char *dst, size_t size)
{
	const char *q = p;

	while (q < end && *q != ' ')
		q++;
	if (q == p || (size_t)(q - p) >= size || memchr(p, '\0', (size_t)(q - p)))
		return NULL;
	memcpy(dst, p, (size_t)(q - p));
	dst[q - p] = '\0';
	return q;
}

/* The port written in <s> (1..65535, digits only, no leading zero), or -1. */
static int port_field(const char *s)
{
	long v = 0;

	if (*s < '1' || *s > '9')
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > 6553)
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v <= 65535 ? (int)v : -1;
}

int reply_switch_master(const redisReply *msg, struct reply_switch *sw)
{
	char oport[6], nport[6];
	struct {
		char *dst;
		size_t size;
	} f[5] = {{sw->name, sizeof(sw->name)}, {sw->old_host, sizeof(sw->old_host)},
		  {oport, sizeof(oport)}, {sw->new_host, sizeof(sw->new_host)},
		  {nport, sizeof(nport)}};
	const char *p, *end;
	size_t i;

	if (msg->type != REDIS_REPLY_STRING)
		return -1;
	p = msg->str;
	end = p + msg->len;
	for (i = 0; i < 5; i++) {
		if (i && (p == end || *p++ != ' '))
			return -1;
		p = field(p, end, f[i].dst, f[i].size);
		if (!p)
			return -1;
	}
	if (p != end)
		return -1;
	sw->old_port = port_field(oport);
	sw->new_port = port_field(nport);
	return sw->old_port < 0 || sw->new_port < 0 ? -1 : 0;
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
