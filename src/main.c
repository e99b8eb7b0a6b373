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
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "agent.h"
#include "config.h"
#include "ctl.h"
#include "digest.h"
#include "log.h"
#include "metrics.h"
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
	ev_timer poll;                  /* content check: stat times have 1 s resolution */
	uint8_t digest[SHA256_LEN];     /* of the file content last loaded (or tried) */
	ev_timer drain;
	ev_tstamp drain_started;
	bool stopping;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: spoa-ratelimit [-f FILE] [-c] [-d] [-w N] [-V] [-h]\n"
		"       spoa-ratelimit ctl [-f FILE] COMMAND ...   live overrides (ctl -h)\n"
		"       spoa-ratelimit defaults                    every setting at its default\n"
		"  -f FILE  configuration file (default /etc/spoa-ratelimit/spoa-ratelimit.conf)\n"
		"  -w N     worker processes (overrides `workers`; 1 = no master process)\n"
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
	struct ruleset *rs;
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
	rs = ruleset_build(cfg, gen);
	/* a reply must fit in one frame: HAProxy drops what does not */
	if (rs->ack_max - 4 > rs->cfg->max_frame_size) {
		char msg[256];

		snprintf(msg, sizeof(msg),
			 "%s: the largest reply this configuration can build is %zu bytes, more "
			 "than max_frame_size (%u): shorten limit, tier or endpoint names or raise "
			 "max_frame_size (and HAProxy's max-frame-size)",
			 file, rs->ack_max - 4, rs->cfg->max_frame_size);
		if (to_log)
			LOG(LOG_ERR, "%s", msg);
		else
			fprintf(stderr, "%s\n", msg);
		ruleset_unref(rs);
		return NULL;
	}
	return rs;
}

/*
 * Hashes the content of <file> into <out>. A config file is small and local:
 * reading it is as (briefly) blocking as loading it. Returns 0 or -1.
 */
static int file_digest(const char *file, uint8_t out[SHA256_LEN])
{
	struct sha256 sh;
	char buf[8192];
	size_t n, total = 0;
	FILE *f = fopen(file, "rb");

	if (!f)
		return -1;
	sha256_init(&sh);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0 && total < (64u << 20)) {
		sha256_update(&sh, buf, n);
		total += n;
	}
	fclose(f);
	sha256_final(&sh, out);
	return 0;
}

/* Reloads the file; <digest>: its content's digest when the caller has it, or NULL. */
static void reload(struct app *app, const char *why, const uint8_t *digest)
{
	struct ruleset *rs;

	if (digest)
		memcpy(app->digest, digest, sizeof(app->digest));
	else
		(void)file_digest(app->file, app->digest);

	rs = load(app->file, app->gen + 1, true);
	if (!rs) {
		LOG(LOG_ERR, "reload (%s) failed, keeping configuration generation %llu", why,
		    (unsigned long long)app->gen);
		agent_note_reload(app->agent, false, app->gen);
		return;
	}
	app->gen++;
	agent_note_reload(app->agent, true, app->gen);
	log_set_level(rs->cfg->log_level);
	agent_swap_rules(app->agent, rs);
	LOG(LOG_NOTICE, "reload (%s) ok: generation %llu, %zu tiers, %zu limits, %zu endpoints",
	    why, (unsigned long long)app->gen, rs->ntiers, rs->cfg->nlimits, rs->nendpoints);
	if (rs->cand)
		LOG(LOG_NOTICE, "candidate policy evaluated: %zu tiers, %zu limits, %zu endpoints",
		    rs->cand->ntiers, rs->cand->cfg->nlimits, rs->cand->nendpoints);
}

static void sighup_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	reload(w->data, "SIGHUP", NULL);
}

