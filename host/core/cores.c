/* The cores this process may run on (its affinity mask, not the machine's count: under
 * taskset, cgroups or mpirun's binding these differ). */
#include "core/cores.h"

#include <sched.h>

size_t mk_core_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return (size_t)n;
    }
    return 1;
}
