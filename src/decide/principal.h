/* SPDX-License-Identifier: MIT */
/* Who is asking: API key digests, masked addresses, the Redis keys of a principal's limits. */
#ifndef AGENT_PRINCIPAL_H
#define AGENT_PRINCIPAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct agent;
struct agent_config;
struct decision;
struct limit_params;
struct ruleset;
struct spop_data;

void principal_cache_new(struct agent *a);
void principal_cache_free(struct agent *a);
void limit_key(char *k, size_t cap, const struct agent_config *cfg, const struct limit_params *lp,
	       const char *principal, bool cand, const char *name, const char *sfx);
bool principal_ip(const struct ruleset *rs, const struct spop_data *ip, char *out, size_t outlen);
void client_ip(const struct ruleset *rs, const struct spop_data *ip, char *out, size_t outlen);
size_t ip_bytes(const struct spop_data *ip, const uint8_t **b);
void principal_key(struct decision *d, const char *key, size_t key_len);

#endif /* AGENT_PRINCIPAL_H */
