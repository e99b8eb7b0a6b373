/* SPDX-License-Identifier: MIT */
/* A NOTIFY's messages read: a decision or a post-charge begins (the SPOP server's handler). */
#ifndef AGENT_NOTIFY_H
#define AGENT_NOTIFY_H

struct spoa_req;
struct spop_rd;

void notify_receive(struct spoa_req *req, struct spop_rd *msgs, void *arg);

#endif /* AGENT_NOTIFY_H */
