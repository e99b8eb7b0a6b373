/* SPDX-License-Identifier: MIT */
/* `spoa-ratelimit ctl ...`: list, add and remove live overrides in Redis. */
#ifndef AGENT_CTL_H
#define AGENT_CTL_H

int ctl_main(int argc, char **argv);

#endif /* AGENT_CTL_H */
