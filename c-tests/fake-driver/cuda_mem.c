/*
 * cuda_mem.c: every kind of allocation of the fake libcuda.
 *
 * Device memory is a number in the shared state file (fk_charge): the
 * addresses handed out are made up, never backed, never dereferenced. Each
 * allocation is remembered here so that a free of an unknown pointer fails as
 * the real driver does and the size to give back is known. Sizes are rounded
 * up to FAKE_GPU_GRANULE, as real allocations are rounded to pages.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------- made-up address space ---------------- */

struct arena {
    uint64_t base, size, next;
    int wrapped; /* once wrapped, candidates are checked against live ranges */
};

/* One TiB of addresses per physical device, 32-bit addresses for the legacy
 * v1 API, and a separate range for cuMemAddressReserve. */
#define DEV_ARENA_BASE 0x7f0000000000ULL
#define DEV_ARENA_SIZE (1ULL << 40)
static struct arena g_dev_arena[FAKE_MAX_DEV];
static struct arena g_low_arena = {0x10000000ULL, 0xE0000000ULL, 0, 0};
static struct arena g_va_arena = {0x600000000000ULL, 1ULL << 44, 0, 0};

static uint64_t round_to(uint64_t x, uint64_t a)
{
    return x > UINT64_MAX - a ? 0 : (x + a - 1) / a * a;
}

/* ---------------- tables ---------------- */

enum rec_kind { RK_LINEAR, RK_MANAGED, RK_POOL, RK_ARRAY, RK_MIPMAP };

struct fpool {
    int ordinal, phys;
    int is_default;
    int destroyed;      /* destroyed while allocations were outstanding */
    uint64_t reserved;  /* bytes charged to the device */
    uint64_t inuse;     /* bytes in live allocations */
    uint64_t max_size;  /* 0: unlimited */
    struct fpool *next;
};

struct rec {
    int kind;
    CUdeviceptr ptr;        /* 0 for arrays: their handle is the rec itself */
    uint64_t req, bytes;    /* requested, charged */
    int phys;
    const struct fctx *ctx; /* owner; NULL for pool memory (lives with the pool) */
    struct fpool *pool;
    struct rec *next;
};

struct hostrec {
    void *p;
    struct hostrec *next;
};

struct vhandle {
    CUmemGenericAllocationHandle id;
    uint64_t size;
    int phys;
    CUmemAllocationProp prop;
    int released; /* cuMemRelease called; memory lives until the last unmap */
    int maps;
    struct vhandle *next;
};

struct vres {
    CUdeviceptr base;
    uint64_t size;
    struct vres *next;
};

struct vmap {
    CUdeviceptr va;
    uint64_t size;
    struct vhandle *h;
    struct vmap *next;
};

static struct rec *g_recs;
static struct hostrec *g_hosts;
static struct fpool *g_pools;
static struct fpool *g_default_pool[FAKE_MAX_DEV]; /* by ordinal */
static struct vhandle *g_handles;
static struct vres *g_reserves;
static struct vmap *g_maps;
static CUmemGenericAllocationHandle g_next_handle = 0x1000;

/* Is [p, p+n) free of every live range? If not, *end is where the first
 * conflicting range ends. */
static int range_free(uint64_t p, uint64_t n, uint64_t *end)
{
    for (struct rec *r = g_recs; r; r = r->next)
        if (r->ptr && p < r->ptr + r->bytes && r->ptr < p + n) {
            *end = r->ptr + r->bytes;
            return 0;
        }
    for (struct vres *v = g_reserves; v; v = v->next)
        if (p < v->base + v->size && v->base < p + n) {
            *end = v->base + v->size;
            return 0;
        }
    return 1;
}

