/* SPDX-License-Identifier: MIT */
/*
 * spoa-ratelimit: command line, signals, the loop.
 *
 * Foreground only (systemd friendly), logs to stderr. SIGHUP reloads the
 * configuration: a file that fails validation is reported line by line and
 * the running ruleset stays. SIGTERM/SIGINT stop accepting, let decisions in
 * flight finish (bounded), say AGENT-DISCONNECT and exit 0.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "agent.h"
#include "config.h"
#include "log.h"
#include "rules.h"
#include "util.h"

#ifndef VERSION
#define VERSION "0.1.0-dev"
#endif

#define DRAIN_MAX_S 2.0

struct app {
	struct ev_loop *loop;
	struct agent *agent;
	const char *file;
	uint64_t gen;
	ev_signal sighup, sigterm, sigint, sigusr1;
	ev_stat watch;                  /* the config file, when reload.watch is set */
	ev_timer settle;                /* reload once the file stopped changing */
	ev_timer drain;
	ev_tstamp drain_started;
	bool stopping;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: spoa-ratelimit [-f FILE] [-c] [-d] [-V] [-h]\n"
		"  -f FILE  configuration file (default /etc/spoa-ratelimit/spoa-ratelimit.conf)\n"
		"  -c       check the configuration and exit (errors as file:line: message)\n"
		"  -d       log at debug level\n"
		"  -V       print the version and exit\n"
		"  -h       this help\n");
}

/* Loads <file> into a ruleset; prints every error. Returns NULL on failure. */
static struct ruleset *load(const char *file, uint64_t gen, bool to_log)
{
	struct cfg_errors errs = {0};
	struct agent_config *cfg;
	size_t i;

	if (config_load(file, &cfg, &errs) < 0) {
		for (i = 0; i < errs.n; i++) {
			if (to_log)
				LOG(LOG_ERR, "%s", errs.msgs[i]);
			else
				fprintf(stderr, "%s\n", errs.msgs[i]);
		}
		cfg_errors_release(&errs);
		return NULL;
	}
	return ruleset_build(cfg, gen);
}

static void reload(struct app *app, const char *why)
{
	struct ruleset *rs;

	rs = load(app->file, app->gen + 1, true);
	if (!rs) {
		LOG(LOG_ERR, "reload (%s) failed, keeping configuration generation %llu", why,
		    (unsigned long long)app->gen);
		return;
	}
	app->gen++;
	log_set_level(rs->cfg->log_level);
	agent_swap_rules(app->agent, rs);
	LOG(LOG_NOTICE, "reload (%s) ok: generation %llu, %zu tiers, %zu limits, %zu endpoints",
	    why, (unsigned long long)app->gen, rs->ntiers, rs->cfg->nlimits, rs->nendpoints);
}

static void sighup_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	reload(w->data, "SIGHUP");
}

static void settle_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct app *app = t->data;

	(void)loop;
	(void)revents;
	if (!agent_rules(app->agent)->cfg->watch)
		return;
	reload(app, "file changed");
}

/* The file changed: editors write in several steps, so wait until it settles. */
static void watch_cb(struct ev_loop *loop, ev_stat *w, int revents)
{
	struct app *app = w->data;

	(void)revents;
	if (w->attr.st_nlink == 0)
		return; /* removed (maybe being replaced): wait for the new file */
	ev_timer_stop(loop, &app->settle);
	ev_timer_set(&app->settle, 0.2, 0.);
	ev_timer_start(loop, &app->settle);
}

static void sigusr1_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	struct app *app = w->data;

	(void)loop;
	(void)revents;
	agent_log_stats(app->agent);
}

static void drain_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct app *app = t->data;

	(void)revents;
	if (agent_pending(app->agent) && ev_now(loop) - app->drain_started < DRAIN_MAX_S)
		return;
	ev_timer_stop(loop, t);
	ev_stat_stop(loop, &app->watch);
	ev_timer_stop(loop, &app->settle);
	agent_log_stats(app->agent);
	agent_free(app->agent);
	app->agent = NULL;
	ev_break(loop, EVBREAK_ALL);
}

static void sigterm_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	struct app *app = w->data;

	(void)revents;
	if (app->stopping)
		return;
	app->stopping = true;
	LOG(LOG_NOTICE, "stopping: %zu decisions in flight", agent_pending(app->agent));
	agent_drain(app->agent);
	app->drain_started = ev_now(loop);
	ev_timer_init(&app->drain, drain_cb, 0., 0.01);
	app->drain.data = app;
	ev_timer_again(loop, &app->drain);
}

int main(int argc, char **argv)
{
	const char *file = "/etc/spoa-ratelimit/spoa-ratelimit.conf";
	bool check = false, debug = false;
	struct ruleset *rs;
	struct app app = {0};
	int opt;

	while ((opt = getopt(argc, argv, "f:cdVh")) != -1) {
		switch (opt) {
		case 'f':
			file = optarg;
			break;
		case 'c':
			check = true;
			break;
		case 'd':
			debug = true;
			break;
		case 'V':
			printf("spoa-ratelimit %s\n", VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	rs = load(file, 1, false);
	if (!rs)
		return 1;
	if (check) {
		printf("%s: configuration is valid (%zu tiers, %zu limits)\n", file, rs->ntiers,
		       rs->cfg->nlimits);
		ruleset_unref(rs);
		return 0;
	}
	log_set_level(debug ? LOG_DEBUG : rs->cfg->log_level);
	signal(SIGPIPE, SIG_IGN);

	app.loop = ev_default_loop(EVFLAG_AUTO);
	app.file = file;
	app.gen = 1;
	if (agent_new(app.loop, rs, &app.agent) < 0) {
		ruleset_unref(rs);
		return 1;
	}
	ev_signal_init(&app.sighup, sighup_cb, SIGHUP);
	ev_signal_init(&app.sigterm, sigterm_cb, SIGTERM);
	ev_signal_init(&app.sigint, sigterm_cb, SIGINT);
	ev_signal_init(&app.sigusr1, sigusr1_cb, SIGUSR1);
	app.sighup.data = app.sigterm.data = app.sigint.data = app.sigusr1.data = &app;
	ev_signal_start(app.loop, &app.sighup);
	ev_signal_start(app.loop, &app.sigterm);
	ev_signal_start(app.loop, &app.sigint);
	ev_signal_start(app.loop, &app.sigusr1);
	/* always watched; acted upon only while reload.watch is set (reloadable) */
	ev_timer_init(&app.settle, settle_cb, 0.2, 0.);
	app.settle.data = &app;
	ev_stat_init(&app.watch, watch_cb, app.file, 0.5);
	app.watch.data = &app;
	ev_stat_start(app.loop, &app.watch);
	LOG(LOG_NOTICE, "spoa-ratelimit %s started", VERSION);
	ev_run(app.loop, 0);
	LOG(LOG_NOTICE, "exiting");
	ev_loop_destroy(app.loop);
	return 0;
}
