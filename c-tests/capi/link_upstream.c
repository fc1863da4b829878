/* Compiled against upstream_api.h only (HAMi-core's declarations, restated), linked against
 * libvgpu.so: that it links is the proof that every upstream function defined in
 * multiprocess_memory_limit.c exists in our library under the same name. Then each is called once
 * in a fresh region and its result checked, and the region is read through upstream's struct
 * layout to see that the calls landed where an upstream peer would look.
 *
 * cuda_to_nvml_map and nvml_to_cuda_map (defined upstream in the utilisation watcher) are ours
 * too; their device mapping is tested over the stand-in driver in devices.c. setspec is not
 * exported (our SM limiter sizes itself); -DWITH_SETSPEC calls it, to show that it fails to link. */
#include "upstream_api.h"

#include "capi_test.h"

#define LIMIT (64 * MiB)

static shared_region_t *region;

static shrreg_proc_slot_t *slot_of(pid_t pid) {
    int n = atomic_load(&region->proc_num);
    for (int i = 0; i < n && i < SHARED_REGION_MAX_PROCESS_NUM; i++)
        if (atomic_load(&region->procs[i].pid) == pid)
            return &region->procs[i];
    return NULL;
}

/* A child that registers, reports its status changes and waits to be told to exit. */
static pid_t spawn_peer(int ready[2], int go[2]) {
    t_pipe(ready);
    t_pipe(go);
    pid_t pid = fork();
    if (pid < 0)
        t_die("fork");
    if (pid == 0) {
        t_watchdog(30);
        close(ready[0]);
        close(go[1]);
        ensure_initialized();
        t_write_byte(ready[1], 'R');
        int c;
        while ((c = t_read_byte(go[0], 20000)) == 's') {
            /* Parent suspended us: report what our own slot says. */
            t_write_byte(ready[1], wait_status_self(2) == 1 ? 'S' : 'x');
        }
        _exit(c == 'q' ? 0 : 3);
    }
    close(ready[1]);
    close(go[0]);
    return pid;
}