/* Bump allocation; after the first wrap, first fit among live ranges. */
static uint64_t addr_alloc(struct arena *a, uint64_t n, uint64_t align)
{
    uint64_t end = a->base + a->size;
    if (!a->next)
        a->next = a->base;
    if (n == 0 || n > a->size)
        return 0;
    if (!a->wrapped) {
        uint64_t p = round_to(a->next, align);
        if (p && p + n <= end) {
            a->next = p + n;
            return p;
        }
        a->wrapped = 1;
        a->next = a->base;
    }
    uint64_t p = round_to(a->next, align);
    int restarted = 0;
    for (;;) {
        uint64_t cend;
        if (!p || p + n > end) {
            if (restarted)
                return 0;
            restarted = 1;
            p = round_to(a->base, align);
            continue;
        }
        if (range_free(p, n, &cend)) {
            a->next = p + n;
            return p;
        }
        p = round_to(cend, align);
    }
}

static struct arena *dev_arena(int phys)
{
    struct arena *a = &g_dev_arena[phys];
    if (!a->base) {
        a->base = DEV_ARENA_BASE + (uint64_t)phys * DEV_ARENA_SIZE;
        a->size = DEV_ARENA_SIZE;
    }
    return a;
}

static struct rec *rec_new(int kind, uint64_t req, uint64_t bytes, int phys,
                           const struct fctx *ctx)
{
    struct rec *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->kind = kind;
    r->req = req;
    r->bytes = bytes;
    r->phys = phys;
    r->ctx = ctx;
    return r;
}

static void rec_link(struct rec *r)
{
    r->next = g_recs;
    g_recs = r;
}

static void rec_unlink(struct rec *r)
{
    for (struct rec **pp = &g_recs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            return;
        }
}

/* The allocation that starts exactly at p (frees need the base address). */
static struct rec *rec_at(CUdeviceptr p)
{
    for (struct rec *r = g_recs; r; r = r->next)
        if (r->ptr == p && r->ptr)
            return r;
    return NULL;
}

static struct rec *rec_handle(const void *h, int kind)
{
    for (struct rec *r = g_recs; r; r = r->next)
        if ((const void *)r == h && r->kind == kind)
            return r;
    return NULL;
}

