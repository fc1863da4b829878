/* Fault injection through the C API: processes SIGKILLed while holding the region lock, in the
 * middle of lock churn and in the middle of allocation hammering, SIGTERMed, exiting normally
 * while another holds the lock (and while holding it themselves), and killed in the middle of
 * initialising the region.
 *
 * Each check runs in a freshly exec'd process over its own fresh region file (so the library
 * starts from that environment), under a deadline: a hang is a FAIL with the time, never a CI
 * timeout. Every child has an alarm() watchdog. Each check prints PASS/FAIL lines with numbers;
 * the program exits non-zero if any failed. `faults CHECK...` runs only the named checks. */
#include "region_view.h"

#include <sched.h>

/* Longest time from a holder's death to the next acquisition that we accept (the protocol's
 * recovery takes a liveness check, or a 1 s grace period for a token lost mid-acquire). */
#define RECOVERY_BOUND_MS 3000.0

/* ------------------------------------------------------------------------------------------ */
/* Small helpers for children. */

/* Forks a child that runs `fn(arg)` and exits with its return value; never returns in it. */
static pid_t spawn(int (*fn)(void *), void *arg) {
    pid_t pid = fork();
    if (pid < 0)
        t_die("fork");
    if (pid == 0) {
        t_watchdog(60);
        exit(fn(arg));
    }
    return pid;
}

struct pipes {
    int up[2];   /* child -> parent */
    int down[2]; /* parent -> child */
};

static void pipes_open(struct pipes *p) {
    t_pipe(p->up);
    t_pipe(p->down);
}

/* In the child: keep the ends it uses. */
static void pipes_child(struct pipes *p) {
    close(p->up[0]);
    close(p->down[1]);
}

/* In the parent. */
static void pipes_parent(struct pipes *p) {
    close(p->up[1]);
    close(p->down[0]);
}

/* Waits until `pid` has died (SIGKILL is delivered asynchronously) but leaves it a zombie. */
static int wait_dead_keep_zombie(pid_t pid, int timeout_ms) {
    double end = t_now_ms() + timeout_ms;
    while (t_now_ms() < end) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT | WNOHANG) == 0 && info.si_pid == pid)
            return 0;
        t_sleep_ms(1);
    }
    return -1;
}

