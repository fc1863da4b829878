/*
 * fake_state.h: internal to the fake driver (compiled into both libraries,
 * hidden). The "physical GPUs": configuration from the environment and the
 * shared state file that every process using the fake driver maps, so that
 * they all see the same device memory usage and the same busy timeline.
 */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#define FAKE_MAX_DEV 16
#define FAKE_MAX_PROC 256
/* Per-process kernel-time history, in buckets of 10 ms; 256 buckets keep
 * 2.56 s, enough for NVML's "since last second" queries plus queued work. */
#define FAKE_BUCKETS 256
#define FAKE_BUCKET_NS 10000000ULL
/* Bump the last byte when the layout below changes: old files get recreated. */
#define FAKE_STATE_MAGIC 0x46414b4547505502ULL /* "FAKEGPU" v2 */

#define FAKE_MIB (1024ULL * 1024ULL)

struct fake_config {
    int ndev;                              /* FAKE_CUDA_DEVICES */
    unsigned long long mem_total[FAKE_MAX_DEV]; /* FAKE_GPU_MEM_MB[_i], in bytes */
    unsigned long long granule;            /* FAKE_GPU_GRANULE */
    unsigned long long ctx_bytes;          /* FAKE_CTX_BYTES */
    unsigned long long ctx_create_ms;      /* FAKE_CTX_CREATE_MS */
    unsigned long long ctx_destroy_ms;     /* FAKE_CTX_DESTROY_MS */
    unsigned long long pool_trim_ms;       /* FAKE_POOL_TRIM_MS */
    int cuda_version;                      /* FAKE_CUDA_VERSION */
    unsigned long long ns_per_block;       /* FAKE_NS_PER_BLOCK */
    unsigned long long graph_blocks;       /* FAKE_GRAPH_BLOCKS */
    long long pid_offset;                  /* FAKE_NVML_PID_OFFSET */
    int nvml_fail;                         /* FAKE_NVML_FAIL: 0 no, 1 init, 2 process lists */
    char state_path[4096];                 /* FAKE_GPU_STATE */
};

/* One process's share of one device. Written by its owner only (under the
 * owner's in-process mutex), read by anyone. */
struct fake_proc_dev {
    _Atomic uint64_t used;                 /* bytes */
    _Atomic uint64_t busy_ns;              /* total kernel time launched */
    _Atomic uint64_t head;                 /* newest bucket number written */
    _Atomic uint64_t bucket[FAKE_BUCKETS]; /* kernel ns per 10 ms of CLOCK_MONOTONIC */
};

struct fake_proc {
    _Atomic int32_t pid; /* 0: free; -1: being reclaimed; else owner */
    uint32_t pad;
    struct fake_proc_dev dev[FAKE_MAX_DEV];
};

struct fake_dev {
    _Atomic uint64_t used;       /* bytes, all processes */
    _Atomic uint64_t busy_until; /* CLOCK_MONOTONIC ns when queued work ends */
    _Atomic uint64_t busy_ns;    /* total kernel time ever launched */
    uint64_t pad[5];             /* one cache line per device */
};

struct fake_state {
    _Atomic uint64_t magic;
    uint64_t size;
    struct fake_dev dev[FAKE_MAX_DEV];
    struct fake_proc proc[FAKE_MAX_PROC];
};

/* Read the FAKE_* environment (and warn on stderr about unparsable values). */
void fake_config_load(struct fake_config *c);

/* Map the state file at `path` (creating or re-creating it when its size or
 * magic is wrong) and prune the entries of dead processes. Returns the same
 * mapping while the path stays the same; NULL (with a message) on failure. */
struct fake_state *fake_state_map(const char *path);
/* Forget the mapping (the next fake_state_map maps again): after fork, reset. */
void fake_state_unmap(void);
void fake_state_atfork_prepare(void);
void fake_state_atfork_parent(void);
void fake_state_atfork_child(void);

/* Release every entry whose pid no longer exists (kill(pid, 0) == ESRCH). */
void fake_prune_dead(struct fake_state *s);
/* Claim the entry of `pid`: an entry left with this pid by a previous process
 * image is wiped and reused, else a free one is taken. -1 when full. */
int fake_proc_claim(struct fake_state *s, int pid);
/* Give the entry's usage back to the devices and free the entry. */
void fake_proc_release(struct fake_state *s, int idx);
/* Zero everything except the magic. */
void fake_state_zero(struct fake_state *s);

/* Add `bytes` to device `dev` unless that exceeds `total`; 0 or -1 (full). */
int fake_reserve(struct fake_state *s, int idx, int dev, uint64_t bytes, uint64_t total);
void fake_release(struct fake_state *s, int idx, int dev, uint64_t bytes);
/* a -= min(a, v), atomically. */
void fake_sat_sub(_Atomic uint64_t *a, uint64_t v);

uint64_t fake_now_ns(void);     /* CLOCK_MONOTONIC */
uint64_t fake_realtime_us(void); /* CLOCK_REALTIME, microseconds */
void fake_sleep_until(uint64_t mono_ns);

/* Queue `cost` ns of kernel time on `dev` after whatever is queued there
 * (by any process), charge it to entry `idx` (if >= 0); returns the end time. */
uint64_t fake_launch(struct fake_state *s, int idx, int dev, uint64_t cost);
/* Kernel ns of one entry's device share that fell in [a, b) (monotonic ns). */
uint64_t fake_busy_in_window(const struct fake_proc_dev *pd, uint64_t a, uint64_t b);

/* "GPU-fa4e0000-0000-0000-0000-0000000000<ii>" and its 16 bytes. */
void fake_uuid_string(int dev, char *buf, unsigned len);
void fake_uuid_bytes(int dev, unsigned char out[16]);
/* PCI bus number of physical device `dev` (domain 0, device 0, function 0). */
#define FAKE_PCI_BUS(dev) (0x10 + (dev))
#define FAKE_GPU_NAME "Fake H200"

#endif /* FAKE_STATE_H */
