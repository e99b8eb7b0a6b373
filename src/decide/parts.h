/* SPDX-License-Identifier: MIT */
/* A decision's parts decided one after the other, then the decision finished. */
#ifndef AGENT_PARTS_H
#define AGENT_PARTS_H

struct decision;

void decision_next(struct decision *d);

#endif /* AGENT_PARTS_H */
