/* Builds without MPI: the stage command still works through the rendezvous address; a
 * launch by mpirun is refused with a clear message. */
#include <stdlib.h>

#include "mk_error.h"

bool mk_stage_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

mk_status mk_stage_mpi_setup(const mk_model *model, mk_stage_options *o, char *rendezvous, size_t cap,
                             mk_stage_nccl_ids **nccl_ids) {
    mk_clear_error();
    (void)model, (void)o, (void)rendezvous, (void)cap;
    if (nccl_ids) *nccl_ids = NULL;
    return mk_fail(MK_ERR_UNSUPPORTED, "this meshkern was built without MPI: launch the ranks with --rank, --world "
                                       "and --rendezvous instead");
}

void mk_stage_mpi_finalize(void) {}
