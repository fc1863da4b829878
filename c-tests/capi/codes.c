/* The hami_ status codes: one value per meaning (hami_status_t in hami_shm.h), and the two that
 * once shared -1 told apart by value where they occur: a refused reservation (HAMI_REFUSED, -1,
 * kept) and a lock held past the timeout by a live process (HAMI_TIMEOUT). */
#include "hami_shm.h"

#include "capi_test.h"

int main(int argc, char **argv) {
    (void)argc;
    static const char *const env[] = {"CUDA_DEVICE_MEMORY_LIMIT=8m", NULL};
    t_reexec_with_env(argv, "codes.cache", env);

    static const struct {
        const char *name;
        int value;
    } codes[] = {{"HAMI_OK", HAMI_OK},           {"HAMI_REFUSED", HAMI_REFUSED},
                 {"HAMI_ERROR", HAMI_ERROR},     {"HAMI_NOT_HELD", HAMI_NOT_HELD},
                 {"HAMI_ALREADY_HELD", HAMI_ALREADY_HELD}, {"HAMI_TIMEOUT", HAMI_TIMEOUT}};
    int n = (int)(sizeof codes / sizeof codes[0]), clashes = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (codes[i].value == codes[j].value) {
                printf("     %s and %s are both %d\n", codes[i].name, codes[j].name, codes[i].value);
                clashes++;
            }
    t_check(clashes == 0 && sizeof(hami_status_t) == sizeof(int32_t), "status codes are distinct",
            "%d clash(es), sizeof(hami_status_t) %zu", clashes, sizeof(hami_status_t));
    t_check(HAMI_OK == 0 && HAMI_REFUSED == -1, "HAMI_OK 0 and HAMI_REFUSED -1 kept", "%d %d",
            HAMI_OK, HAMI_REFUSED);

    ensure_initialized();
    int refused = hami_reserve(0, 16 * MiB, 2);
    t_check(refused == HAMI_REFUSED && refused != HAMI_TIMEOUT, "over the limit: HAMI_REFUSED",
            "hami_reserve returned %d", refused);

    /* A child holds the region lock until told; our bounded attempt times out. */
    int up[2], go[2];
    t_pipe(up);
    t_pipe(go);
    pid_t pid = fork();
    if (pid < 0)
        t_die("fork");
    if (pid == 0) {
        t_watchdog(20);
        int rc = hami_lock_region(1000);
        t_write_byte(up[1], rc == HAMI_OK ? 'L' : 'x');
        t_read_byte(go[0], 15000);
        _exit(hami_unlock_region() == HAMI_OK ? 0 : 1);
    }
    int c = t_read_byte(up[0], 10000);
    int busy = hami_lock_region(50);
    t_write_byte(go[1], 'q');
    int st = t_wait(pid, 10000);
    t_check(c == 'L' && busy == HAMI_TIMEOUT && busy != HAMI_REFUSED && st != -1 && WIFEXITED(st) &&
                WEXITSTATUS(st) == 0,
            "lock held by a live peer: HAMI_TIMEOUT", "child %c, hami_lock_region %d, child %s",
            c > 0 ? c : '?', busy, t_status_text(st));
    t_cleanup_dir();
    printf("%s codes: %d failure(s)\n", t_failures ? "FAIL" : "PASS", t_failures);
    return t_failures ? 1 : 0;
}