static void pool_free_struct(struct fpool *p)
{
    for (struct fpool **pp = &g_pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

/* An allocation goes back to its pool; the pool keeps the memory reserved
 * (until cuMemPoolTrimTo), unless it was destroyed meanwhile. */
static void pool_return(struct rec *r)
{
    struct fpool *p = r->pool;
    p->inuse -= r->bytes;
    if (p->destroyed) {
        p->reserved -= r->bytes;
        fk_uncharge(p->phys, r->bytes);
        if (p->inuse == 0)
            pool_free_struct(p);
    }
}

static void rec_drop(struct rec *r)
{
    if (r->kind == RK_POOL)
        pool_return(r);
    else
        fk_uncharge(r->phys, r->bytes);
    rec_unlink(r);
    free(r);
}

void fk_mem_ctx_teardown(const struct fctx *c)
{
    struct rec *r = g_recs, *n;
    for (; r; r = n) {
        n = r->next;
        if (r->ctx == c)
            rec_drop(r);
    }
}

/* Forget (without giving back: the state was zeroed, or is the parent's). Host
 * blocks stay known: host memory does not depend on device state. */
void fk_mem_forget(void)
{
    while (g_recs) {
        struct rec *n = g_recs->next;
        free(g_recs);
        g_recs = n;
    }
    while (g_pools) {
        struct fpool *n = g_pools->next;
        free(g_pools);
        g_pools = n;
    }
    memset(g_default_pool, 0, sizeof g_default_pool);
    while (g_handles) {
        struct vhandle *n = g_handles->next;
        free(g_handles);
        g_handles = n;
    }
    while (g_reserves) {
        struct vres *n = g_reserves->next;
        free(g_reserves);
        g_reserves = n;
    }
    while (g_maps) {
        struct vmap *n = g_maps->next;
        free(g_maps);
        g_maps = n;
    }
}

/* ---------------- linear device memory ---------------- */

static CUresult lin_alloc(CUdeviceptr *dptr, uint64_t req, int kind, int low)
{
    struct fctx *c;
    FK_REQUIRE_INIT();
    if (!dptr || req == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    uint64_t bytes = fk_round(req);
    r = fk_charge(c->phys, bytes);
    if (r)
        return r;
    struct rec *rc = rec_new(kind, req, bytes, c->phys, c);
    uint64_t p = rc ? addr_alloc(low ? &g_low_arena : dev_arena(c->phys), bytes, g_cfg.granule) : 0;
    if (!p) {
        free(rc);
        fk_uncharge(c->phys, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc->ptr = p;
    rec_link(rc);
    *dptr = p;
    return CUDA_SUCCESS;
}

static CUresult lin_free(CUdeviceptr p)
{
    FK_REQUIRE_INIT();
    if (p == 0)
        return CUDA_SUCCESS;
    struct rec *r = rec_at(p);
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    rec_drop(r); /* cuMemFree also takes stream-ordered (pool) memory */
    return CUDA_SUCCESS;
}

/* Pitch: rows padded to 512 bytes, a typical texture pitch alignment. */
static CUresult pitch_alloc(CUdeviceptr *dptr, size_t *pitch, uint64_t width, uint64_t height,
                            unsigned elem, int low)
{
    uint64_t bytes;
    if (!pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = round_to(width, 512);
    if (!p || __builtin_mul_overflow(p, height, &bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = lin_alloc(dptr, bytes, RK_LINEAR, low);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

static CUresult mem_info(size_t *free_out, size_t *total_out)
{
    struct fctx *c;
    FK_REQUIRE_INIT();
    if (!free_out || !total_out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    uint64_t total = g_cfg.mem_total[c->phys];
    fake_prune_dead(g_st);
    uint64_t used = atomic_load(&g_st->dev[c->phys].used);
    *total_out = total;
    *free_out = used < total ? total - used : 0;
    return CUDA_SUCCESS;
}

static CUresult addr_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr d)
{
    FK_REQUIRE_INIT();
    for (struct rec *r = g_recs; r; r = r->next)
        if (r->ptr && d >= r->ptr && d < r->ptr + r->req) {
            if (pbase)
                *pbase = r->ptr;
            if (psize)
                *psize = r->req;
            return CUDA_SUCCESS;
        }
    for (struct vmap *m = g_maps; m; m = m->next)
        if (d >= m->va && d < m->va + m->size) {
            if (pbase)
                *pbase = m->va;
            if (psize)
                *psize = m->size;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FK_LOCKED(lin_alloc(dptr, bytesize, RK_LINEAR, 0));
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    /* Managed memory counts against the device like the rest (the driver
     * would place it lazily; the limiter under test counts it up front). */
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    FK_LOCKED(lin_alloc(dptr, bytesize, RK_MANAGED, 0));
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    FK_LOCKED(pitch_alloc(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, 0));
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { FK_LOCKED(lin_free(dptr)); }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) { FK_LOCKED(mem_info(free, total)); }
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FK_LOCKED(addr_range(pbase, psize, dptr));
}

/* Legacy 32-bit ABI (CUDA < 3.2): pointers from the low arena, sizes clamped. */
static unsigned int clamp32(uint64_t v) { return v > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)v; }

static CUresult v1_alloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CUdeviceptr p;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lin_alloc(&p, bytesize, RK_LINEAR, 1);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    return r;
}

static CUresult v1_pitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                         unsigned int elem)
{
    CUdeviceptr p;
    size_t pt;
    if (!dptr || !pitch)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = pitch_alloc(&p, &pt, w, h, elem, 1);
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)p;
        *pitch = (unsigned int)pt;
    }
    return r;
}

static CUresult v1_info(unsigned int *free_out, unsigned int *total_out)
{
    size_t f, t;
    if (!free_out || !total_out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mem_info(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_out = clamp32(f);
        *total_out = clamp32(t);
    }
    return r;
}

static CUresult v1_range(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 d)
{
    CUdeviceptr b;
    size_t s;
    CUresult r = addr_range(&b, &s, d);
    if (r == CUDA_SUCCESS) {
        if (pbase)
            *pbase = (CUdeviceptr_v1)b;
        if (psize)
            *psize = clamp32(s);
    }
    return r;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) { FK_LOCKED(v1_alloc(dptr, bytesize)); }
CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    FK_LOCKED(v1_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
}
CUresult cuMemFree(CUdeviceptr_v1 dptr) { FK_LOCKED(lin_free(dptr)); }
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) { FK_LOCKED(v1_info(free, total)); }
CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr)
{
    FK_LOCKED(v1_range(pbase, psize, dptr));
}

/* ---------------- host memory (not device memory: never counted) ---------------- */

static CUresult host_alloc(void **pp, uint64_t bytes, unsigned int flags)
{
    struct fctx *c;
    FK_REQUIRE_INIT();
    if (!pp || bytes == 0 || (flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    struct hostrec *h = malloc(sizeof *h);
    void *p = h ? malloc(bytes) : NULL;
    if (!p) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->p = p;
    h->next = g_hosts;
    g_hosts = h;
    *pp = p;
    return CUDA_SUCCESS;
}

static CUresult host_free(void *p)
{
    FK_REQUIRE_INIT();
    for (struct hostrec **pp = &g_hosts; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            struct hostrec *h = *pp;
            *pp = h->next;
            free(h->p);
            free(h);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize) { FK_LOCKED(host_alloc(pp, bytesize, 0)); }
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { FK_LOCKED(host_alloc(pp, bytesize, 0)); }
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    FK_LOCKED(host_alloc(pp, bytesize, Flags));
}
CUresult cuMemFreeHost(void *p) { FK_LOCKED(host_free(p)); }

/* ---------------- virtual memory management ---------------- */

static CUresult prop_device(const CUmemAllocationProp *prop, int *phys)
{
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE; /* host-located VMM memory is not modelled */
    return fk_ordinal(prop->location.id, phys);
}

static struct vhandle *handle_find(CUmemGenericAllocationHandle id)
{
    for (struct vhandle *h = g_handles; h; h = h->next)
        if (h->id == id && !h->released)
            return h;
    return NULL;
}

static void handle_free(struct vhandle *h)
{
    fk_uncharge(h->phys, h->size);
    for (struct vhandle **pp = &g_handles; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    free(h);
}

static CUresult vmm_create(CUmemGenericAllocationHandle *handle, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!handle || !prop || flags || size == 0 || size % g_cfg.granule)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = prop_device(prop, &phys);
    if (r)
        return r;
    struct vhandle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = fk_charge(phys, size); /* no context needed, as with the real driver */
    if (r) {
        free(h);
        return r;
    }
    h->id = g_next_handle++;
    h->size = size;
    h->phys = phys;
    h->prop = *prop;
    h->next = g_handles;
    g_handles = h;
    *handle = h->id;
    return CUDA_SUCCESS;
}

static CUresult vmm_release(CUmemGenericAllocationHandle id)
{
    FK_REQUIRE_INIT();
    struct vhandle *h = handle_find(id);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    h->released = 1;
    if (h->maps == 0)
        handle_free(h);
    return CUDA_SUCCESS;
}

static CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                            unsigned long long flags)
{
    (void)addr; /* only a hint for the real driver too */
    FK_REQUIRE_INIT();
    if (!ptr || flags || size == 0 || size % g_cfg.granule)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment == 0)
        alignment = g_cfg.granule;
    if (alignment & (alignment - 1))
        return CUDA_ERROR_INVALID_VALUE;
    struct vres *v = calloc(1, sizeof *v);
    uint64_t p = v ? addr_alloc(&g_va_arena, size, alignment) : 0;
    if (!p) {
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->base = p;
    v->size = size;
    v->next = g_reserves;
    g_reserves = v;
    *ptr = p;
    return CUDA_SUCCESS;
}

static CUresult vmm_addr_free(CUdeviceptr ptr, size_t size)
{
    FK_REQUIRE_INIT();
    for (struct vres **pp = &g_reserves; *pp; pp = &(*pp)->next) {
        struct vres *v = *pp;
        if (v->base != ptr || v->size != size)
            continue;
        for (struct vmap *m = g_maps; m; m = m->next)
            if (m->va >= ptr && m->va < ptr + size)
                return CUDA_ERROR_INVALID_VALUE; /* still mapped: unmap first */
        *pp = v->next;
        free(v);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset,
                        CUmemGenericAllocationHandle id, unsigned long long flags)
{
    FK_REQUIRE_INIT();
    /* The documented constraints: offset 0, flags 0, granule multiples. */
    if (flags || offset || size == 0 || size % g_cfg.granule || ptr % g_cfg.granule)
        return CUDA_ERROR_INVALID_VALUE;
    struct vhandle *h = handle_find(id);
    if (!h || size > h->size)
        return CUDA_ERROR_INVALID_VALUE;
    int inside = 0;
    for (struct vres *v = g_reserves; v; v = v->next)
        if (ptr >= v->base && ptr + size <= v->base + v->size)
            inside = 1;
    if (!inside)
        return CUDA_ERROR_INVALID_VALUE;
    for (struct vmap *m = g_maps; m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size)
            return CUDA_ERROR_INVALID_VALUE; /* already mapped */
    struct vmap *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->va = ptr;
    m->size = size;
    m->h = h;
    m->next = g_maps;
    g_maps = m;
    h->maps++;
    return CUDA_SUCCESS;
}

static CUresult vmm_unmap(CUdeviceptr ptr, size_t size)
{
    FK_REQUIRE_INIT();
    int found = 0;
    for (struct vmap *m = g_maps; m; m = m->next) {
        int overlap = ptr < m->va + m->size && m->va < ptr + size;
        int within = m->va >= ptr && m->va + m->size <= ptr + size;
        if (overlap && !within)
            return CUDA_ERROR_INVALID_VALUE; /* would split a mapping */
        found |= within;
    }
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    for (struct vmap **pp = &g_maps; *pp;) {
        struct vmap *m = *pp;
        if (m->va >= ptr && m->va + m->size <= ptr + size) {
            *pp = m->next;
            if (--m->h->maps == 0 && m->h->released)
                handle_free(m->h); /* the physical memory goes with the last mapping */
            free(m);
        } else {
            pp = &m->next;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        CUmemAccess_flags f = desc[i].flags;
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            return CUDA_ERROR_INVALID_VALUE;
        CUresult r = fk_ordinal(desc[i].location.id, &phys);
        if (r)
            return r;
    }
    /* The whole range must be mapped. */
    for (uint64_t pos = ptr; pos < ptr + size;) {
        struct vmap *hit = NULL;
        for (struct vmap *m = g_maps; m && !hit; m = m->next)
            if (pos >= m->va && pos < m->va + m->size)
                hit = m;
        if (!hit)
            return CUDA_ERROR_INVALID_VALUE;
        pos = hit->va + hit->size;
    }
    return CUDA_SUCCESS;
}

static CUresult vmm_granularity(size_t *gran, const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!gran || !prop || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                           option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = prop_device(prop, &phys);
    if (r)
        return r;
    *gran = g_cfg.granule;
    return CUDA_SUCCESS;
}

static CUresult vmm_props(CUmemAllocationProp *prop, CUmemGenericAllocationHandle id)
{
    FK_REQUIRE_INIT();
    struct vhandle *h = handle_find(id);
    if (!prop || !h)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = h->prop;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    FK_LOCKED(vmm_create(handle, size, prop, flags));
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { FK_LOCKED(vmm_release(handle)); }
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    FK_LOCKED(vmm_reserve(ptr, size, alignment, addr, flags));
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { FK_LOCKED(vmm_addr_free(ptr, size)); }
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    FK_LOCKED(vmm_map(ptr, size, offset, handle, flags));
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { FK_LOCKED(vmm_unmap(ptr, size)); }
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    FK_LOCKED(vmm_set_access(ptr, size, desc, count));
}
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    FK_LOCKED(vmm_granularity(granularity, prop, option));
}
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                CUmemGenericAllocationHandle handle)
{
    FK_LOCKED(vmm_props(prop, handle));
}

/* ---------------- stream-ordered allocator ---------------- */

static struct fpool *pool_find(CUmemoryPool h)
{
    for (struct fpool *p = g_pools; p; p = p->next)
        if ((CUmemoryPool)p == h && !p->destroyed)
            return p;
    return NULL;
}

static struct fpool *pool_new(int ordinal, int phys, int is_default, uint64_t max_size)
{
    struct fpool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->ordinal = ordinal;
    p->phys = phys;
    p->is_default = is_default;
    p->max_size = max_size;
    p->next = g_pools;
    g_pools = p;
    return p;
}

static struct fpool *default_pool(int ordinal)
{
    if (!g_default_pool[ordinal])
        g_default_pool[ordinal] = pool_new(ordinal, g_vis[ordinal], 1, 0);
    return g_default_pool[ordinal];
}

/* Memory comes from the pool's reserve; the reserve grows (charging the
 * device) when it has too little free, and never shrinks on free. */
static CUresult pool_alloc(CUdeviceptr *dptr, uint64_t req, CUmemoryPool hpool, CUstream hs,
                           int use_default)
{
    struct fctx *c;
    void *st;
    FK_REQUIRE_INIT();
    if (!dptr || req == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_stream(hs, &c, &st);
    if (r)
        return r;
    struct fpool *p = use_default ? default_pool(c->ordinal) : pool_find(hpool);
    if (!p)
        return use_default ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = fk_round(req), need = p->inuse + bytes;
    if (p->max_size && need > p->max_size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t grow = need > p->reserved ? need - p->reserved : 0;
    struct rec *rc = rec_new(RK_POOL, req, bytes, p->phys, NULL);
    uint64_t a = rc ? addr_alloc(dev_arena(p->phys), bytes, g_cfg.granule) : 0;
    if (!a) {
        free(rc);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r = fk_charge(p->phys, grow);
    if (r) {
        free(rc);
        return r;
    }
    p->reserved += grow;
    p->inuse += bytes;
    rc->ptr = a;
    rc->pool = p;
    rec_link(rc);
    *dptr = a;
    return CUDA_SUCCESS;
}

static CUresult pool_free_async(CUdeviceptr d, CUstream hs)
{
    struct fctx *c;
    void *st;
    FK_REQUIRE_INIT();
    CUresult r = fk_stream(hs, &c, &st);
    if (r)
        return r;
    struct rec *rc = rec_at(d);
    if (!rc || rc->kind != RK_POOL)
        return CUDA_ERROR_INVALID_VALUE;
    rec_drop(rc);
    return CUDA_SUCCESS;
}

static CUresult pool_create(CUmemoryPool *out, const CUmemPoolProps *props)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!out || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(props->location.id, &phys);
    if (r)
        return r;
    struct fpool *p = pool_new(props->location.id, phys, 0, props->maxSize);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* Free reserve goes now; memory still in use goes back as it is freed. */
static CUresult pool_destroy(CUmemoryPool h)
{
    FK_REQUIRE_INIT();
    struct fpool *p = pool_find(h);
    if (!p || p->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    fk_uncharge(p->phys, p->reserved - p->inuse);
    p->reserved = p->inuse;
    p->destroyed = 1;
    if (p->inuse == 0)
        pool_free_struct(p);
    return CUDA_SUCCESS;
}

static CUresult pool_trim(CUmemoryPool h, size_t keep)
{
    FK_REQUIRE_INIT();
    struct fpool *p = pool_find(h);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t target = fk_round(keep);
    if (target < p->inuse)
        target = p->inuse;
    if (p->reserved > target) {
        fk_uncharge(p->phys, p->reserved - target);
        p->reserved = target;
    }
    return CUDA_SUCCESS;
}

static CUresult dev_pool(CUmemoryPool *out, CUdevice dev)
{
    int phys;
    FK_REQUIRE_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_ordinal(dev, &phys);
    if (r)
        return r;
    struct fpool *p = default_pool(dev);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FK_LOCKED(pool_alloc(dptr, bytesize, NULL, hStream, 1));
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FK_LOCKED(pool_alloc(dptr, bytesize, NULL, hStream, 1));
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    FK_LOCKED(pool_alloc(dptr, bytesize, pool, hStream, 0));
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    FK_LOCKED(pool_alloc(dptr, bytesize, pool, hStream, 0));
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { FK_LOCKED(pool_free_async(dptr, hStream)); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    FK_LOCKED(pool_free_async(dptr, hStream));
}
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    FK_LOCKED(pool_create(pool, poolProps));
}
CUresult cuMemPoolDestroy(CUmemoryPool pool) { FK_LOCKED(pool_destroy(pool)); }
/* FAKE_POOL_TRIM_MS: the trim takes that long, before the driver's lock (other calls proceed). */
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    if (g_cfg.pool_trim_ms)
        fake_sleep_until(fake_now_ns() + g_cfg.pool_trim_ms * 1000000ULL);
    FK_LOCKED(pool_trim(pool, minBytesToKeep));
}
/* No cuDeviceSetMemPool here, so a device's current pool is its default pool. */
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) { FK_LOCKED(dev_pool(pool_out, dev)); }
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) { FK_LOCKED(dev_pool(pool, dev)); }

/* ---------------- arrays ---------------- */

static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

/* Bytes of a w x h x d array (0 extents mean 1), or 0 when invalid. */
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch)
{
    uint64_t e = format_bytes(f), v;
    if (!e || w == 0 || (ch != 1 && ch != 2 && ch != 4) || (d && !h))
        return 0;
    if (__builtin_mul_overflow(w, h ? h : 1, &v) || __builtin_mul_overflow(v, d ? d : 1, &v) ||
        __builtin_mul_overflow(v, e * ch, &v))
        return 0;
    return v;
}

static CUresult array_make(void **handle, uint64_t req, int kind)
{
    struct fctx *c;
    FK_REQUIRE_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (req == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_current(&c);
    if (r)
        return r;
    uint64_t bytes = fk_round(req);
    r = fk_charge(c->phys, bytes);
    if (r)
        return r;
    struct rec *rc = rec_new(kind, req, bytes, c->phys, c);
    if (!rc) {
        fk_uncharge(c->phys, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec_link(rc);
    *handle = rc; /* the record is the handle: never a device address */
    return CUDA_SUCCESS;
}

static CUresult array_destroy(const void *h, int kind)
{
    FK_REQUIRE_INIT();
    struct rec *r = rec_handle(h, kind);
    if (!r)
        return CUDA_ERROR_INVALID_HANDLE;
    rec_drop(r);
    return CUDA_SUCCESS;
}

static CUresult mipmap_create(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *d,
                              unsigned levels)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    int layered = (d->Flags & CUDA_ARRAY3D_LAYERED) != 0;
    uint64_t maxdim = d->Width;
    if (d->Height > maxdim)
        maxdim = d->Height;
    if (!layered && d->Depth > maxdim)
        maxdim = d->Depth;
    unsigned maxlev = 0;
    while (maxdim >> maxlev)
        maxlev++; /* 1 + floor(log2(maxdim)) */
    if (levels == 0 || levels > maxlev)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t w = d->Width >> l ? d->Width >> l : 1;
        uint64_t h = d->Height ? (d->Height >> l ? d->Height >> l : 1) : 0;
        uint64_t z = d->Depth ? (layered ? d->Depth : (d->Depth >> l ? d->Depth >> l : 1)) : 0;
        uint64_t b = array_bytes(w, h, z, d->Format, d->NumChannels);
        if (!b || total + b < total)
            return CUDA_ERROR_INVALID_VALUE;
        total += b;
    }
    return array_make((void **)out, total, RK_MIPMAP);
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    FK_LOCKED(array_make((void **)pHandle, array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels), RK_ARRAY));
}
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    FK_LOCKED(array_make((void **)pHandle, array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels), RK_ARRAY));
}
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    FK_LOCKED(array_make((void **)pHandle, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), RK_ARRAY));
}
CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    FK_LOCKED(array_make((void **)pHandle, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), RK_ARRAY));
}
CUresult cuArrayDestroy(CUarray hArray) { FK_LOCKED(array_destroy(hArray, RK_ARRAY)); }
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pDesc,
                                unsigned int numMipmapLevels)
{
    FK_LOCKED(mipmap_create(pHandle, pDesc, numMipmapLevels));
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { FK_LOCKED(array_destroy(h, RK_MIPMAP)); }
