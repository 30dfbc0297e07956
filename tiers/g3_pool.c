/* g3_pool.c - a pool of threads taking ops from one FIFO (g3_internal.h):
 * the thread-pool engine's transfers and the coder threads' coding. */
#include <errno.h>
#include <stdlib.h>

#include "tiers/g3_internal.h"

static void *pool_main(void *arg) {
  g3_pool *p = arg;
  void *state = NULL;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->q.head && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
    g3_op *op = g3_q_pop(&p->q);
    pthread_mutex_unlock(&p->mu);
    if (!op) break;
    p->fn(p->arg, op, &state);
  }
  p->fn(p->arg, NULL, &state); /* the thread ends: its state goes */
  return NULL;
}

void g3_pool_push(g3_pool *p, g3_op *op) {
  pthread_mutex_lock(&p->mu);
  g3_q_push(&p->q, op);
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void g3_pool_stop(g3_pool *p) {
  if (!p->t) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (unsigned i = 0; i < p->n; i++) pthread_join(p->t[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->t);
  p->t = NULL;
}

int g3_pool_start(g3_pool *p, unsigned n, g3_pool_fn fn, void *arg) {
  *p = (g3_pool){.fn = fn, .arg = arg};
  if (!(p->t = calloc(n, sizeof *p->t))) return -ENOMEM;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (unsigned i = 0; i < n; i++) {
    int rc = pthread_create(&p->t[i], NULL, pool_main, p);
    if (rc) {
      g3_pool_stop(p);
      return -rc;
    }
    p->n++;
  }
  return 0;
}
