/* probe_b: the "next" definition of probe_name (see probe_a.c). */
const char *probe_name(void) { return "b"; }