static void *shared_alloc(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        t_die("mmap shared");
    memset(p, 0, size);
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* lock_kill: a child takes lock_shrreg, tells us, sleeps; we SIGKILL it; another child must get
 * the lock within the bound. Half the rounds leave the victim a zombie until afterwards. */

static int holder_child(void *arg) {
    struct pipes *p = arg;
    pipes_child(p);
    ensure_initialized();
    lock_shrreg();
    t_write_byte(p->up[1], rv_owner_pid() == getpid() ? 'L' : 'x');
    t_read_byte(p->down[0], 50000); /* killed here */
    unlock_shrreg();
    return 0;
}

static int taker_child(void *arg) {
    int *fd = arg;
    ensure_initialized();
    double t0 = t_now_ms();
    int rc = hami_lock_region(8000);
    double ms = t_now_ms() - t0;
    pid_t owner = rv_owner_pid();
    int rc2 = hami_unlock_region();
    struct {
        int rc, rc2, owner_ok;
        double ms;
    } out = {rc, rc2, owner == getpid(), ms};
    if (write(*fd, &out, sizeof out) != (ssize_t)sizeof out)
        return 3;
    return 0;
}

static int check_lock_kill(void) {
    ensure_initialized();
    for (int round = 0; round < 6; round++) {
        struct pipes p;
        pipes_open(&p);
        pid_t holder = spawn(holder_child, &p);
        pipes_parent(&p);
        int c = t_read_byte(p.up[0], 10000);
        int busy = hami_lock_region(0);
        pid_t owner = rv_owner_pid();
        t_sleep_ms((double)t_rand_range(0, 50));
        kill(holder, SIGKILL);
        int zombie = round % 2 == 0;
        if (!zombie)
            waitpid(holder, NULL, 0);
        int res[2];
        t_pipe(res);
        pid_t taker = spawn(taker_child, &res[1]);
        close(res[1]);
        struct {
            int rc, rc2, owner_ok;
            double ms;
        } out = {-9, -9, 0, -1};
        int got = t_read_exact(res[0], &out, sizeof out, 15000);
        int st = t_wait(taker, 5000);
        if (zombie)
            waitpid(holder, NULL, 0);
        close(res[0]);
        close(p.up[0]);
        close(p.down[1]);
        char name[64];
        snprintf(name, sizeof name, "lock_kill round %d (%s)", round, zombie ? "zombie" : "reaped");
        t_check(c == 'L' && busy == HAMI_TIMEOUT && owner == holder && got == 0 && out.rc == HAMI_OK &&
                    out.rc2 == HAMI_OK && out.owner_ok && out.ms < RECOVERY_BOUND_MS && st != -1 &&
                    WIFEXITED(st) && WEXITSTATUS(st) == 0 && rv_owner_pid() == 0,
                name, "holder %c, held for others %d, owner was holder %d; next taker rc %d in %.1f ms, "
                "owner ok %d, unlock %d, %s",
                c > 0 ? c : '?', busy, owner == holder, out.rc, out.ms, out.owner_ok, out.rc2,
                t_status_text(st));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* lock_churn: 6 processes take and release the lock in a loop, checking mutual exclusion with
 * a marker of their own; a random one is SIGKILLed at a random moment each round (and replaced).
 * After each kill every survivor must get through and the parent must get the lock within the
 * bound. */

#define CHURNERS 6
#define CHURN_ROUNDS 20

struct churn {
    _Atomic int stop;
    _Atomic int gen;            /* bumped by the parent to ask churners to park */
    _Atomic int run;            /* 0: park outside the lock */
    _Atomic int parked_gen[64]; /* per churner: last generation it parked for */
    _Atomic int32_t holder;     /* pid inside the critical section, 0 if none */
    _Atomic int32_t killed[64];
    _Atomic int nkilled;
    _Atomic int violations;
    _Atomic int errors;
    _Atomic long iterations;
    _Atomic int recovered_markers;
};

static struct churn *ch;

static int was_killed(int32_t pid) {
    int n = atomic_load(&ch->nkilled);
    for (int i = 0; i < n && i < 64; i++)
        if (atomic_load(&ch->killed[i]) == pid)
            return 1;
    return 0;
}

static int churner(void *arg) {
    int id = (int)(intptr_t)arg;
    t_seed((uint64_t)getpid());
    ensure_initialized();
    int32_t me = getpid();
    while (!atomic_load(&ch->stop)) {
        if (!atomic_load(&ch->run)) {
            atomic_store(&ch->parked_gen[id], atomic_load(&ch->gen));
            t_sleep_ms(1);
            continue;
        }
        int rc = hami_lock_region(10000);
        if (rc != HAMI_OK) {
            atomic_fetch_add(&ch->errors, 1);
            continue;
        }
        int32_t expected = 0;
        if (!atomic_compare_exchange_strong(&ch->holder, &expected, me)) {
            if (was_killed(expected) && atomic_compare_exchange_strong(&ch->holder, &expected, me))
                atomic_fetch_add(&ch->recovered_markers, 1);
            else
                atomic_fetch_add(&ch->violations, 1);
        }
        /* Stay inside a while, now and then, so that some kills land in here. */
        if (t_rand() % 2)
            t_sleep_ms((double)(t_rand() % 300) / 1000.0);
        expected = me;
        if (!atomic_compare_exchange_strong(&ch->holder, &expected, 0))
            atomic_fetch_add(&ch->violations, 1);
        if (hami_unlock_region() != HAMI_OK)
            atomic_fetch_add(&ch->errors, 1);
        atomic_fetch_add(&ch->iterations, 1);
        if (t_rand() % 4 == 0)
            sched_yield();
    }
    return 0;
}

static int check_lock_churn(void) {
    ch = shared_alloc(sizeof *ch);
    ensure_initialized();
    pid_t pids[CHURNERS];
    atomic_store(&ch->run, 1);
    for (int i = 0; i < CHURNERS; i++)
        pids[i] = spawn(churner, (void *)(intptr_t)i);
    double worst = 0;
    int bad_rounds = 0, killed_holding = 0;
    for (int round = 0; round < CHURN_ROUNDS; round++) {
        atomic_store(&ch->run, 1);
        t_sleep_ms((double)t_rand_range(20, 80));
        int v = (int)(t_rand() % CHURNERS);
        pid_t victim = pids[v];
        atomic_store(&ch->killed[atomic_fetch_add(&ch->nkilled, 1) % 64], victim);
        kill(victim, SIGKILL);
        double t_kill = t_now_ms();
        int held_at_kill = rv_owner_pid() == victim;
        killed_holding += held_at_kill;
        if (round % 2)
            waitpid(victim, NULL, 0);
        /* Everyone else must get through the lock and park. */
        int gen = atomic_fetch_add(&ch->gen, 1) + 1;
        atomic_store(&ch->run, 0);
        int all_parked = 0;
        while (t_now_ms() - t_kill < 10000) {
            all_parked = 1;
            for (int i = 0; i < CHURNERS; i++)
                if (i != v && atomic_load(&ch->parked_gen[i]) < gen)
                    all_parked = 0;
            if (all_parked)
                break;
            t_sleep_ms(1);
        }
        double t_parked = t_now_ms() - t_kill;
        int rc = hami_lock_region(8000);
        double t_acq = t_now_ms() - t_kill;
        pid_t owner = rv_owner_pid();
        int rc2 = hami_unlock_region();
        if (!(round % 2))
            waitpid(victim, NULL, 0);
        if (t_acq > worst)
            worst = t_acq;
        int ok = all_parked && rc == HAMI_OK && rc2 == HAMI_OK && owner == getpid() &&
                 t_acq < RECOVERY_BOUND_MS;
        if (!ok)
            bad_rounds++;
        char name[64];
        snprintf(name, sizeof name, "lock_churn round %d", round);
        t_check(ok, name,
                "victim %d (%s, %s); survivors through in %.1f ms, parent acquired %.1f ms after the "
                "kill (rc %d/%d)",
                (int)victim, round % 2 ? "reaped" : "zombie", held_at_kill ? "holding the lock" : "not holding",
                t_parked, t_acq, rc, rc2);
        /* Replace the victim with a new churner under the same id. */
        atomic_store(&ch->parked_gen[v], 0);
        pids[v] = spawn(churner, (void *)(intptr_t)v);
    }
    atomic_store(&ch->stop, 1);
    atomic_store(&ch->run, 1);
    int clean = 0;
    for (int i = 0; i < CHURNERS; i++) {
        int st = t_wait(pids[i], 15000);
        clean += st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    t_check(atomic_load(&ch->violations) == 0 && atomic_load(&ch->errors) == 0 && clean == CHURNERS &&
                atomic_load(&ch->iterations) > 100 && bad_rounds == 0,
            "lock_churn mutual exclusion", "%ld critical sections, %d violations, %d errors, "
            "%d of %d victims killed holding the lock (%d markers taken over), worst recovery %.1f ms, "
            "%d/%d clean exits",
            atomic_load(&ch->iterations), atomic_load(&ch->violations), atomic_load(&ch->errors),
            killed_holding, CHURN_ROUNDS, atomic_load(&ch->recovered_markers), worst, clean, CHURNERS);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* kill_alloc: 8 children reserve a 16 MiB base and hammer random sizes on top; 4 are SIGKILLed
 * mid-hammering. After the survivors stop hammering, their bases alone must be counted once the
 * dead are reaped (clear_proc_slot_nolock; or already by a survivor's refused reservation). */

#define ALLOCATORS 8
#define BASE (16 * MiB)

struct alloc_ctl {
    _Atomic int stop;
    _Atomic int errors;
    _Atomic long ops;
};
static struct alloc_ctl *ac;

static int allocator_child(void *arg) {
    struct pipes *p = arg;
    pipes_child(p);
    t_seed((uint64_t)getpid() * 31u);
    ensure_initialized();
    if (hami_reserve(0, BASE, 2) != HAMI_OK)
        return 4;
    t_write_byte(p->up[1], 'R');
    size_t held[8];
    int kinds[8];
    int n = 0;
    while (!atomic_load(&ac->stop)) {
        if (n < 8 && t_rand() % 2) {
            size_t s = (size_t)t_rand_range(1, 4 * MiB);
            int kind = t_rand() % 3 == 0 ? 0 : 2;
            int rc = hami_reserve(0, s, kind);
            if (rc == HAMI_OK) {
                held[n] = s;
                kinds[n] = kind;
                n++;
            } else if (rc != HAMI_REFUSED) {
                atomic_fetch_add(&ac->errors, 1);
            }
        } else if (n > 0) {
            n--;
            if (hami_release(0, held[n], kinds[n]) != HAMI_OK)
                atomic_fetch_add(&ac->errors, 1);
        }
        atomic_fetch_add(&ac->ops, 1);
    }
    while (n > 0) {
        n--;
        hami_release(0, held[n], kinds[n]);
    }
    t_write_byte(p->up[1], 'S');
    t_read_byte(p->down[0], 30000);
    return 0;
}

static int check_kill_alloc(void) {
    ac = shared_alloc(sizeof *ac);
    ensure_initialized();
    struct pipes p[ALLOCATORS];
    pid_t pids[ALLOCATORS];
    for (int i = 0; i < ALLOCATORS; i++) {
        pipes_open(&p[i]);
        pids[i] = spawn(allocator_child, &p[i]);
        pipes_parent(&p[i]);
    }
    int ready = 0;
    for (int i = 0; i < ALLOCATORS; i++)
        ready += t_read_byte(p[i].up[0], 10000) == 'R';
    t_sleep_ms(30);
    /* Kill the even ones at random moments over ~100 ms. */
    for (int i = 0; i < ALLOCATORS; i += 2) {
        t_sleep_ms((double)t_rand_range(5, 30));
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
    atomic_store(&ac->stop, 1);
    int stopped = 0;
    for (int i = 1; i < ALLOCATORS; i += 2)
        stopped += t_read_byte(p[i].up[0], 10000) == 'S';
    uint64_t before = hami_device_usage(0);
    double t0 = t_now_ms();
    int freed = clear_proc_slot_nolock(1);
    double clear_ms = t_now_ms() - t0;
    uint64_t after = hami_device_usage(0);
    uint64_t slots = rv_total_all_slots(0);
    int dead_slots = 0;
    for (int i = 0; i < ALLOCATORS; i += 2)
        dead_slots += rv_slot_of(pids[i]) >= 0;
    uint64_t want = (ALLOCATORS / 2) * BASE;
    t_check(ready == ALLOCATORS && stopped == ALLOCATORS / 2 && after == want && slots == want &&
                dead_slots == 0 && atomic_load(&ac->errors) == 0 && clear_ms < 1500,
            "kill_alloc: survivors counted exactly after reaping",
            "%ld ops; usage %lu MiB before reaping, %lu bytes after (want %lu), all-slot sum %lu, "
            "clear_proc_slot_nolock -> %d in %.1f ms, %d dead slots left, %d errors",
            atomic_load(&ac->ops), (unsigned long)(before / MiB), (unsigned long)after,
            (unsigned long)want, (unsigned long)slots, freed, clear_ms, dead_slots,
            atomic_load(&ac->errors));
    t_check(clear_proc_slot_nolock(1) == 0, "kill_alloc: nothing left to reap", "%s", "0");
    for (int i = 1; i < ALLOCATORS; i += 2) {
        t_write_byte(p[i].down[1], 'q');
        int st = t_wait(pids[i], 5000);
        if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            t_check(0, "kill_alloc: survivor exit", "%s", t_status_text(st));
    }
    t_sleep_ms(150); /* survivors exit holding their base: the next view (every 100 ms) reaps */
    t_check(hami_device_usage(0) == 0 && rv_total_everything() == 0, "kill_alloc: 0 after survivors exit",
            "usage %lu", (unsigned long)hami_device_usage(0));
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* reap_by_reserve: 8 children fill the limit (8 x 16 MiB = 128 MiB); 4 are SIGKILLed; a
 * reservation of 64 MiB must then be admitted, which only reaping the dead makes possible. */

static int filler_child(void *arg) {
    struct pipes *p = arg;
    pipes_child(p);
    ensure_initialized();
    int rc = hami_reserve(0, BASE, 2);
    t_write_byte(p->up[1], rc == HAMI_OK ? 'R' : 'x');
    t_read_byte(p->down[0], 30000);
    return 0;
}

static int check_reap_by_reserve(void) {
    ensure_initialized();
    struct pipes p[8];
    pid_t pids[8];
    int ready = 0;
    for (int i = 0; i < 8; i++) {
        pipes_open(&p[i]);
        pids[i] = spawn(filler_child, &p[i]);
        pipes_parent(&p[i]);
        ready += t_read_byte(p[i].up[0], 10000) == 'R';
    }
    int full = hami_reserve(0, 1, 2);
    int dead = 0;
    for (int i = 0; i < 8; i += 2) {
        kill(pids[i], SIGKILL);
        if (i == 0)
            dead += waitpid(pids[i], NULL, 0) == pids[i];
        else /* the others stay zombies: dead all the same */
            dead += wait_dead_keep_zombie(pids[i], 5000) == 0;
    }
    /* Reaping on refusal is rate-limited (100 ms), so the memory comes back within that, not
     * necessarily on the first try; the bound is the one second past detection. */
    double t0 = t_now_ms();
    int rc = hami_reserve(0, 4 * BASE, 2);
    while (rc != HAMI_OK && t_now_ms() - t0 < 1000) {
        usleep(10000);
        rc = hami_reserve(0, 4 * BASE, 2);
    }
    double ms = t_now_ms() - t0;
    uint64_t u = hami_device_usage(0);
    int over = hami_reserve(0, 1, 2);
    t_check(ready == 8 && dead == 4 && full == HAMI_REFUSED && rc == HAMI_OK && u == 8 * BASE &&
                over == HAMI_REFUSED && ms < 1000,
            "reap_by_reserve", "full limit refuses %d; after 4 kills (%d dead) 64 MiB -> %d in %.1f ms; "
            "usage %lu MiB; one more byte -> %d",
            full, dead, rc, ms, (unsigned long)(u / MiB), over);
    if (rc == HAMI_OK)
        hami_release(0, 4 * BASE, 2);
    for (int i = 0; i < 8; i++) {
        if (i % 2) {
            t_write_byte(p[i].down[1], 'q');
            t_wait(pids[i], 5000);
        } else if (i) {
            waitpid(pids[i], NULL, 0);
        }
    }
    clear_proc_slot_nolock(1);
    t_check(hami_device_usage(0) == 0 && rv_total_everything() == 0, "reap_by_reserve: 0 at the end",
            "%lu", (unsigned long)hami_device_usage(0));
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* sigterm: the process still dies of SIGTERM, and its slot (it held usage) is reaped once it is
 * dead; an application's own handler is kept (its slot is reaped after its exit); SIGINT
 * likewise. */

static volatile sig_atomic_t got_term;
static void app_handler(int sig) {
    (void)sig;
    got_term = 1;
}

struct term_arg {
    struct pipes p;
    int own_handler;
};

static int term_child(void *arg) {
    struct term_arg *a = arg;
    pipes_child(&a->p);
    if (a->own_handler) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = app_handler;
        sigaction(SIGTERM, &sa, NULL);
    }
    ensure_initialized();
    int rc = hami_reserve(0, 8 * MiB, 2);
    int rc2 = add_gpu_device_memory_usage(getpid(), 1, 4 * MiB, 0);
    t_write_byte(a->p.up[1], rc == HAMI_OK && rc2 == 0 ? 'R' : 'x');
    while (!got_term)
        pause();
    exit(7);
}

static void term_case(const char *name, int sig, int own_handler) {
    struct term_arg a = {.own_handler = own_handler};
    pipes_open(&a.p);
    pid_t pid = spawn(term_child, &a);
    pipes_parent(&a.p);
    int c = t_read_byte(a.p.up[0], 10000);
    int slot = rv_slot_of(pid);
    uint64_t u0 = hami_device_usage(0), u1 = hami_device_usage(1);
    double t0 = t_now_ms();
    kill(pid, sig);
    int st = t_wait(pid, 5000);
    double ms = t_now_ms() - t0;
    /* A process that dies holding memory leaves its slot until it is dead (the driver frees its
     * memory only then); the next view reaps it, at most 100 ms after the last. */
    t_sleep_ms(150);
    (void)hami_device_usage(0);
    const shared_region_t *r = rv_map();
    int32_t slot_pid = slot >= 0 ? atomic_load(&r->procs[slot].pid) : -1;
    uint64_t slot_total = slot >= 0 ? atomic_load(&r->procs[slot].used[0].total) +
                                          atomic_load(&r->procs[slot].used[1].total)
                                    : 1;
    int died_right = own_handler ? (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 7)
                                 : (st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == sig);
    t_check(c == 'R' && slot >= 0 && u0 == 8 * MiB && u1 == 4 * MiB && died_right && slot_pid == 0 &&
                slot_total == 0 && hami_device_usage(0) == 0 && hami_device_usage(1) == 0 && ms < 2000,
            name, "usage %lu+%lu MiB before; %s after %.1f ms; slot %d pid %d, its usage %lu; usage now %lu",
            (unsigned long)(u0 / MiB), (unsigned long)(u1 / MiB), t_status_text(st), ms, slot,
            (int)slot_pid, (unsigned long)slot_total, (unsigned long)hami_device_usage(0));
    close(a.p.up[0]);
    close(a.p.down[1]);
}

static int check_sigterm(void) {
    ensure_initialized();
    term_case("SIGTERM: the dead process's slot is reaped, it dies of SIGTERM", SIGTERM, 0);
    term_case("SIGINT: the dead process's slot is reaped, it dies of SIGINT", SIGINT, 0);
    term_case("an application's SIGTERM handler is kept; once it exits its slot is reaped",
              SIGTERM, 1);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* exit_while_locked: B exits normally while A holds the lock: B's exit must not wait for the
 * lock, must free B's slot, and must not release A's lock. Then C exits holding the lock
 * itself: survivors recover it from the dead owner. */

static int lock_holder_child(void *arg) {
    struct pipes *p = arg;
    pipes_child(p);
    ensure_initialized();
    lock_shrreg();
    t_write_byte(p->up[1], 'L');
    if (t_read_byte(p->down[0], 30000) != 'u')
        return 5;
    unlock_shrreg();
    t_write_byte(p->up[1], 'U');
    t_read_byte(p->down[0], 30000);
    return 0;
}

static int exiter_child(void *arg) {
    struct pipes *p = arg;
    pipes_child(p);
    ensure_initialized();
    int rc = hami_reserve(0, 8 * MiB, 2);
    t_write_byte(p->up[1], rc == HAMI_OK ? 'B' : 'x');
    t_read_byte(p->down[0], 30000);
    exit(0); /* normal exit, reservation still held */
}

static int exit_holding_child(void *arg) {
    struct pipes *p = arg;
    pipes_child(p);
    ensure_initialized();
    hami_reserve(0, 4 * MiB, 2);
    int rc = hami_lock_region(5000);
    t_write_byte(p->up[1], rc == HAMI_OK ? 'L' : 'x');
    t_read_byte(p->down[0], 30000);
    exit(0); /* exits holding the lock */
}

static int check_exit_while_locked(void) {
    ensure_initialized();
    struct pipes pa, pb, pc;
    /* B registers (which takes the lock briefly) and reserves first; then A takes the lock. */
    pipes_open(&pb);
    pid_t b = spawn(exiter_child, &pb);
    pipes_parent(&pb);
    int lb = t_read_byte(pb.up[0], 10000);
    pipes_open(&pa);
    pid_t a = spawn(lock_holder_child, &pa);
    pipes_parent(&pa);
    int la = t_read_byte(pa.up[0], 10000);
    int slot_b = rv_slot_of(b);
    uint64_t u_before = hami_device_usage(0);
    double t0 = t_now_ms();
    t_write_byte(pb.down[1], 'x');
    int stb = t_wait(b, 5000);
    double exit_ms = t_now_ms() - t0;
    pid_t owner = rv_owner_pid();
    int busy = hami_lock_region(300);
    /* B exited holding 8 MiB: its slot waits for a reaper, and none can reap while A holds
     * the lock, so the usage stays counted (conservative) until A unlocks. */
    t_sleep_ms(150);
    uint64_t u_after = hami_device_usage(0);
    t_check(la == 'L' && lb == 'B' && u_before == 8 * MiB && stb != -1 && WIFEXITED(stb) &&
                WEXITSTATUS(stb) == 0 && exit_ms < 1000 && owner == a && busy == HAMI_TIMEOUT &&
                u_after == 8 * MiB && slot_b >= 0,
            "a normal exit while another holds the lock",
            "A %c, B %c; exit took %.1f ms (%s); lock still A's: owner %s, others time out %d; "
            "usage %lu -> %lu, still counted while the lock is held",
            la > 0 ? la : '?', lb > 0 ? lb : '?', exit_ms, t_status_text(stb), owner == a ? "A" : "not A", busy,
            (unsigned long)u_before, (unsigned long)u_after);
    t_write_byte(pa.down[1], 'u');
    int ua = t_read_byte(pa.up[0], 5000);
    int rc = hami_lock_region(1000);
    int rc2 = hami_unlock_region();
    t_write_byte(pa.down[1], 'q');
    int sta = t_wait(a, 5000);
    t_check(ua == 'U' && rc == HAMI_OK && rc2 == HAMI_OK && sta != -1 && WIFEXITED(sta) && WEXITSTATUS(sta) == 0,
            "the holder's unlock still works afterwards", "lock %d, unlock %d, A %s", rc, rc2,
            t_status_text(sta));
    t_sleep_ms(150);
    uint64_t u_free = hami_device_usage(0);
    t_check(u_free == 0 && atomic_load(&rv_map()->procs[slot_b].pid) == 0,
            "once the lock is free, the next view reaps B's slot", "usage %lu, slot pid %d",
            (unsigned long)u_free, (int)atomic_load(&rv_map()->procs[slot_b].pid));

    pipes_open(&pc);
    pid_t c = spawn(exit_holding_child, &pc);
    pipes_parent(&pc);
    int lc = t_read_byte(pc.up[0], 10000);
    pid_t owner_c = rv_owner_pid();
    t0 = t_now_ms();
    t_write_byte(pc.down[1], 'x');
    int stc = t_wait(c, 5000);
    double exit_c = t_now_ms() - t0;
    double t1 = t_now_ms();
    int rc3 = hami_lock_region(8000);
    double acq = t_now_ms() - t1;
    pid_t owner_now = rv_owner_pid();
    hami_unlock_region();
    t_sleep_ms(150); /* C died holding usage too: the next view reaps its slot */
    t_check(lc == 'L' && owner_c == c && stc != -1 && WIFEXITED(stc) && exit_c < 1000 && rc3 == HAMI_OK &&
                owner_now == getpid() && acq < RECOVERY_BOUND_MS && hami_device_usage(0) == 0,
            "exit while holding the lock: recovered from the dead owner",
            "exit took %.1f ms (%s); then acquired in %.1f ms (rc %d); usage %lu", exit_c,
            t_status_text(stc), acq, rc3, (unsigned long)hami_device_usage(0));
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* fork_holding: a child forked while its parent holds the lock does not hold it: its unlock
 * releases nothing, its own attempt waits like anyone's, and its exit leaves the parent's lock
 * alone. */

static int forked_child(void *arg) {
    int *fd = arg;
    int out[3];
    double t0 = t_now_ms();
    out[0] = hami_unlock_region();
    out[1] = hami_lock_region(200);
    out[2] = (int)(t_now_ms() - t0);
    if (write(*fd, out, sizeof out) != (ssize_t)sizeof out)
        return 3;
    return 0;
}

static int check_fork_holding(void) {
    ensure_initialized();
    int rc = hami_lock_region(1000);
    int again = hami_lock_region(1000);
    int res[2];
    t_pipe(res);
    pid_t c = spawn(forked_child, &res[1]);
    close(res[1]);
    int out[3] = {-9, -9, -1};
    int got = t_read_exact(res[0], out, sizeof out, 10000);
    int st = t_wait(c, 5000);
    pid_t owner = rv_owner_pid();
    /* A second child agrees that the parent still holds it. */
    int res2[2];
    t_pipe(res2);
    pid_t d = spawn(forked_child, &res2[1]);
    close(res2[1]);
    int out2[3] = {-9, -9, -1};
    int got2 = t_read_exact(res2[0], out2, sizeof out2, 10000);
    t_wait(d, 5000);
    int un = hami_unlock_region();
    int un2 = hami_unlock_region();
    t_check(rc == HAMI_OK && again == HAMI_ALREADY_HELD && got == 0 && out[0] == HAMI_NOT_HELD &&
                out[1] == HAMI_TIMEOUT && out[2] < 2000 && st != -1 && WIFEXITED(st) &&
                WEXITSTATUS(st) == 0 && owner == getpid() && got2 == 0 && out2[1] == HAMI_TIMEOUT &&
                un == HAMI_OK && un2 == HAMI_NOT_HELD && rv_owner_pid() == 0,
            "fork_holding", "lock %d, again %d; child: unlock %d, lock %d in %d ms, %s; owner still "
            "parent %d; second child lock %d; unlock %d, again %d",
            rc, again, out[0], out[1], out[2], t_status_text(st), owner == getpid(), out2[1], un, un2);
    close(res[0]);
    close(res2[0]);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* init_kill: a helper opens the fresh file, holds the init lock as a C initialiser does
 * (lockf on the region's bytes) and, in the "interrupted" variant, leaves the region half
 * written (flag INIT_IN_PROGRESS, a garbage limit), as an initialiser dying mid-init would; it is
 * SIGKILLed while 6 processes wait in ensure_initialized. They must all proceed within the bound,
 * on a properly initialised region. */

struct init_arg {
    struct pipes p;
    int interrupted;
};

static int init_helper(void *arg) {
    struct init_arg *a = arg;
    pipes_child(&a->p);
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = open(path, O_RDWR | O_CREAT, 0666);
    if (fd < 0)
        return 6;
    if (lockf(fd, F_LOCK, (off_t)sizeof(shared_region_t)) != 0)
        return 7;
    if (a->interrupted) {
        if (ftruncate(fd, (off_t)sizeof(shared_region_t) + 1) != 0)
            return 8;
        shared_region_t *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (r == MAP_FAILED)
            return 9;
        atomic_store(&r->initialized_flag, INIT_IN_PROGRESS);
        atomic_store(&r->limit[0], 1); /* half-written garbage */
        atomic_store(&r->proc_num, 77);
    }
    t_write_byte(a->p.up[1], 'H');
    t_read_byte(a->p.down[0], 50000); /* killed here */
    return 0;
}

struct init_result {
    double done_at; /* CLOCK_MONOTONIC ms when ensure_initialized returned */
    int reserve_rc;
};

static int init_waiter(void *arg) {
    int *fd = arg;
    ensure_initialized();
    struct init_result r = {t_now_ms(), hami_reserve(0, 8 * MiB, 2)};
    if (write(*fd, &r, sizeof r) != (ssize_t)sizeof r)
        return 3;
    pause(); /* keep the reservation until killed by the parent's cleanup */
    return 0;
}

static int check_init_kill(int interrupted) {
    /* This process must not touch the library before the helper holds the file. */
    struct init_arg a = {.interrupted = interrupted};
    pipes_open(&a.p);
    pid_t helper = spawn(init_helper, &a);
    pipes_parent(&a.p);
    int h = t_read_byte(a.p.up[0], 10000);
    int res[2];
    t_pipe(res);
    pid_t w[6];
    for (int i = 0; i < 6; i++)
        w[i] = spawn(init_waiter, &res[1]);
    close(res[1]);
    t_sleep_ms(300);
    int early = t_read_byte(res[0], 0); /* nobody may be through while the lock is held */
    double t_kill = t_now_ms();
    kill(helper, SIGKILL);
    waitpid(helper, NULL, 0);
    double worst = 0;
    int through = 0, admitted = 0;
    for (int i = 0; i < 6; i++) {
        struct init_result r;
        if (t_read_exact(res[0], &r, sizeof r, 15000) != 0)
            break;
        through++;
        admitted += r.reserve_rc == HAMI_OK;
        if (r.done_at - t_kill > worst)
            worst = r.done_at - t_kill;
    }
    ensure_initialized();
    const shared_region_t *reg = rv_map();
    char name[80];
    snprintf(name, sizeof name, "init_kill (%s)", interrupted ? "killed mid-init" : "killed holding the init lock");
    t_check(h == 'H' && early == -1 && through == 6 && admitted == 6 && worst < RECOVERY_BOUND_MS &&
                atomic_load(&reg->initialized_flag) == MAGIC && atomic_load(&reg->limit[0]) == 64 * MiB &&
                rv_proc_num() == 7 && hami_device_usage(0) == 48 * MiB,
            name, "%d/6 through, last %.1f ms after the kill, %d admitted; flag %d, limit %lu, proc_num %d, "
            "usage %lu MiB",
            through, worst, admitted, atomic_load(&reg->initialized_flag),
            (unsigned long)atomic_load(&reg->limit[0]), rv_proc_num(),
            (unsigned long)(hami_device_usage(0) / MiB));
    for (int i = 0; i < 6; i++) {
        kill(w[i], SIGKILL);
        waitpid(w[i], NULL, 0);
    }
    close(res[0]);
    return 0;
}

static int check_init_kill_fresh(void) { return check_init_kill(0); }
static int check_init_kill_mid(void) { return check_init_kill(1); }

/* ------------------------------------------------------------------------------------------ */

struct check {
    const char *name;
    int (*fn)(void);
    const char *limit; /* CUDA_DEVICE_MEMORY_LIMIT for the check's region */
    int deadline_ms;
};

static const struct check checks[] = {
    {"lock_kill", check_lock_kill, "64m", 30000},
    {"lock_churn", check_lock_churn, "64m", 60000},
    {"kill_alloc", check_kill_alloc, "256m", 30000},
    {"reap_by_reserve", check_reap_by_reserve, "128m", 30000},
    {"sigterm", check_sigterm, "64m", 30000},
    {"exit_while_locked", check_exit_while_locked, "64m", 30000},
    {"fork_holding", check_fork_holding, "64m", 30000},
    {"init_kill_fresh", check_init_kill_fresh, "64m", 30000},
    {"init_kill_mid", check_init_kill_mid, "64m", 30000},
};
#define NCHECKS (sizeof checks / sizeof checks[0])

static int run_one(const struct check *c) {
    t_watchdog((unsigned)(c->deadline_ms / 1000 + 5));
    t_seed((uint64_t)getpid() ^ (uint64_t)time(NULL));
    c->fn();
    printf("%s check %s: %d failure(s)\n", t_failures ? "FAIL" : "PASS", c->name, t_failures);
    return t_failures ? 1 : 0;
}

int main(int argc, char **argv) {
    t_reexec_with_env(argv, "top.cache", NULL);
    if (argc == 3 && !strcmp(argv[1], "--check")) {
        for (size_t i = 0; i < NCHECKS; i++)
            if (!strcmp(checks[i].name, argv[2]))
                return run_one(&checks[i]);
        return 2;
    }
    int failed = 0, ran = 0;
    double start = t_now_ms();
    for (size_t i = 0; i < NCHECKS; i++) {
        const struct check *c = &checks[i];
        int wanted = argc == 1;
        for (int j = 1; j < argc; j++)
            wanted |= !strcmp(argv[j], c->name);
        if (!wanted)
            continue;
        ran++;
        double t0 = t_now_ms();
        pid_t pid = fork();
        if (pid < 0)
            t_die("fork");
        if (pid == 0) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.cache", t_dir(), c->name);
            setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", path, 1);
            setenv("CUDA_DEVICE_MEMORY_LIMIT", c->limit, 1);
            char *args[] = {argv[0], "--check", (char *)c->name, NULL};
            execv("/proc/self/exe", args);
            _exit(3);
        }
        int st = t_wait(pid, c->deadline_ms);
        double ms = t_now_ms() - t0;
        int ok = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        failed += !ok;
        printf("%s %-18s %7.0f ms (deadline %d ms, %s)\n", ok ? "PASS" : "FAIL", c->name, ms,
               c->deadline_ms, t_status_text(st));
        fflush(stdout);
    }
    printf("%s faults: %d of %d checks failed, %.0f ms\n", failed || !ran ? "FAIL" : "PASS", failed, ran,
           t_now_ms() - start);
    t_cleanup_dir();
    return failed || !ran ? 1 : 0;
}
