/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_WORKER_H
#define KVMDIRTY_MIGRATE_WORKER_H

/*
 * A helper thread of the engine (the source's hasher, the destination's
 * verifier): the lock and condition it shares with its owner, and a quit
 * flag.  Its loop waits on cond, under lock, for work or for quit, and
 * finishes the work it was given before it quits.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

struct mig_worker {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool running, quit;
};

static inline int mig_worker_start(struct mig_worker *w, void *(*fn)(void *), void *arg)
{
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->quit = false;
	if (pthread_create(&w->thread, NULL, fn, arg)) {
		pthread_mutex_destroy(&w->lock);
		pthread_cond_destroy(&w->cond);
		return -EAGAIN;
	}
	w->running = true;
	return 0;
}

/* Tell it to quit once its work is done, and wait for it; a no-op if it never started. */
static inline void mig_worker_stop(struct mig_worker *w)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->lock);
	w->quit = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	w->running = false;
}

#endif
