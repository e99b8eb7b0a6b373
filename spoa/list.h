/* SPDX-License-Identifier: MIT */
/*
 * A small intrusive doubly linked list. glibc's <sys/queue.h> has no safe
 * iteration macro, hence this. An empty list head points at itself; a node
 * that is on no list is kept self-linked too, so list_del() is idempotent.
 */
#ifndef SPOA_LIST_H
#define SPOA_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list {
	struct list *next;
	struct list *prev;
};

#define container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

#define LIST_ELEM(ptr, type, member) container_of(ptr, type, member)

static inline void list_init(struct list *l)
{
	l->next = l;
	l->prev = l;
}

static inline bool list_empty(const struct list *l)
{
	return l->next == l;
}

/* Appends <n> at the tail of <head>. */
static inline void list_append(struct list *head, struct list *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}

/* Unlinks <n> and leaves it self-linked. */
static inline void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

/* Iterates over the nodes of <head>; <n> may be unlinked inside the body. */
#define list_for_each_safe(n, tmp, head)                                                   \
	for ((n) = (head)->next, (tmp) = (n)->next; (n) != (head); (n) = (tmp), (tmp) = (n)->next)

#endif /* SPOA_LIST_H */
