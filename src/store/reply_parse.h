/* SPDX-License-Identifier: MIT */
/*
 * What Redis and the Sentinels say about where things are (reply_parse.c): a
 * MOVED or ASK error, one CLUSTER SLOTS entry, a Sentinel's master address
 * and its +switch-master messages, ROLE. Pure functions of a reply: they
 * check its shape and ranges and fill a struct, or refuse; they log nothing
 * and act on nothing, so that the fuzz target (tests/fuzz/fuzz_reply_parse.c)
 * reaches them with any reply. A pointer they fill points into the reply (or
 * the error string) it was read from and lives as long as it.
 */
#ifndef AGENT_REPLY_PARSE_H
#define AGENT_REPLY_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

/* A MOVED or ASK error: where the slot is served (for good, or for one command). */
struct reply_redirect {
	bool ask;               /* ASK, else MOVED */
	unsigned slot;          /* 0..CRC16_SLOTS - 1 */
	const char *host;       /* ref: in the error string, <hostlen> bytes, not
				 * NUL-terminated; empty: the node that sent it */
	size_t hostlen;
	int port;               /* 1..65535 */
};

/* One CLUSTER SLOTS entry: { start, end, { host, port, ... }, replicas... }. */
struct reply_slots_entry {
	unsigned start, end;    /* start <= end < CRC16_SLOTS */
	const char *host;       /* ref: the master's address as sent, NUL-terminated at
				 * <hostlen> and holding no other NUL; "" when the reply
				 * had nil or "" (the node that was asked) */
	size_t hostlen;
	long long port;         /* as sent: the caller checks its range */
};

/* The answer to `SENTINEL get-master-addr-by-name`. */
struct reply_master_addr {
	char host[64];          /* NUL-terminated, holding no other NUL */
	int port;               /* 1..65535 */
};

/* A Sentinel's +switch-master message: "<name> <old ip> <old port> <new ip> <new port>". */
struct reply_switch {
	char name[128];         /* each string NUL-terminated, not empty, no space */
	char old_host[64];
	char new_host[64];
	int old_port;           /* 1..65535 */
	int new_port;           /* 1..65535 */
};

/* True when <e> is an integer within [lo, hi]. */
bool reply_int_in(const redisReply *e, long long lo, long long hi);
/*
 * Reads the error string <err> as a redirection into <rd>: "MOVED <slot>
 * <host>:<port>" or "ASK ..." (the host may be empty, or an IPv6 address with
 * its colons: the port follows the last one). Returns 0 when <rd> is filled,
 * 1 when <err> is no redirection, -1 when it is one but malformed.
 */
int reply_redirect_parse(const char *err, struct reply_redirect *rd);
/* Reads the CLUSTER SLOTS entry <e> into <se>. Returns 0, or -1 when malformed
 * (a host holding a NUL is). */
int reply_slots_entry(const redisReply *e, struct reply_slots_entry *se);
/*
 * Reads a Sentinel's answer <r> to `SENTINEL get-master-addr-by-name` into
 * <ma>: { host, port } as two strings, the port all digits of its string (but
 * for leading blanks and a sign, as strtol() reads it), neither holding a NUL.
 * Returns 0, or -1 when it is anything else (an error, nil for a name it does
 * not know, a bad address): the caller tells which from <r>'s type.
 */
int reply_master_addr(const redisReply *r, struct reply_master_addr *ma);
/*
 * Reads the payload <msg> of a +switch-master message into <sw>: a string of
 * five fields, one space between each, the ports in decimal without a sign or
 * a leading zero (as Sentinels write them), each field within its room in
 * <sw> and holding no NUL. Returns 0, or -1 when it is anything else.
 */
int reply_switch_master(const redisReply *msg, struct reply_switch *sw);
/* The role ROLE's reply <r> states ("master", "slave", "sentinel"), or NULL
 * (no role, or one holding a NUL). */
const char *reply_role(const redisReply *r);

#endif /* AGENT_REPLY_PARSE_H */
