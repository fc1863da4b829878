/* The generated header's layout, checked against a second statement of HAMi-core v1.2's numbers
 * (from ../shared/reference/hami-region-protocol.md section 1, restated here by hand, not taken
 * from the Rust code). Exit status 0 only if every check holds. */
#include <stdio.h>
#include <stddef.h>
#include "hami_shm.h"

static int failures;

#define CHECK(what, got, want)                                                                 \
    do {                                                                                       \
        unsigned long g_ = (unsigned long)(got), w_ = (unsigned long)(want);                   \
        if (g_ != w_) {                                                                        \
            printf("FAIL %-40s %lu, want %lu\n", what, g_, w_);                                \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)
#define OFF(type, field, want) CHECK("offsetof(" #type ", " #field ")", offsetof(type, field), want)
#define SIZE(type, want) CHECK("sizeof(" #type ")", sizeof(type), want)

int main(void) {
    SIZE(sem_t, 32);
    SIZE(_Atomic uint64_t, 8);
    SIZE(_Atomic int32_t, 4);

    SIZE(device_memory_t, 64);
    /* A UUID entry is the 96-byte string, nothing else (HAMi's monitor compares all 96 bytes). */
    SIZE(DeviceUuid, 96);
    /* Our tail: one page at the first page boundary after the region and C's byte at its end. */
    SIZE(SmBucket, 40);
    SIZE(hami_ext_t, 4096);
    CHECK("EXT_OFFSET", EXT_OFFSET, 2011136);
    CHECK("EXT_END", EXT_END, 2011136 + 4096);
    OFF(hami_ext_t, magic, 0);
    OFF(hami_ext_t, version, 8);
    OFF(hami_ext_t, devs, 12);
    OFF(hami_ext_t, buckets, 16);
    OFF(hami_ext_t, buckets[1].spent, 16 + 40 + 32);
    OFF(hami_ext_t, context_cost, 16 + 16 * 40);
    OFF(hami_ext_t, context_probe, 16 + 16 * 40 + 16 * 8);
    OFF(hami_ext_t, reserved, 16 + 16 * 40 + 2 * 16 * 8);
    OFF(device_memory_t, context_size, 0);
    OFF(device_memory_t, module_size, 8);
    OFF(device_memory_t, data_size, 16);
    OFF(device_memory_t, offset, 24);
    OFF(device_memory_t, total, 32);
    OFF(device_memory_t, unused, 40);

    SIZE(device_util_t, 48);
    OFF(device_util_t, dec_util, 0);
    OFF(device_util_t, enc_util, 8);
    OFF(device_util_t, sm_util, 16);
    OFF(device_util_t, unused, 24);

    SIZE(shrreg_proc_slot_t, 1960);
    OFF(shrreg_proc_slot_t, pid, 0);
    OFF(shrreg_proc_slot_t, hostpid, 4);
    OFF(shrreg_proc_slot_t, used, 8);
    OFF(shrreg_proc_slot_t, used[1].total, 8 + 64 + 32);
    OFF(shrreg_proc_slot_t, monitorused, 1032);
    OFF(shrreg_proc_slot_t, device_util, 1160);
    OFF(shrreg_proc_slot_t, device_util[1].sm_util, 1160 + 48 + 16);
    OFF(shrreg_proc_slot_t, status, 1928);
    OFF(shrreg_proc_slot_t, seqlock, 1936);
    OFF(shrreg_proc_slot_t, unused, 1944);

    SIZE(shared_region_t, 2008952);
    OFF(shared_region_t, initialized_flag, 0);
    OFF(shared_region_t, major_version, 4);
    OFF(shared_region_t, minor_version, 8);
    OFF(shared_region_t, sm_init_flag, 12);
    OFF(shared_region_t, owner_pid, 16);
    OFF(shared_region_t, sem, 24);
    OFF(shared_region_t, device_num, 56);
    OFF(shared_region_t, uuids, 64);
    OFF(shared_region_t, limit, 1600);
    OFF(shared_region_t, sm_limit, 1728);
    OFF(shared_region_t, procs, 1856);
    OFF(shared_region_t, procs[1], 1856 + 1960);
    OFF(shared_region_t, proc_num, 2008896);
    OFF(shared_region_t, utilization_switch, 2008900);
    OFF(shared_region_t, recent_kernel, 2008904);
    OFF(shared_region_t, priority, 2008908);
    OFF(shared_region_t, last_kernel_time, 2008912);
    OFF(shared_region_t, sem_postinit, 2008920);

    CHECK("MAGIC", MAGIC, 19920718);
    CHECK("ABI_SLOTS", ABI_SLOTS, 1024);
    CHECK("ABI_DEVS", ABI_DEVS, 16);
    CHECK("UUID_LEN", UUID_LEN, 96);
    CHECK("MAJOR_VERSION.MINOR_VERSION", MAJOR_VERSION * 100 + MINOR_VERSION, 102);

    if (failures) {
        printf("layout: %d checks failed\n", failures);
        return 1;
    }
    printf("layout: all checks passed\n");
    return 0;
}
