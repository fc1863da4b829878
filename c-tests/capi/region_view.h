/* Reading the shared region directly through hami_shm.h's types, independently of the library's
 * own readers: the ground truth the C API tests compare the API's answers with. */
#ifndef HAMI_CAPI_REGION_VIEW_H
#define HAMI_CAPI_REGION_VIEW_H

#include "hami_shm.h"

#include "capi_test.h"

static const shared_region_t *rv_region;

/* Maps the run's region file (read-only, for the life of the process). */
static __attribute__((unused)) const shared_region_t *rv_map(void) {
    if (!rv_region)
        rv_region = t_map_region(sizeof(shared_region_t));
    return rv_region;
}

static __attribute__((unused)) int rv_proc_num(void) {
    int n = atomic_load(&rv_map()->proc_num);
    return n < 0 ? 0 : n > ABI_SLOTS ? ABI_SLOTS : n;
}

/* Index of the slot holding `pid`, or -1. */
static __attribute__((unused)) int rv_slot_of(pid_t pid) {
    for (int i = 0; i < rv_proc_num(); i++)
        if (atomic_load(&rv_map()->procs[i].pid) == pid)
            return i;
    return -1;
}

/* Slots in use (pid != 0) within [0, proc_num). */
static __attribute__((unused)) int rv_used_slots(void) {
    int n = 0;
    for (int i = 0; i < rv_proc_num(); i++)
        n += atomic_load(&rv_map()->procs[i].pid) != 0;
    return n;
}

/* Sum of used[dev].total over every slot in [0, proc_num), free ones included. */
static __attribute__((unused)) uint64_t rv_total_all_slots(int dev) {
    uint64_t sum = 0;
    for (int i = 0; i < rv_proc_num(); i++)
        sum += atomic_load(&rv_map()->procs[i].used[dev].total);
    return sum;
}

/* Sum over all devices and all slots in [0, proc_num). */
static __attribute__((unused)) uint64_t rv_total_everything(void) {
    uint64_t sum = 0;
    for (int d = 0; d < ABI_DEVS; d++)
        sum += rv_total_all_slots(d);
    return sum;
}

/* The pid in owner_pid (its low 32 bits). */
static __attribute__((unused)) pid_t rv_owner_pid(void) {
    return (pid_t)(uint32_t)(atomic_load(&rv_map()->owner_pid) & 0xffffffffu);
}

#endif
