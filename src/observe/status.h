/* SPDX-License-Identifier: MIT */
/*
 * The status page of the metrics listener: /status (one self-contained HTML
 * page, readable without JavaScript, which then refreshes itself from
 * /status.json) and /status.json (the same data for scripts and for
 * `spoa-ratelimit ctl status`). Built from the counters the agent keeps
 * (metrics_view()), without any Redis call.
 *
 * Every string from the configuration or from traffic is escaped (HTML, or
 * JSON with <, > and & as \u escapes); the page loads nothing from anywhere,
 * and its Content-Security-Policy allows only its own inline script and style
 * (by their hashes) and requests to its own origin.
 */
#ifndef AGENT_STATUS_H
#define AGENT_STATUS_H

#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "metrics.h"
#include "overrides.h"

#define STATUS_SCHEMA   1       /* /status.json's "schema": raised on incompatible changes */

/* What the page shows besides the metrics: the agent's own state. */
struct status_info {
	const char *version;            /* the agent's version */
	int64_t now;                    /* Unix seconds */
	const char *store;              /* "redis" or "memory" */
	bool ready;                     /* what /ready answers */
	const char *health;             /* why Redis is unhealthy, or NULL when healthy */
	const char *fallback;           /* what answers while Redis cannot */
	bool candidate;                 /* a candidate policy is configured */
	bool quotas;                    /* local quotas are configured */
	const struct overrides *ovr;    /* the overrides in force, or NULL */
};

void status_render_json(const struct met_view *v, const struct status_info *si,
			struct http_reply *r);
void status_render_html(const struct met_view *v, const struct status_info *si,
			struct http_reply *r);
void status_json_str(struct http_reply *r, const char *s);
void status_html_str(struct http_reply *r, const char *s);

#endif /* AGENT_STATUS_H */