static void settle_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct app *app = t->data;
	uint8_t d[SHA256_LEN];

	(void)loop;
	(void)revents;
	if (!agent_rules(app->agent)->cfg->watch)
		return;
	/* unchanged content (touched, or rewritten identically): nothing to do */
	if (file_digest(app->file, d) < 0)
		reload(app, "file changed", NULL);
	else if (memcmp(d, app->digest, sizeof(d)) != 0)
		reload(app, "file changed", d);
}

/*
 * With reload.watch, the content is compared every second too: ev_stat sees
 * times with a one-second resolution, so a same-size edit within the second
 * of the previous one would go unnoticed.
 */
static void poll_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct app *app = t->data;
	uint8_t d[SHA256_LEN];

	(void)revents;
	if (!agent_rules(app->agent)->cfg->watch || ev_is_active(&app->settle))
		return;
	if (file_digest(app->file, d) == 0 && memcmp(d, app->digest, sizeof(d)) != 0) {
		ev_timer_set(&app->settle, 0.2, 0.);
		ev_timer_start(loop, &app->settle);
	}
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
	ev_timer_stop(loop, &app->poll);
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

/* The signals an agent acts upon, in <set>: blocked until its watchers exist. */
static void agent_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGHUP);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGUSR1);
}

/*
 * Runs one agent (the only process, or a worker) until SIGTERM. <mask>, if not
 * NULL, is the signal mask to restore once the signal watchers exist: both
 * callers block SIGHUP, SIGTERM, SIGINT and SIGUSR1 before the listeners open,
 * so a signal sent meanwhile waits and is acted upon instead of killing it.
 */
static int run_agent(const char *file, struct ruleset *rs, const struct agent_opts *opts,
		     const sigset_t *mask)
{
	struct app app = {0};

	app.loop = ev_default_loop(EVFLAG_AUTO);
	app.file = file;
	app.gen = 1;
	if (agent_new(app.loop, rs, opts, &app.agent) < 0) {
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
	/* the handlers exist now (libev installs them: we do not ask for signalfd,
	 * EVFLAG_AUTO): a signal that waited while the worker started is delivered */
	if (mask)
		sigprocmask(SIG_SETMASK, mask, NULL);
	/* always watched; acted upon only while reload.watch is set (reloadable) */
	ev_timer_init(&app.settle, settle_cb, 0.2, 0.);
	app.settle.data = &app;
	ev_stat_init(&app.watch, watch_cb, app.file, 0.5);
	app.watch.data = &app;
	ev_stat_start(app.loop, &app.watch);
	(void)file_digest(app.file, app.digest);
	ev_timer_init(&app.poll, poll_cb, 1., 1.);
	app.poll.data = &app;
	ev_timer_start(app.loop, &app.poll);
	LOG(LOG_NOTICE, "spoa-ratelimit %s started", VERSION);
	ev_run(app.loop, 0);
	LOG(LOG_NOTICE, "exiting");
	ev_loop_destroy(app.loop);
	return 0;
}


/* The master's view of one worker. */
struct worker {
	pid_t pid;                      /* 0 when not running */
	double started;                 /* mono() */
	double restart_at;              /* mono() when to start it again, 0 = not due */
	unsigned crashes;               /* consecutive quick deaths: backoff */
};

static pid_t spawn_worker(const char *file, struct ruleset *rs, const sigset_t *mask, int idx,
			  struct metrics *m)
{
	pid_t pid = fork();

	if (pid < 0) {
		LOG(LOG_ERR, "fork: %s", strerror(errno));
		return 0;
	}
	if (pid == 0) {
		/* a worker dies with its master: no orphan keeps serving old rules */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() == 1)
			_exit(1);
		struct agent_opts o = {.reuseport = true, .metrics = m, .worker = (unsigned)idx};
		struct ruleset *fresh;

		/* the file may have been reloaded since the master read it: a restarted
		 * worker must run what its siblings run, so it reads the file again and
		 * keeps the master's copy only if the file is now broken */
		fresh = load(file, 1, true);
		if (fresh) {
			ruleset_unref(rs);
			rs = fresh;
		}
		LOG(LOG_INFO, "worker %d started", idx);
		_exit(run_agent(file, rs, &o, mask));
	}
	return pid;
}

