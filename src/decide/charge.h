/* SPDX-License-Identifier: MIT */
/* Charges after the answer: refunds of a split denial, post-charges. */
#ifndef AGENT_CHARGE_H
#define AGENT_CHARGE_H

#include "agent_int.h"

void refund(struct decision *d);
void cand_refund(struct decision *d, const struct part *pt);
void cand_release(struct decision *d);
void slots_denied(struct decision *d);
void post_send(struct decision *d);
void post_counted(struct agent *a, enum post_outcome o);
void slots_note_held(struct decision *d);
size_t slots_give_back(struct agent *a);
bool slots_release(struct agent *a, int64_t slot);
size_t slots_held(struct agent *a);
void slots_free(struct agent *a);

#endif /* AGENT_CHARGE_H */
