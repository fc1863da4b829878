// cuda_runtime: the CUDA runtime's own path to the driver (cudart resolves every entry point
// through cuGetProcAddress_v2) under libvgpu.so: cudaMemGetInfo reports the limit, cudaMalloc,
// cudaMallocManaged and cudaMallocAsync are counted and refused past the limit, kernels launch
// (legacy and per-thread default stream) and compute the right result. At each step it prints
// what the library counts beside NVML's real usage of the process ("trace" lines, from
// nvidia-smi), and checks that the real usage at the limit stays within it and that after the
// frees the count agrees with NVML's.
// Prints PASS/FAIL lines and "got=<bytes>" for run.sh. Argument: the limit in bytes.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int pass, fail;

// This process's GPU memory as NVML reports it (MiB; -1 if unknown), from nvidia-smi run
// without LD_PRELOAD: what the GPU really spends, to set beside what the library counts.
static long nvml_mib(void) {
    FILE *p = popen("env -u LD_PRELOAD nvidia-smi --query-compute-apps=pid,used_memory "
                    "--format=csv,noheader,nounits 2>/dev/null", "r");
    long pid, mib, found = -1;
    if (!p) return -1;
    while (fscanf(p, "%ld, %ld", &pid, &mib) == 2)
        if (pid == (long)getpid()) found = mib;
    pclose(p);
    return found;
}
// The condition is evaluated once: it is often the call under test.
#define CHECK(c, ...) do { int ok_ = (c); if (ok_) pass++; else fail++; printf("%s [cudart] ", ok_ ? "PASS" : "FAIL"); \
        printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

int main(int argc, char **argv) {
    unsigned long long limit = argc > 1 ? strtoull(argv[1], NULL, 0) : (4ULL << 30);
    const size_t chunk = 256ULL << 20;
    size_t fr = 0, tot = 0;
    CHECK(cudaFree(0) == cudaSuccess, "the runtime initialises");
    CHECK(cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot == limit,
          "cudaMemGetInfo total %zu == limit %llu (free %zu)", tot, limit, fr);
    size_t ctx = tot - fr;
    // used(): what the application sees in use now (limit - free).
#define USED() (cudaMemGetInfo(&fr, &tot), tot - fr)
    // TRACE: what the library counts for this process's device and what NVML says it uses.
#define TRACE(what) do { size_t u_ = USED(); printf("trace %-28s counted %6zu MiB  nvml %6ld MiB\n", \
        what, u_ >> 20, nvml_mib()); fflush(stdout); } while (0)
    TRACE("context");
#define BACK(what, base) do { size_t u_ = USED(); CHECK(u_ <= (base) + (2u << 20), \
        "%s gives its memory back (in use %zu MiB, was %zu MiB before)", what, u_ >> 20, (size_t)(base) >> 20); } while (0)

    int n = 1 << 20, *d = NULL, *h = (int *)malloc(n * sizeof(int));
    size_t base = USED();
    CHECK(cudaMalloc(&d, n * sizeof(int)) == cudaSuccess, "cudaMalloc 4 MiB");
    TRACE("cudaMalloc 4 MiB");
    fill<<<(n + 255) / 256, 256>>>(d, n, 7);
    CHECK(cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "kernel launch");
    cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 7 && h[n - 1] == 7 + n - 1, "kernel result (%d, %d)", h[0], h[n - 1]);
    TRACE("first kernel ran");
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    fill<<<(n + 255) / 256, 256, 0, cudaStreamPerThread>>>(d, n, 9);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess, "per-thread-stream launch");
    TRACE("per-thread-stream kernel");
    cudaFree(d);
    TRACE("cudaFree 4 MiB");
    BACK("cudaFree of 4 MiB", base);
    base = USED();

    void *m = NULL;
    size_t before, after;
    cudaMemGetInfo(&before, &tot);
    CHECK(cudaMallocManaged(&m, 64 << 20) == cudaSuccess, "cudaMallocManaged 64 MiB");
    TRACE("cudaMallocManaged 64 MiB");
    cudaMemGetInfo(&after, &tot);
    CHECK(before - after >= (64u << 20), "managed memory counted (%zu MiB)", (before - after) >> 20);
    cudaFree(m);
    TRACE("cudaFree managed");
    BACK("cudaFree of managed memory", base);
    base = USED();

    void *a = NULL;
    cudaMemGetInfo(&before, &tot);
    CHECK(cudaMallocAsync(&a, 64 << 20, s) == cudaSuccess, "cudaMallocAsync 64 MiB");
    TRACE("cudaMallocAsync 64 MiB");
    cudaMemGetInfo(&after, &tot);
    CHECK(before - after >= (64u << 20), "stream-ordered memory counted (%zu MiB)", (before - after) >> 20);
    cudaFreeAsync(a, s);
    cudaStreamSynchronize(s);
    TRACE("cudaFreeAsync + sync");
    {
        cudaMemPool_t pool0;
        cudaDeviceGetDefaultMemPool(&pool0, 0);
        cudaMemPoolTrimTo(pool0, 0);
        TRACE("trim of the default pool");
    }
    BACK("cudaFreeAsync and a trim of the default pool", base);

    void *ptrs[4096];
    int k = 0;
    cudaError_t e = cudaSuccess;
    while (k < 4096 && (e = cudaMalloc(&ptrs[k], chunk)) == cudaSuccess) k++;
    unsigned long long got = (unsigned long long)k * chunk;
    TRACE("256 MiB chunks to the limit");
    long real_full = nvml_mib();
    CHECK(real_full >= 0 && (unsigned long long)real_full << 20 <= limit,
          "NVML's real usage at the limit, context included: %ld MiB <= %llu MiB", real_full, limit >> 20);
    CHECK(e == cudaErrorMemoryAllocation, "cudaMalloc past the limit fails with cudaErrorMemoryAllocation (%d)", (int)e);
    cudaGetLastError();
    CHECK(got + ctx <= limit && got + ctx + chunk + (64ULL << 20) > limit,
          "%llu MiB admitted in 256 MiB chunks + %zu MiB context within %llu MiB", got >> 20, ctx >> 20, limit >> 20);
    printf("got=%llu ctx=%zu\n", got, ctx);
    for (int i = 0; i < k; i++) cudaFree(ptrs[i]);
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    cudaMemPoolTrimTo(pool, 0);
    TRACE("all freed, pool trimmed");
    long real_end = nvml_mib();
    size_t counted_end = USED() >> 20;
    CHECK(real_end >= 0 && counted_end <= (size_t)real_end + 2 && (size_t)real_end <= counted_end + 8,
          "after the frees the count (%zu MiB) matches NVML's real usage (%ld MiB): no phantom "
          "memory, and no more than 8 MiB the driver holds uncounted (modules)", counted_end, real_end);
    cudaMemGetInfo(&fr, &tot);
    CHECK(tot - fr <= ctx + (8ULL << 20), "after the frees and a pool trim %zu MiB in use (context %zu)",
          (tot - fr) >> 20, ctx >> 20);
    printf("cudart: %d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
