/*
 * cuda_internal.h: what the three parts of the fake libcuda share.
 *   cuda_core.c  init, devices, contexts, errors, cuGetProcAddress, test exports
 *   cuda_mem.c   every allocation kind (linear, host, VMM, pools, arrays)
 *   cuda_exec.c  modules, streams, graphs and kernel launches
 *
 * Locking: one process-wide mutex, g_mu, guards every in-process table; each
 * exported function takes it for its whole body (FK_LOCKED) except where it
 * sleeps. Functions named fk_* expect it held. The shared state file is only
 * touched with atomics.
 */
#ifndef CUDA_INTERNAL_H
#define CUDA_INTERNAL_H

#include "fake_cuda.h"
#include "fake_state.h"

#include <pthread.h>
#include <stdint.h>

struct fctx {
    int ordinal;       /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    int phys;          /* device index in the state file and NVML */
    int primary;
    int alive;         /* 0 once destroyed / primary released to 0 */
    unsigned flags;
    int refcount;      /* primary only */
    uint64_t last_end; /* end of the last kernel queued in this context */
    struct fctx *next; /* every context ever created (never freed while in use) */
};

extern pthread_mutex_t g_mu;
extern struct fake_config g_cfg;
extern struct fake_state *g_st;
extern int g_inited;  /* 1 after a successful cuInit */
extern int g_nvis;    /* visible devices */
extern int g_vis[FAKE_MAX_DEV]; /* ordinal -> physical */

#define FK_LOCKED(expr)                         \
    do {                                        \
        CUresult fk_r_;                         \
        pthread_mutex_lock(&g_mu);              \
        fk_r_ = (expr);                         \
        pthread_mutex_unlock(&g_mu);            \
        return fk_r_;                           \
    } while (0)

/* FK_LOCKED for context creation: a real context takes 100 ms or more to create, which
 * FAKE_CTX_CREATE_MS models after the context's memory is charged, outside the lock. */
#define FK_LOCKED_CTX(expr)                                                       \
    do {                                                                          \
        CUresult fk_r_;                                                           \
        pthread_mutex_lock(&g_mu);                                                \
        fk_r_ = (expr);                                                           \
        unsigned long long fk_ms_ = g_cfg.ctx_create_ms;                          \
        pthread_mutex_unlock(&g_mu);                                              \
        if (fk_r_ == CUDA_SUCCESS && fk_ms_)                                      \
            fake_sleep_until(fake_now_ns() + fk_ms_ * 1000000ULL);                \
        return fk_r_;                                                             \
    } while (0)

/* FK_LOCKED for context destruction: a real destroy takes tens of milliseconds before the
 * context's memory is free and the call returns, which FAKE_CTX_DESTROY_MS models before the
 * memory is given back, outside the lock. */
#define FK_LOCKED_DESTROY(expr)                                                   \
    do {                                                                          \
        unsigned long long fk_ms_ = g_cfg.ctx_destroy_ms;                         \
        if (fk_ms_)                                                               \
            fake_sleep_until(fake_now_ns() + fk_ms_ * 1000000ULL);                \
        FK_LOCKED(expr);                                                          \
    } while (0)

#define FK_REQUIRE_INIT()                       \
    do {                                        \
        if (!g_inited)                          \
            return CUDA_ERROR_NOT_INITIALIZED;  \
    } while (0)

/* cuda_core.c */
CUresult fk_current(struct fctx **out);      /* INVALID_CONTEXT when none */
int fk_ctx_alive(const struct fctx *c);      /* c is a live context of ours */
CUresult fk_ordinal(CUdevice dev, int *phys); /* INVALID_DEVICE when out of range */
CUresult fk_charge(int phys, uint64_t bytes); /* OUT_OF_MEMORY past the device total */
void fk_uncharge(int phys, uint64_t bytes);
int fk_entry(void);                          /* our state-file entry, claimed on demand */
uint64_t fk_round(uint64_t bytes);           /* up to FAKE_GPU_GRANULE */

/* cuda_mem.c */
void fk_mem_ctx_teardown(const struct fctx *c); /* free what the context allocated */
void fk_mem_forget(void);                       /* drop every table (fork child, reset) */

/* cuda_exec.c */
/* Resolve a stream argument: NULL / legacy / per-thread mean the current
 * context's default stream (*st = NULL). */
CUresult fk_stream(CUstream hs, struct fctx **ctx, void **st);
void fk_exec_ctx_teardown(const struct fctx *c);
void fk_exec_forget(void);

#endif /* CUDA_INTERNAL_H */
