/*
 * worker_pool.c -- pthreads backend (host) and serial backend (freestanding DSP test driver).
 */
#include "worker_pool.h"

#include "kdsp_ops.h"

#if !defined(KDSP_POOL_SERIAL)
#define KDSP_POOL_PTHREADS 1
#endif

#if defined(KDSP_POOL_PTHREADS)

#include <pthread.h>

typedef struct kdsp_worker_arg {
    struct kdsp_pool *pool;
    uint32_t index;
} kdsp_worker_arg;

struct kdsp_pool {
    uint32_t n_workers;
    uint32_t n_started;
    uint32_t pending;
    int stop;
    uint64_t generation;
    kdsp_task_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    pthread_t threads[KDSP_MAX_WORKERS];
    kdsp_worker_arg args[KDSP_MAX_WORKERS];
};

static void *kdsp_worker_main(void *p) {
    kdsp_worker_arg *wa = (kdsp_worker_arg *)p;
    kdsp_pool *pool = wa->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->generation == seen && !pool->stop) {
            pthread_cond_wait(&pool->cv_work, &pool->mu);
        }
        if (pool->stop) {
            break;
        }
        seen = pool->generation;
        kdsp_task_fn fn = pool->fn;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->mu);
        fn(arg, wa->index, pool->n_workers);
        pthread_mutex_lock(&pool->mu);
        pool->pending -= 1;
        if (pool->pending == 0) {
            pthread_cond_signal(&pool->cv_done);
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

uint64_t kdsp_pool_bytes(uint32_t n_workers) {
    (void)n_workers;
    return sizeof(kdsp_pool);
}

int kdsp_pool_init(void *mem, uint32_t n_workers, kdsp_pool **out) {
    if (mem == NULL || n_workers == 0 || n_workers > KDSP_MAX_WORKERS) {
        return -1;
    }
    kdsp_pool *pool = (kdsp_pool *)mem;
    pool->n_workers = n_workers;
    pool->n_started = 0;
    pool->pending = 0;
    pool->stop = 0;
    pool->generation = 0;
    pool->fn = NULL;
    pool->arg = NULL;
    if (pthread_mutex_init(&pool->mu, NULL) != 0) {
        return -1;
    }
    if (pthread_cond_init(&pool->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&pool->mu);
        return -1;
    }
    if (pthread_cond_init(&pool->cv_done, NULL) != 0) {
        pthread_cond_destroy(&pool->cv_work);
        pthread_mutex_destroy(&pool->mu);
        return -1;
    }
    for (uint32_t i = 1; i < n_workers; i++) {
        pool->args[i].pool = pool;
        pool->args[i].index = i;
        if (pthread_create(&pool->threads[i], NULL, kdsp_worker_main, &pool->args[i]) != 0) {
            kdsp_pool_release(pool);
            return -1;
        }
        pool->n_started = i;
    }
    *out = pool;
    return 0;
}

void kdsp_pool_run(kdsp_pool *pool, kdsp_task_fn fn, void *arg) {
    if (pool->n_workers > 1) {
        pthread_mutex_lock(&pool->mu);
        pool->fn = fn;
        pool->arg = arg;
        pool->pending = pool->n_workers - 1;
        pool->generation += 1;
        pthread_cond_broadcast(&pool->cv_work);
        pthread_mutex_unlock(&pool->mu);
    }
    fn(arg, 0, pool->n_workers);
    if (pool->n_workers > 1) {
        pthread_mutex_lock(&pool->mu);
        while (pool->pending != 0) {
            pthread_cond_wait(&pool->cv_done, &pool->mu);
        }
        pthread_mutex_unlock(&pool->mu);
    }
}

void kdsp_pool_release(kdsp_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 1; i <= pool->n_started; i++) {
        pthread_join(pool->threads[i], NULL);
    }
    pool->n_started = 0;
    pthread_cond_destroy(&pool->cv_done);
    pthread_cond_destroy(&pool->cv_work);
    pthread_mutex_destroy(&pool->mu);
}

const char *kdsp_pool_kind(void) {
    return "pthreads";
}

#else /* KDSP_POOL_SERIAL */

struct kdsp_pool {
    uint32_t n_workers;
    uint32_t _pad0;
};

uint64_t kdsp_pool_bytes(uint32_t n_workers) {
    (void)n_workers;
    return sizeof(kdsp_pool);
}

int kdsp_pool_init(void *mem, uint32_t n_workers, kdsp_pool **out) {
    if (mem == 0 || n_workers == 0 || n_workers > KDSP_MAX_WORKERS) {
        return -1;
    }
    kdsp_pool *pool = (kdsp_pool *)mem;
    pool->n_workers = n_workers;
    *out = pool;
    return 0;
}

/* Each virtual worker runs its share in turn: same split, same arithmetic, no threads. */
void kdsp_pool_run(kdsp_pool *pool, kdsp_task_fn fn, void *arg) {
    for (uint32_t w = 0; w < pool->n_workers; w++) {
        fn(arg, w, pool->n_workers);
    }
}

void kdsp_pool_release(kdsp_pool *pool) {
    (void)pool;
}

const char *kdsp_pool_kind(void) {
    return "serial";
}

#endif
