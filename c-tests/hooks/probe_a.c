/* probe_a: asks dlsym(RTLD_NEXT) for a name it defines itself; the answer must be the next
 * object's definition (probe_b), not the one after libvgpu.so in the search order. */
#define _GNU_SOURCE
#include <dlfcn.h>

const char *probe_name(void) { return "a"; }

const char *probe_next(void)
{
    const char *(*f)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "probe_name");
    return f ? f() : "null";
}
