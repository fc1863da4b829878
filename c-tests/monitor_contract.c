/* The bytes HAMi's monitor reads and writes, against the bytes we extend.
 *
 * The monitor's view is transcribed here from its Go source, HAMi commit
 * 4707fb02c91c545bc7343ce26dba4c32919f9a3e, pkg/monitor/nvidia/v1/spec.go: the structs
 * deviceMemory, deviceUtilization, shrregProcSlotT, uuid, semT and sharedRegionT, field by field
 * with Go's types (int32 -> int32_t, uint64 -> uint64_t, [96]byte -> char[96]); on amd64 Go lays
 * them out as C does. The fields listed in `monitor_reads` are the ones its methods
 * (DeviceMemory*, DeviceSmUtil, IsValidUUID, DeviceUUID, DeviceMemoryLimit, SetDeviceSmLimit,
 * LastKernelTime, GetPriority, Get/SetRecentKernel, Get/SetUtilizationSwitch, DeviceNum,
 * activeProcs) and loadCache's header check touch.
 *
 * Checked: (1) every such field sits at the same offset and size in our shared_region_t, (2) no
 * byte of ours (the slot's unused[0] owner word, the high half of owner_pid, the hami_ext_t tail)
 * overlaps one of them, and the tail lies past the monitor's MinSize and past the byte C peers
 * write at offset sizeof(shared_region_t), (3) a UUID entry is only text (no field of ours inside
 * it). Exit status 0 only if every check holds. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "hami_shm.h"

/* spec.go, transcribed. */
typedef struct { uint64_t contextSize, moduleSize, bufferSize, offset, total, unused[3]; } go_deviceMemory;
typedef struct { uint64_t decUtil, encUtil, smUtil, unused[3]; } go_deviceUtilization;
typedef struct {
    int32_t pid, hostpid;
    go_deviceMemory used[16];
    uint64_t monitorused[16];
    go_deviceUtilization deviceUtil[16];
    int32_t status;
    uint64_t unused[3];
} go_shrregProcSlotT;
typedef struct { char uuid[96]; } go_uuid;
typedef struct { char sem[32]; } go_semT;
typedef struct {
    int32_t initializedFlag, majorVersion, minorVersion, smInitFlag;
    uint64_t ownerPid;
    go_semT sem;
    uint64_t num;
    go_uuid uuids[16];
    uint64_t limit[16], smLimit[16];
    go_shrregProcSlotT procs[1024];
    int32_t procnum, utilizationSwitch, recentKernel, priority;
    int64_t lastKernelTime;
    uint64_t unused[4];
} go_sharedRegionT;

struct range { const char *name; size_t off, len, ours_off, ours_len; };

static int failures;
#define FAIL(...) (printf("FAIL " __VA_ARGS__), printf("\n"), failures++)

#define GO(f) offsetof(go_sharedRegionT, f), sizeof(((go_sharedRegionT *)0)->f)
#define US(f) offsetof(shared_region_t, f), sizeof(((shared_region_t *)0)->f)
#define SLOT(i, f) offsetof(go_sharedRegionT, procs) + (i) * sizeof(go_shrregProcSlotT) + offsetof(go_shrregProcSlotT, f)

int main(void)
{
    /* (1) The fields the monitor reads, at the same place in both views. */
    struct range reads[] = {
        {"initializedFlag", GO(initializedFlag), US(initialized_flag)},
        {"majorVersion", GO(majorVersion), US(major_version)},
        {"minorVersion", GO(minorVersion), US(minor_version)},
        {"num", GO(num), US(device_num)},
        {"uuids", GO(uuids), US(uuids)},
        {"limit", GO(limit), US(limit)},
        {"smLimit", GO(smLimit), US(sm_limit)},
        {"procnum", GO(procnum), US(proc_num)},
        {"utilizationSwitch", GO(utilizationSwitch), US(utilization_switch)},
        {"recentKernel", GO(recentKernel), US(recent_kernel)},
        {"priority", GO(priority), US(priority)},
        {"lastKernelTime", GO(lastKernelTime), US(last_kernel_time)},
        {"procs[0].status", GO(procs[0].status), US(procs[0].status)},
        {"procs[0].used", GO(procs[0].used), US(procs[0].used)},
        {"procs[0].deviceUtil[15].smUtil", GO(procs[0].deviceUtil[15].smUtil), US(procs[0].device_util[15].sm_util)},
        {"procs[1023].status", GO(procs[1023].status), US(procs[1023].status)},
        {"procs[1023].used", GO(procs[1023].used), US(procs[1023].used)},
        {"procs[1023].deviceUtil[0].smUtil", GO(procs[1023].deviceUtil[0].smUtil), US(procs[1023].device_util[0].sm_util)},
    };
    size_t nreads = sizeof reads / sizeof reads[0];
    for (size_t i = 0; i < nreads; i++)
        if (reads[i].off != reads[i].ours_off || reads[i].len != reads[i].ours_len)
            FAIL("%s: the monitor reads %zu+%zu, we keep it at %zu+%zu", reads[i].name, reads[i].off,
                 reads[i].len, reads[i].ours_off, reads[i].ours_len);

    /* (2) Our extension bytes: none overlaps a monitor field. Every slot's owner word is the same
     * offset within the slot, so slots 0 and 1023 stand for all. */
    struct range ours[] = {
        {"owner_pid high half", offsetof(shared_region_t, owner_pid) + 4, 4, 0, 0},
        {"procs[0].unused[0]", offsetof(shared_region_t, procs[0].unused[0]), 8, 0, 0},
        {"procs[1023].unused[0]", offsetof(shared_region_t, procs[1023].unused[0]), 8, 0, 0},
        {"hami_ext_t tail", EXT_OFFSET, sizeof(hami_ext_t), 0, 0},
    };
    for (size_t e = 0; e < sizeof ours / sizeof ours[0]; e++)
        for (size_t i = 0; i < nreads; i++)
            if (ours[e].off < reads[i].off + reads[i].len && reads[i].off < ours[e].off + ours[e].len)
                FAIL("%s (%zu+%zu) overlaps the monitor's %s (%zu+%zu)", ours[e].name, ours[e].off,
                     ours[e].len, reads[i].name, reads[i].off, reads[i].len);
    /* The monitor maps the whole file but reads sizeof(sharedRegionT) (its MinSize); C peers map
     * sizeof(shared_region_t) and write one byte at that offset. */
    if (sizeof(go_sharedRegionT) != sizeof(shared_region_t))
        FAIL("monitor MinSize %zu, our region %zu", sizeof(go_sharedRegionT), sizeof(shared_region_t));
    if (EXT_OFFSET <= sizeof(shared_region_t))
        FAIL("the tail (%d) starts at or before the byte C peers write (%zu)", EXT_OFFSET,
             sizeof(shared_region_t));
    if (EXT_OFFSET % 4096 != 0)
        FAIL("the tail (%d) is not page-aligned", EXT_OFFSET);

    /* (3) A UUID entry is 96 bytes of text: nothing of ours lives inside it. */
    if (sizeof(DeviceUuid) != sizeof(go_uuid) || sizeof(((DeviceUuid *)0)->text) != sizeof(go_uuid))
        FAIL("a UUID entry is %zu bytes of which %zu text; the monitor compares %zu", sizeof(DeviceUuid),
             sizeof(((DeviceUuid *)0)->text), sizeof(go_uuid));

    if (failures) {
        printf("monitor-contract: %d checks failed\n", failures);
        return 1;
    }
    printf("monitor-contract: %zu monitor fields, 4 extension ranges, no overlap; UUID entries are text\n",
           nreads);
    return 0;
}
