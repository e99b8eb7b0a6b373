/* SPDX-License-Identifier: MIT */
/*
 * The configuration loader's own declarations, shared by its files (not part
 * of its API, config.h): the loader, the typed readers of config_read.c, the
 * policy's sections of config_policy.c.
 */
#ifndef AGENT_CONFIG_INT_H
#define AGENT_CONFIG_INT_H

#include <stdbool.h>
#include <stdio.h>

#include <libconfig.h>

#include "compiler.h"
#include "config.h"

struct loader {
	const char *file;
	struct cfg_errors *errs;
	struct agent_config *cfg;
	FILE *defaults;                 /* config_defaults(): each default applied, or NULL */
	const char *group;              /* the group load_keys() reads ("" at the top) */
};

/* config_read.c: settings read by type, every problem kept as "file:line: message" */
void add_err(struct loader *ld, int line, const char *fmt, ...) PRINTF(3, 4);
int line_of(const config_setting_t *s);
void check_known(struct loader *ld, const config_setting_t *g, const char *where,
		 const char *const *known);
char *get_str(struct loader *ld, const config_setting_t *g, const char *name,
	      const char *dflt);
void get_uint(struct loader *ld, const config_setting_t *g, const char *name, long long lo,
	      long long hi, unsigned *out);
void get_duration(struct loader *ld, const config_setting_t *g, const char *name,
		  uint64_t lo, uint64_t hi, unsigned *out);
void get_bool(struct loader *ld, const config_setting_t *g, const char *name, bool *out);
bool name_ok(const char *n);

/* config_policy.c: the sections of the policy */
void load_post(struct loader *ld, const config_setting_t *g, const char *name,
	       struct cfg_post *p, char **msg);
void load_tier_lookup(struct loader *ld, const config_setting_t *root);
void load_policy(struct loader *ld, const config_setting_t *g, bool cand);
void load_candidate(struct loader *ld, const config_setting_t *root);

#endif /* AGENT_CONFIG_INT_H */
