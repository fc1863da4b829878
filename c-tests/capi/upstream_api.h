/* HAMi-core's multiprocess C API as a caller sees it, restated for the tests of our library.
 *
 * This is our own statement of the declarations in HAMi-core v1.2's
 * src/multiprocess/multiprocess_memory_limit.h (facts from
 * ../shared/reference/hami-region-protocol.md, sections 1 and 3): the same type layouts and the
 * same function names, parameter types and return types, so that a program compiled against
 * this file is compiled exactly as against upstream's and must link against libvgpu.so.
 *
 * Differences of form only: functions upstream declares with empty parentheses are declared
 * here with (void) (the same symbol and calling convention); the process-local
 * shared_region_info_t and the CUDA-typed thread_context_map are left out (no function takes
 * them); parameter names are ours.
 *
 * Programs including this file must not also include hami_shm.h (the typedef names clash by
 * design: they are the same types). */
#ifndef HAMI_TESTS_UPSTREAM_API_H
#define HAMI_TESTS_UPSTREAM_API_H

#include <semaphore.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Constants of the header. */
#define MULTIPROCESS_SHARED_REGION_MAGIC_FLAG 19920718
#define MULTIPROCESS_SHARED_REGION_CACHE_ENV "CUDA_DEVICE_MEMORY_SHARED_CACHE"
#define MULTIPROCESS_SHARED_REGION_CACHE_DEFAULT "/tmp/cudevshr.cache"
#define ENV_OVERRIDE_FILE "/overrideEnv"
#define CUDA_TASK_PRIORITY_ENV "CUDA_TASK_PRIORITY"
#define CUDA_DEVICE_MAX_COUNT 16
#define CUDA_DEVICE_MEMORY_UPDATE_SUCCESS 0
#define CUDA_DEVICE_MEMORY_UPDATE_FAILURE 1
#define SHARED_REGION_MAX_PROCESS_NUM 1024
#define SHARED_REGION_SIZE_MAGIC sizeof(shared_region_t)
#define MAJOR_VERSION 1
#define MINOR_VERSION 2

/* Memory recorded for one device by one process (64 bytes). */
typedef struct {
    _Atomic uint64_t context_size; /* type 0 */
    _Atomic uint64_t module_size;  /* type 1 */
    _Atomic uint64_t data_size;    /* type 2 */
    _Atomic uint64_t offset;
    _Atomic uint64_t total;        /* sum of the three */
    uint64_t unused[3];
} device_memory_t;

/* Utilisation of one device by one process (48 bytes). */
typedef struct {
    _Atomic uint64_t dec_util;
    _Atomic uint64_t enc_util;
    _Atomic uint64_t sm_util;
    uint64_t unused[3];
} device_util_t;

/* One process's slot (1960 bytes). */
typedef struct {
    _Atomic int32_t pid;     /* container pid; 0 = free */
    _Atomic int32_t hostpid; /* pid as NVML reports it; 0 = unknown */
    device_memory_t used[CUDA_DEVICE_MAX_COUNT];
    _Atomic uint64_t monitorused[CUDA_DEVICE_MAX_COUNT];
    device_util_t device_util[CUDA_DEVICE_MAX_COUNT];
    _Atomic int32_t status; /* 0 exited, 1 running, 2 suspended */
    _Atomic uint64_t seqlock;
    uint64_t unused[2];
} shrreg_proc_slot_t;

typedef char uuid[96];

/* The whole shared region (2,008,952 bytes; the file is one byte longer). */
typedef struct {
    _Atomic int32_t initialized_flag;
    uint32_t major_version;
    uint32_t minor_version;
    _Atomic int32_t sm_init_flag;
    _Atomic size_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    uuid uuids[CUDA_DEVICE_MAX_COUNT];
    uint64_t limit[CUDA_DEVICE_MAX_COUNT];
    uint64_t sm_limit[CUDA_DEVICE_MAX_COUNT];
    shrreg_proc_slot_t procs[SHARED_REGION_MAX_PROCESS_NUM];
    _Atomic int proc_num;
    _Atomic int utilization_switch;
    _Atomic int recent_kernel;
    int priority;
    _Atomic uint64_t last_kernel_time;
    sem_t sem_postinit;
} shared_region_t;

/* Lifecycle and locks. */
void ensure_initialized(void);
void lock_shrreg(void);
void unlock_shrreg(void);
int lock_postinit(void); /* 1 acquired, 0 gave up */
void unlock_postinit(void);
int clear_proc_slot_nolock(int do_clear);

/* Memory accounting and limits. */
int add_gpu_device_memory_usage(int32_t pid, int dev, size_t usage, int type);
int rm_gpu_device_memory_usage(int32_t pid, int dev, size_t usage, int type);
size_t get_gpu_memory_usage(const int dev);
uint64_t get_current_device_memory_usage(const int dev);
uint64_t get_current_device_memory_limit(const int dev);
int set_current_device_memory_limit(const int dev, size_t newlimit);
uint64_t get_current_device_memory_monitor(const int dev);
int set_gpu_device_memory_monitor(int32_t pid, int dev, size_t monitor);
int set_gpu_device_sm_utilization(int32_t pid, int dev, unsigned int smUtil);
int init_gpu_device_utilization(void);

/* SM limits. */
int get_current_device_sm_limit(int dev);
int set_current_device_sm_limit_scale(int dev, int scale);

/* Host pid. */
int set_host_pid(int hostpid);
int update_host_pid(void);
shrreg_proc_slot_t *find_proc_by_hostpid(int hostpid);

/* Kernels, priority, utilisation switch. */
void pre_launch_kernel(void);
int get_recent_kernel(void);
int set_recent_kernel(int value);
int get_current_priority(void);
int get_utilization_switch(void);
int set_env_utilization_switch(void);

/* Suspend/resume and inspection. */
void suspend_all(void);
void resume_all(void);
int wait_status_self(int status);
int wait_status_all(int status);
void print_all(void);
int active_oom_killer(void);

/* Miscellaneous. */
int shrreg_major_version(void);
int shrreg_minor_version(void);
int init_device_info(void);
int load_env_from_file(char *filename);
int comparelwr(const char *s1, char *s2);

/* Defined upstream in the utilisation watcher rather than this file's .c. Our library exports
 * the two maps (numbering devices as its hooks do); it does not export setspec (its SM limiter
 * sizes itself), so a caller of setspec does not link. */
unsigned int nvml_to_cuda_map(unsigned int nvmldev);
unsigned int cuda_to_nvml_map(unsigned int cudadev);
int setspec(void);

/* Declared upstream but defined nowhere (so neither upstream's library nor ours exports them):
 *   int set_current_device_sm_limit(int dev, int scale);
 *   int put_device_info(void); */

#endif