/*
 * The master of <n> worker processes sharing the listening ports with
 * SO_REUSEPORT: it restarts a worker that dies (with a backoff when one keeps
 * dying quickly), forwards SIGHUP (reload) and SIGUSR1 (stats) to every worker,
 * and on SIGTERM/SIGINT forwards the stop and exits 0 once all have drained.
 * Signals are taken synchronously with sigtimedwait(): no handler, no loop.
 */
static int run_master(const char *file, struct ruleset *rs, int n, struct metrics *m)
{
	struct worker w[64] = {{0}};
	sigset_t set, old;
	bool stopping = false;
	int i, live;

	agent_signals(&set);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, &old);
	LOG(LOG_NOTICE, "spoa-ratelimit %s master: %d workers", VERSION, n);
	for (i = 0; i < n; i++) {
		w[i].pid = spawn_worker(file, rs, &old, i, m);
		w[i].started = mono();
		if (!w[i].pid)
			w[i].restart_at = mono() + 1.; /* fork failed: try again */
	}
	for (;;) {
		struct timespec ts = {0, 100 * 1000 * 1000};
		siginfo_t info;
		pid_t pid;
		int sig, status;

		sig = sigtimedwait(&set, &info, &ts);
		if (sig == SIGHUP || sig == SIGUSR1 || sig == SIGTERM || sig == SIGINT) {
			if (sig == SIGTERM || sig == SIGINT) {
				if (!stopping)
					LOG(LOG_NOTICE, "master: stopping the workers");
				stopping = true;
				sig = SIGTERM;
			}
			for (i = 0; i < n; i++)
				if (w[i].pid)
					kill(w[i].pid, sig);
		}
		while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
			for (i = 0; i < n; i++) {
				if (w[i].pid != pid)
					continue;
				w[i].pid = 0;
				if (stopping)
					break;
				if (WIFSIGNALED(status))
					LOG(LOG_ERR, "worker %d (pid %d) killed by signal %d", i,
					    (int)pid, WTERMSIG(status));
				else
					LOG(LOG_ERR, "worker %d (pid %d) exited with status %d", i,
					    (int)pid, WEXITSTATUS(status));
				w[i].crashes = mono() - w[i].started < 10 ? w[i].crashes + 1 : 0;
				w[i].restart_at = mono() + (w[i].crashes ? 0.1 * (1u << (w[i].crashes < 6 ? w[i].crashes : 6)) : 0.05);
			}
		}
		live = 0;
		for (i = 0; i < n; i++) {
			if (!stopping && !w[i].pid && w[i].restart_at && mono() >= w[i].restart_at) {
				w[i].restart_at = 0;
				w[i].pid = spawn_worker(file, rs, &old, i, m);
				w[i].started = mono();
				if (!w[i].pid)
					w[i].restart_at = mono() + 1.; /* fork failed: try again */
				else
					LOG(LOG_NOTICE, "worker %d restarted (pid %d)", i,
					    (int)w[i].pid);
			}
			if (w[i].pid)
				live++;
		}
		if (stopping && !live) {
			LOG(LOG_NOTICE, "master: all workers stopped, exiting");
			ruleset_unref(rs);
			return 0;
		}
	}
}

/*
 * What -c says beyond errors, when post-charges are configured: how much debt
 * each limit can carry. A bucket owes at most GCRA_DEBT_MAX ticks (two to four
 * times its burst); a sliding log records one entry per token, at most
 * LOG_ADD_MAX a call and never more than its limit + LOG_ADD_MAX; a window's
 * count past its limit lasts until the window ends (not said: it is what a
 * window is).
 */
