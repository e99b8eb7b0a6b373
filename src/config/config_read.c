/* SPDX-License-Identifier: MIT */
/*
 * The configuration loader's readers: a setting of a group read by type
 * (string, integer, duration, boolean) within bounds, a group's unknown
 * settings found, and every problem kept with its line, so that one run
 * reports them all.
 */
#include "config_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

void add_err(struct loader *ld, int line, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ld->errs->msgs = xrealloc(ld->errs->msgs, (ld->errs->n + 1) * sizeof(char *));
	ld->errs->msgs[ld->errs->n++] = xasprintf("%s:%d: %s", ld->file, line, msg);
}

int line_of(const config_setting_t *s)
{
	return s ? (int)config_setting_source_line(s) : 0;
}

/* Reports every member of group <g> whose name is not in <known>. */
void check_known(struct loader *ld, const config_setting_t *g, const char *where,
		 const char *const *known)
{
	int i, n = config_setting_length(g);

	for (i = 0; i < n; i++) {
		const config_setting_t *m = config_setting_get_elem(g, (unsigned)i);
		const char *name = config_setting_name(m);
		const char *const *k;

		if (!name)
			continue;
		for (k = known; *k; k++)
			if (strcmp(*k, name) == 0)
				break;
		if (!*k)
			add_err(ld, line_of(m), "unknown setting '%s' in %s", name, where);
	}
}

/* Reads string <name> of group <g>; returns a copy, <dflt> copy, or NULL. */
char *get_str(struct loader *ld, const config_setting_t *g, const char *name,
	      const char *dflt)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;

	if (!s)
		return dflt ? xstrdup(dflt) : NULL;
	if (config_setting_type(s) != CONFIG_TYPE_STRING) {
		add_err(ld, line_of(s), "'%s' must be a string", name);
		return dflt ? xstrdup(dflt) : NULL;
	}
	return xstrdup(config_setting_get_string(s));
}

/* Reads integer <name> of <g> within [lo, hi] into <out> (left alone if absent). */
void get_uint(struct loader *ld, const config_setting_t *g, const char *name, long long lo,
	      long long hi, unsigned *out)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;
	long long v;

	if (!s)
		return;
	if (config_setting_type(s) != CONFIG_TYPE_INT && config_setting_type(s) != CONFIG_TYPE_INT64) {
		add_err(ld, line_of(s), "'%s' must be an integer", name);
		return;
	}
	v = config_setting_get_int64(s);
	if (v < lo || v > hi) {
		add_err(ld, line_of(s), "'%s' must be between %lld and %lld", name, lo, hi);
		return;
	}
	*out = (unsigned)v;
}

/*
 * Reads duration <name> of <g> (a string like "10ms", "30s", "5m") within
 * [lo, hi] milliseconds into <out> (left alone if absent).
 */
void get_duration(struct loader *ld, const config_setting_t *g, const char *name,
		  uint64_t lo, uint64_t hi, unsigned *out)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;
	uint64_t ms;

	if (!s)
		return;
	if (config_setting_type(s) != CONFIG_TYPE_STRING ||
	    parse_duration_ms(config_setting_get_string(s), &ms) < 0 || ms < lo || ms > hi) {
		add_err(ld, line_of(s),
			"'%s' must be a duration like \"10ms\", \"30s\" or \"5m\", from %llu ms "
			"to %llu ms",
			name, (unsigned long long)lo, (unsigned long long)hi);
		return;
	}
	*out = (unsigned)ms;
}

void get_bool(struct loader *ld, const config_setting_t *g, const char *name, bool *out)
{
	const config_setting_t *s = g ? config_setting_get_member(g, name) : NULL;

	if (!s)
		return;
	if (config_setting_type(s) != CONFIG_TYPE_BOOL) {
		add_err(ld, line_of(s), "'%s' must be true or false", name);
		return;
	}
	*out = config_setting_get_bool(s);
}

/* A policy name goes into headers between quotes: keep it to a safe alphabet. */
bool name_ok(const char *n)
{
	size_t i, l = strlen(n);

	if (l == 0 || l > 64)
		return false;
	for (i = 0; i < l; i++) {
		char c = n[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return false;
	}
	return true;
}
