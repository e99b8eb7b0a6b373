/* SPDX-License-Identifier: MIT */
/*
 * The Redis scripts of lua/, embedded at build time (the Makefile generates
 * the definitions from the .lua files).
 */
#ifndef AGENT_SCRIPTS_H
#define AGENT_SCRIPTS_H

#include <stddef.h>

extern const char script_ratelimit[];   /* the lua/ files assembled, NUL-terminated */
extern const size_t script_ratelimit_len; /* its length without the NUL */
extern const char script_heartbeat[];   /* lua/heartbeat.lua, NUL-terminated */
extern const size_t script_heartbeat_len;

#endif /* AGENT_SCRIPTS_H */