static void check_notes(const struct ruleset *rs)
{
	const struct agent_config *c = rs->cfg;
	bool post = c->post.set;
	size_t i;

	for (i = 0; i < c->nendpoints; i++)
		post = post || c->endpoints[i].post.set;
	if (!post)
		return;
	for (i = 0; i < c->nlimits; i++) {
		const struct limit_params *lp = &rs->limits[i].lp;

		if (lp->alg == ALG_SLIDING_LOG)
			printf("note: limit '%s' (sliding_log) owes at most %d tokens: a post-charge "
			       "records at most %d and the log never holds more than its limit + %d\n",
			       c->limits[i].name, LOG_ADD_MAX, LOG_ADD_MAX, LOG_ADD_MAX);
		else if (lp->alg == ALG_GCRA)
			printf("note: limit '%s' (gcra) owes at most %lld tokens (%.0f s) after a "
			       "post-charge\n",
			       c->limits[i].name, (long long)(GCRA_DEBT_MAX / lp->a),
			       (double)GCRA_DEBT_MAX / (double)(INT64_C(1) << (lp->b % lp->a)) / 1e6);
	}
}

/*
 * What -c says of each concurrency limit: its slots are given back only by
 * HAProxy's response message, which the gateway must send with the slot.
 */
static void conc_notes(const char *file, const struct ruleset *rs)
{
	const struct agent_config *c = rs->cfg;

	for (size_t i = 0; i < c->nlimits; i++)
		if (c->limits[i].alg == ALG_CONCURRENCY)
			printf("%s: limit '%s': %llu requests in flight, each slot a lease of %.1f s: "
			       "HAProxy gives a slot back with the message '%s' and its slot "
			       "(haproxy/haproxy.cfg, rl_slot_held); without it, every slot is held "
			       "until its lease ends\n",
			       file, c->limits[i].name, (unsigned long long)c->limits[i].rate,
			       (double)c->limits[i].period_ms / 1000., c->post_message);
}

/*
 * What -c says of the Redis deadlines: with spoe_timeout, a decision is given
 * HAProxy's budget (its share, CFG_ANSWER_SHARE) whatever command_timeout_ms
 * says; command_timeout_ms, derived unless set, bounds the other commands.
 */
static void deadline_notes(const char *file, const struct agent_config *c)
{
	unsigned budget = config_answer_budget_ms(c), cmd = config_command_timeout_ms(c);
	const char *how = c->redis.command_timeout_ms ? "set"
			  : budget                    ? "derived from spoe_timeout"
						      : "derived: no spoe_timeout";

	char transport[512];

	if (c->store != STORE_KIND_REDIS)
		return;
	config_redis_transport(c, transport, sizeof(transport));
	printf("%s: redis: %s\n", file, transport);
	if (budget)
		printf("%s: redis deadlines: decisions %u ms after their NOTIFY arrived "
		       "(%.0f%% of spoe_timeout), other commands %u ms after they are sent "
		       "(command_timeout_ms, %s)\n",
		       file, budget, CFG_ANSWER_SHARE * 100, cmd, how);
	else
		printf("%s: redis deadlines: commands %u ms after they are sent "
		       "(command_timeout_ms, %s)\n", file, cmd, how);
}

/*
 * -c: what a local fallback limit divides its rate by, when some limit has one
 * without a local_rate of its own.
 */
static void check_fallback(const char *file, const struct agent_config *c)
{
	size_t i;

	for (i = 0; i < c->nlimits; i++)
		if (c->limits[i].on_failure == FAIL_LOCAL && !c->limits[i].local_rate)
			break;
	if (i == c->nlimits)
		return;
	if (c->gateways)
		printf("%s: fallback: local limits are rate / %u gateways (fallback.gateways)\n",
		       file, c->gateways);
	else if (c->store == STORE_KIND_REDIS)
		printf("%s: fallback: local limits are rate / the live gateways the heartbeats "
		       "count (fallback.gateways = \"auto\"; 1 until the first count)\n", file);
}

