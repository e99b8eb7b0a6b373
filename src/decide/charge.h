/* SPDX-License-Identifier: MIT */
/* Charges after the answer: refunds of a split denial, post-charges. */
#ifndef AGENT_CHARGE_H
#define AGENT_CHARGE_H

#include "agent_int.h"

void refund(struct decision *d);
void cand_refund(struct decision *d, const struct part *pt);
void post_send(struct decision *d);
void post_counted(struct agent *a, enum post_outcome o);

#endif /* AGENT_CHARGE_H */
