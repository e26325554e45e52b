/*
 * worker_pool.h -- split one op across N workers.
 *
 * The whole threading surface of the library is these five functions, so the DSP build can swap
 * the backend: pthreads on the host (worker_pool.c, KDSP_POOL_PTHREADS), a serial loop over the
 * N virtual workers for the freestanding Hexagon test driver (KDSP_POOL_SERIAL), and QuRT threads
 * (qurt_thread_create / qurt_barrier) in a Hexagon SDK build, which slot into the same functions.
 * Worker 0 is always the calling thread. A pool runs one task at a time.
 */
#ifndef KDSP_WORKER_POOL_H
#define KDSP_WORKER_POOL_H

#include <stdint.h>

/* Called once per worker; every worker of a run gets the same fn/arg. */
typedef void (*kdsp_task_fn)(void *arg, uint32_t worker, uint32_t n_workers);

typedef struct kdsp_pool kdsp_pool;

/* Bytes of memory kdsp_pool_init needs (16-byte aligned). */
uint64_t kdsp_pool_bytes(uint32_t n_workers);

/* Start n_workers - 1 threads in mem; returns 0 on success. */
int kdsp_pool_init(void *mem, uint32_t n_workers, kdsp_pool **out);

/* Run fn(arg, w, n) for every worker w and return when all have finished. */
void kdsp_pool_run(kdsp_pool *pool, kdsp_task_fn fn, void *arg);

/* Stop and join the threads. */
void kdsp_pool_release(kdsp_pool *pool);

/* "pthreads" or "serial". */
const char *kdsp_pool_kind(void);

#endif /* KDSP_WORKER_POOL_H */