int main(int argc, char **argv)
{
	const char *file = "/etc/spoa-ratelimit/spoa-ratelimit.conf";
	bool check = false, debug = false, advise, tls_advise;
	char advice[512], tls_advice[512], fp_advice[768];
	struct ruleset *rs;
	int opt, workers = 0;

	if (argc > 1 && strcmp(argv[1], "ctl") == 0)
		return ctl_main(argc - 1, argv + 1);
	if (argc == 2 && strcmp(argv[1], "defaults") == 0)
		return config_defaults(stdout) < 0 ? 1 : 0;
	while ((opt = getopt(argc, argv, "f:cdw:Vh")) != -1) {
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
		case 'w':
			workers = atoi(optarg);
			if (workers < 1 || workers > 64) {
				fprintf(stderr, "-w: between 1 and 64 workers\n");
				return 2;
			}
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
	advise = config_password_advice(rs->cfg, advice, sizeof(advice));
	tls_advise = config_tls_advice(rs->cfg, tls_advice, sizeof(tls_advice));
	if (check) {
		if (advise)
			fprintf(stderr, "%s\n", advice);
		if (tls_advise)
			fprintf(stderr, "%s\n", tls_advice);
		if (config_metrics_advice(rs->cfg, advice, sizeof(advice)))
			fprintf(stderr, "%s\n", advice);
		if (config_fingerprint_advice(rs->cfg, fp_advice, sizeof(fp_advice)))
			fprintf(stderr, "%s\n", fp_advice);
		printf("%s: configuration is valid (%zu tiers, %zu limits, %zu endpoints)\n", file,
		       rs->ntiers, rs->cfg->nlimits, rs->nendpoints);
		if (rs->cand && rs->cand->cfg->cand_mode.sampled)
			printf("%s: candidate policy (%zu tiers, %zu limits, %zu endpoints), "
			       "sampled: %g%% of the clients\n", file, rs->cand->ntiers,
			       rs->cand->cfg->nlimits, rs->cand->nendpoints,
			       rs->cand->cfg->cand_mode.share * 100);
		else if (rs->cand)
			printf("%s: candidate policy (%zu tiers, %zu limits, %zu endpoints), exact\n",
			       file, rs->cand->ntiers, rs->cand->cfg->nlimits, rs->cand->nendpoints);
		check_notes(rs);
		conc_notes(file, rs);
		deadline_notes(file, rs->cfg);
		check_fallback(file, rs->cfg);
		ruleset_unref(rs);
		return 0;
	}
	log_set_level(debug ? LOG_DEBUG : rs->cfg->log_level);
	if (advise)
		LOG(LOG_WARN, "%s", advice);
	if (tls_advise)
		LOG(LOG_WARN, "%s", tls_advice);
	/* one gateway alone shows what it counts: a fleet's need the same secret */
	if (rs->cfg->store == STORE_KIND_REDIS &&
	    config_fingerprint_advice(rs->cfg, fp_advice, sizeof(fp_advice)))
		LOG(LOG_WARN, "%s", fp_advice);
	signal(SIGPIPE, SIG_IGN);
	if (!workers)
		workers = (int)rs->cfg->workers;
	if (workers > 1) {
		size_t i;

		for (i = 0; i < rs->cfg->nlisten; i++) {
			if (strncmp(rs->cfg->listen[i], "unix:", 5) == 0) {
				fprintf(stderr, "%s: several workers need TCP listeners (SO_REUSEPORT), "
						"not %s\n", file, rs->cfg->listen[i]);
				ruleset_unref(rs);
				return 1;
			}
		}
		return run_master(file, rs, workers, metrics_new((unsigned)workers));
	}
	{
		struct agent_opts o = {.reuseport = false, .metrics = metrics_new(1), .worker = 0};
		sigset_t set, old;

		/* the listeners open (and say so) before the signal watchers exist: a
		 * SIGHUP sent as soon as the port answers must wait and become a reload,
		 * not end the process by its default action */
		agent_signals(&set);
		sigprocmask(SIG_BLOCK, &set, &old);
		return run_agent(file, rs, &o, &old);
	}
}