int main(int argc, char **argv) {
    (void)argc;
    static const char *const env[] = {"CUDA_DEVICE_MEMORY_LIMIT=64m", "CUDA_DEVICE_SM_LIMIT=50",
                                      "CUDA_TASK_PRIORITY=3", NULL};
    unsetenv("GPU_CORE_UTILIZATION_POLICY");
    t_reexec_with_env(argv, "link.cache", env);
    double start = t_now_ms();
    pid_t me = getpid();

    ensure_initialized();
    region = t_map_region(sizeof(shared_region_t));
    t_check(atomic_load(&region->initialized_flag) == MULTIPROCESS_SHARED_REGION_MAGIC_FLAG &&
                region->major_version == 1 && region->minor_version == 2,
            "ensure_initialized", "flag %d, version %u.%u", atomic_load(&region->initialized_flag),
            region->major_version, region->minor_version);
    shrreg_proc_slot_t *mine = slot_of(me);
    t_check(mine != NULL && atomic_load(&mine->status) == 1, "registered", "slot %ld",
            mine ? (long)(mine - region->procs) : -1L);
    t_check(shrreg_major_version() == 1 && shrreg_minor_version() == 2, "shrreg_*_version", "%d.%d",
            shrreg_major_version(), shrreg_minor_version());

    /* Accounting. */
    t_check(get_current_device_memory_limit(0) == LIMIT, "get_current_device_memory_limit",
            "%lu", (unsigned long)get_current_device_memory_limit(0));
    int add = add_gpu_device_memory_usage(me, 0, 3 * MiB, 2);
    int add0 = add_gpu_device_memory_usage(me, 0, 1 * MiB, 0);
    t_check(add == 0 && add0 == 0 && get_gpu_memory_usage(0) == 4 * MiB &&
                get_current_device_memory_usage(0) == 4 * MiB && mine &&
                atomic_load(&mine->used[0].total) == 4 * MiB &&
                atomic_load(&mine->used[0].data_size) == 3 * MiB &&
                atomic_load(&mine->used[0].context_size) == 1 * MiB,
            "add_gpu_device_memory_usage", "rc %d/%d, usage %zu", add, add0, get_gpu_memory_usage(0));
    /* Adding does not admit (upstream's meaning): over the limit is recorded. */
    int over = add_gpu_device_memory_usage(me, 0, 2 * LIMIT, 2);
    t_check(over == 0 && get_gpu_memory_usage(0) == 2 * LIMIT + 4 * MiB, "add records past the limit",
            "usage %zu", get_gpu_memory_usage(0));
    int rm = rm_gpu_device_memory_usage(me, 0, 2 * LIMIT + 3 * MiB, 2);
    int rm0 = rm_gpu_device_memory_usage(me, 0, 1 * MiB, 0);
    t_check(rm == 0 && rm0 == 0 && get_gpu_memory_usage(0) == 0, "rm_gpu_device_memory_usage",
            "rc %d/%d, usage %zu", rm, rm0, get_gpu_memory_usage(0));
    int under = rm_gpu_device_memory_usage(me, 0, 5 * MiB, 2);
    t_check(under == 0 && get_gpu_memory_usage(0) == 0, "rm below zero stops at 0",
            "rc %d, usage %zu", under, get_gpu_memory_usage(0));
    t_check(add_gpu_device_memory_usage(0x7ffffff0, 0, 1, 2) == -1 &&
                add_gpu_device_memory_usage(me, 16, 1, 2) == -1 &&
                add_gpu_device_memory_usage(me, -1, 1, 2) == -1 &&
                add_gpu_device_memory_usage(me, 0, 1, 3) == -1 &&
                rm_gpu_device_memory_usage(0, 0, 1, 2) == -1 && get_gpu_memory_usage(0) == 0,
            "add/rm validate pid, dev, type", "usage %zu", get_gpu_memory_usage(0));
    t_check(get_gpu_memory_usage(16) == 0 && get_gpu_memory_usage(-3) == 0 &&
                get_current_device_memory_limit(99) == 0,
            "getters validate dev", "%s", "0 for bad devices");
    int setl = set_current_device_memory_limit(1, 128 * MiB);
    t_check(setl == 0 && get_current_device_memory_limit(1) == 128 * MiB &&
                region->limit[1] == 128 * MiB && set_current_device_memory_limit(16, 1) == -1,
            "set_current_device_memory_limit", "rc %d, limit[1] %lu", setl,
            (unsigned long)region->limit[1]);
    set_current_device_memory_limit(1, LIMIT);

    /* Locks. */
    lock_shrreg();
    size_t owner = atomic_load(&region->owner_pid);
    int cleared = clear_proc_slot_nolock(1);
    unlock_shrreg();
    size_t owner_after = atomic_load(&region->owner_pid);
    t_check((pid_t)(owner & 0xffffffffu) == me && owner_after == 0 && cleared == 0,
            "lock_shrreg/unlock_shrreg", "owner pid %zu during, %zu after; cleared %d",
            owner & 0xffffffffu, owner_after, cleared);
    t_check(clear_proc_slot_nolock(0) == 0 && clear_proc_slot_nolock(1) == 0,
            "clear_proc_slot_nolock (lock taken itself)", "%s", "nothing dead");
    int post = lock_postinit();
    unlock_postinit();
    int post2 = lock_postinit();
    unlock_postinit();
    t_check(post == 1 && post2 == 1, "lock_postinit/unlock_postinit", "%d then %d", post, post2);

    /* Host pid and the watcher's functions. */
    int hp = set_host_pid(424242);
    shrreg_proc_slot_t *found = find_proc_by_hostpid(424242);
    /* The pointer is into the library's own mapping of the file, not ours: compare contents. */
    int32_t found_pid = found ? atomic_load(&found->pid) : -1;
    int32_t found_host = found ? atomic_load(&found->hostpid) : -1;
    int uh = update_host_pid();
    t_check(hp == 0 && uh == 0 && found_pid == me && found_host == 424242 && mine &&
                atomic_load(&mine->hostpid) == 424242 && find_proc_by_hostpid(424243) == NULL &&
                find_proc_by_hostpid(0) == NULL,
            "set_host_pid/update_host_pid/find_proc_by_hostpid",
            "rc %d/%d, found pid %d hostpid %d", hp, uh, found_pid, found_host);
    int mon = set_gpu_device_memory_monitor(424242, 0, 12345);
    int sm = set_gpu_device_sm_utilization(424242, 0, 37);
    t_check(mon == 1 && sm == 1 && get_current_device_memory_monitor(0) == 12345 && mine &&
                atomic_load(&mine->device_util[0].sm_util) == 37 &&
                set_gpu_device_memory_monitor(1, 0, 1) == 0 &&
                set_gpu_device_sm_utilization(424242, 16, 1) == 0,
            "set_gpu_device_memory_monitor/sm_utilization", "rc %d/%d, monitor %lu", mon, sm,
            (unsigned long)get_current_device_memory_monitor(0));
    int iu = init_gpu_device_utilization();
    t_check(iu == 1 && get_current_device_memory_monitor(0) == 0 && mine &&
                atomic_load(&mine->device_util[0].sm_util) == 0,
            "init_gpu_device_utilization", "rc %d", iu);

    /* SM limits, kernel time, priority, switches. */
    int sml = get_current_device_sm_limit(0);
    int sc1 = set_current_device_sm_limit_scale(0, 2);
    int sml2 = get_current_device_sm_limit(0);
    int sc2 = set_current_device_sm_limit_scale(0, 2);
    t_check(sml == 50 && sc1 == 0 && sml2 == 100 && sc2 == 0 && get_current_device_sm_limit(0) == 100 &&
                get_current_device_sm_limit(16) == -1 && set_current_device_sm_limit_scale(0, 0) == -1,
            "get_current_device_sm_limit/set_current_device_sm_limit_scale",
            "%d, x2 -> %d, again -> %d", sml, sml2, get_current_device_sm_limit(0));
    uint64_t before = (uint64_t)time(NULL);
    pre_launch_kernel();
    uint64_t lkt = atomic_load(&region->last_kernel_time);
    t_check(lkt + 2 >= before, "pre_launch_kernel", "last_kernel_time %lu, now %lu",
            (unsigned long)lkt, (unsigned long)before);
    int rk = get_recent_kernel();
    int srk = set_recent_kernel(-1);
    int rk2 = get_recent_kernel();
    set_recent_kernel(2);
    t_check(rk == 2 && srk == 0 && rk2 == -1 && atomic_load(&region->recent_kernel) == 2,
            "get_recent_kernel/set_recent_kernel", "%d, set -1 -> %d", rk, rk2);
    t_check(get_current_priority() == 3, "get_current_priority", "%d", get_current_priority());
    int us0 = get_utilization_switch();
    setenv("GPU_CORE_UTILIZATION_POLICY", "FORCE", 1);
    int e1 = set_env_utilization_switch(), us1 = get_utilization_switch();
    setenv("GPU_CORE_UTILIZATION_POLICY", "disable", 1);
    int e2 = set_env_utilization_switch(), us2 = get_utilization_switch();
    unsetenv("GPU_CORE_UTILIZATION_POLICY");
    int e0 = set_env_utilization_switch(), us3 = get_utilization_switch();
    t_check(us0 == 1 && e1 == 1 && us1 == 1 && e2 == 2 && us2 == 0 && e0 == 0 && us3 == 1,
            "get_utilization_switch/set_env_utilization_switch",
            "region %d; force %d->%d; disable %d->%d; unset %d->%d", us0, e1, us1, e2, us2, e0, us3);

    /* Status, suspend/resume (no peers yet: nothing to signal, and never ourselves). */
    suspend_all();
    resume_all();
    t_check(wait_status_self(1) == 1 && wait_status_self(2) == 0 && wait_status_all(1) == 1,
            "wait_status_self/wait_status_all alone", "self %d", wait_status_self(1));
    print_all();
    t_check(active_oom_killer() == 0, "active_oom_killer alone", "%s", "we are still alive");
    /* No driver here: no NVML, so nothing recorded and a non-zero return, as upstream's. */
    int idi = init_device_info();
    t_check(idi != 0 && region->device_num == 0, "init_device_info without NVML",
            "returned %d, device_num %lu", idi, (unsigned long)region->device_num);

    /* Environment file and string compare. */
    char envfile[512];
    snprintf(envfile, sizeof envfile, "%s/override.env", t_dir());
    FILE *f = fopen(envfile, "w");
    if (!f)
        t_die("fopen %s", envfile);
    fputs("HAMI_LINK_TEST_A=1\n# comment\n\nHAMI_LINK_TEST_B=x=y\nno equals sign\nHAMI_LINK_TEST_C=3\n", f);
    fclose(f);
    int le = load_env_from_file(envfile);
    const char *a = getenv("HAMI_LINK_TEST_A"), *b = getenv("HAMI_LINK_TEST_B"),
               *c = getenv("HAMI_LINK_TEST_C");
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none.env", t_dir());
    t_check(le == 0 && a && !strcmp(a, "1") && b && !strcmp(b, "x=y") && c && !strcmp(c, "3") &&
                load_env_from_file(missing) == 0 && load_env_from_file(NULL) == -1,
            "load_env_from_file", "rc %d, A=%s B=%s C=%s", le, a ? a : "(unset)", b ? b : "(unset)",
            c ? c : "(unset)");
    char upper[] = "FORCE", other[] = "forced";
    t_check(comparelwr("Force", upper) == 0 && comparelwr("Force", other) == 1 &&
                comparelwr(NULL, upper) == 1,
            "comparelwr", "%d %d", comparelwr("Force", upper), comparelwr("Force", other));

    /* With a peer: suspend/resume set its status without killing it (it has no SIGUSR2
     * handler: it is one of ours); the OOM killer kills it and not us. */
    int ready[2], go[2];
    pid_t peer = spawn_peer(ready, go);
    int r = t_read_byte(ready[0], 10000);
    suspend_all();
    int all2 = wait_status_all(2);
    t_write_byte(go[1], 's');
    int seen = t_read_byte(ready[0], 10000);
    resume_all();
    int all1 = wait_status_all(1);
    t_check(r == 'R' && all2 == 1 && seen == 'S' && all1 == 1 && kill(peer, 0) == 0,
            "suspend_all/resume_all with a peer", "ready %c, all suspended %d, peer saw %c, all resumed %d",
            r > 0 ? r : '?', all2, seen > 0 ? seen : '?', all1);
    int killed = active_oom_killer();
    int st = t_wait(peer, 5000);
    t_check(killed == 1 && st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
            "active_oom_killer with a peer", "signalled %d, peer %s", killed, t_status_text(st));
    int freed = clear_proc_slot_nolock(1);
    shrreg_proc_slot_t *left = slot_of(peer);
    int again = clear_proc_slot_nolock(1);
    t_check(freed == 1 && left == NULL && again == 0, "clear_proc_slot_nolock frees the dead",
            "freed %d, peer slot %p, again %d", freed, (void *)left, again);

    /* No driver, no CUDA_VISIBLE_DEVICES: identity over the region's 16 devices. */
    t_check(cuda_to_nvml_map(0) == 0 && nvml_to_cuda_map(0) == 0 && cuda_to_nvml_map(3) == 3 &&
                cuda_to_nvml_map(16) == (unsigned)-1 && nvml_to_cuda_map(16) == (unsigned)-1,
            "cuda_to_nvml_map/nvml_to_cuda_map without a driver", "%u %u %u %u %u",
            cuda_to_nvml_map(0), nvml_to_cuda_map(0), cuda_to_nvml_map(3), cuda_to_nvml_map(16),
            nvml_to_cuda_map(16));
#ifdef WITH_SETSPEC
    (void)setspec();
#endif

    double ms = t_now_ms() - start;
    t_check(ms < 20000, "link_upstream wall time", "%.0f ms", ms);
    t_cleanup_dir();
    printf("%s link_upstream: %d failure(s)\n", t_failures ? "FAIL" : "PASS", t_failures);
    return t_failures ? 1 : 0;
}
