/* Stage processes launched by MPI (mpirun, srun): MPI is the bootstrap only. It gives
 * rank and world, compares the stage digests of all ranks (MPI_Allgather) before anything
 * else, and broadcasts rank 0's rendezvous address and, for nccl seams, the NCCL unique
 * ids rank 0 makes (MPI_Bcast, as nccl-tests do). Boundaries and results then travel over the stage seams as in
 * the rendezvous form; MPI carries nothing per request. Compiled where MPI is found
 * (host/CMakeLists.txt); mpi_absent.c refuses otherwise. */
#include <arpa/inet.h>
#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/mk_check.h"
#include "core/options.h"
#include "mk_error.h"
#include "stage/stage.h"

bool mk_stage_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* This node's address as the other nodes reach it: the host name's first IPv4 address
 * (loopback when it has none); a free port chosen by the kernel. */
static mk_status mk_root_address(char *out, size_t cap) {
    char host[256] = "127.0.0.1", ip[INET_ADDRSTRLEN] = "127.0.0.1";
    if (gethostname(host, sizeof host) == 0) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res = NULL;
        if (getaddrinfo(host, NULL, &hints, &res) == 0 && res) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof ip);
            freeaddrinfo(res);
        }
    }
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, ip, &a.sin_addr);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0) close(fd);
        return mk_fail(MK_ERR_CONNECT, "stage: no free port on %s for the rendezvous", ip);
    }
    close(fd); /* rank 0 binds it again at once (SO_REUSEADDR) */
    snprintf(out, cap, "%s:%u", ip, (unsigned)ntohs(a.sin_port));
    return MK_OK;
}

/* nccl seams: rank 0 makes the unique id of every seam's communicator (seam k joins rank
 * k and k + 1) and broadcasts them all, as nccl-tests do; rank r keeps ids k = r - 1 and r. */
static mk_status mk_mpi_nccl_ids(mk_stage_options *o, int rank, int world, mk_stage_nccl_ids **out) {
    const size_t n = (size_t)world - 1;
    unsigned char *ids = calloc(n, MK_SEAM_NCCL_ID_BYTES);
    if (!ids) return mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory");
    mk_status s = MK_OK;
    char why[512] = "";
    for (size_t k = 0; rank == 0 && s == MK_OK && k < n; k++)
        s = mk_seam_nccl_id_new(ids + k * MK_SEAM_NCCL_ID_BYTES, MK_SEAM_NCCL_ID_BYTES);
    if (s != MK_OK) snprintf(why, sizeof why, "%s", mk_last_error());
    int ok = s == MK_OK;
    int rc = MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS && ok)
        rc = MPI_Bcast(ids, (int)(n * MK_SEAM_NCCL_ID_BYTES), MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING] = "?";
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        s = mk_fail(MK_ERR_MPI, "MPI_Bcast of the NCCL unique ids failed: %s", msg);
    } else if (!ok) {
        s = rank == 0 ? mk_fail(s, "rank 0 could not make the NCCL unique ids: %s", why)
                      : mk_fail(MK_ERR_UNSUPPORTED, "rank 0 could not make the NCCL unique ids");
    } else {
        mk_stage_nccl_ids *mine = calloc(1, sizeof *mine);
        if (!mine) {
            s = mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory");
        } else {
            if (rank > 0) memcpy(mine->prev, ids + (size_t)(rank - 1) * MK_SEAM_NCCL_ID_BYTES, MK_SEAM_NCCL_ID_BYTES);
            if (rank + 1 < world) memcpy(mine->next, ids + (size_t)rank * MK_SEAM_NCCL_ID_BYTES, MK_SEAM_NCCL_ID_BYTES);
            o->nccl_ids = mine;
            *out = mine;
        }
    }
    free(ids);
    return s;
}

static mk_status mk_mpi_setup(const mk_model *model, mk_stage_options *o, char *rendezvous, size_t cap,
                              mk_stage_nccl_ids **nccl_ids) {
    int initialized = 0;
    MK_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) MK_MPI_CHECK(MPI_Init(NULL, NULL));
    MK_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    int rank = 0, world = 0;
    MK_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MK_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    if (world < 2 || world > MK_STAGE_MAX_WORLD)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mpirun started %d processes: a stage run needs 2..%d (one per range)",
                       world, MK_STAGE_MAX_WORLD);
    o->rank = rank;
    o->world = world;
    /* Every rank computes its digest (or fails to: an empty one), all compare all. */
    int64_t cuts[MK_STAGE_MAX_WORLD];
    char mine[MK_DIGEST_HEX_LEN + 1] = "";
    char why[256] = "";
    const mk_status plan = mk_stage_plan(model, o, cuts, mine);
    if (plan != MK_OK) snprintf(why, sizeof why, "%s", mk_last_error());
    char *all = calloc((size_t)world, sizeof mine);
    if (!all) return mk_fail(MK_ERR_OUT_OF_MEMORY, "stage: out of memory");
    const int rc = MPI_Allgather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, MPI_COMM_WORLD);
    mk_status s = MK_OK;
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING] = "?";
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        s = mk_fail(MK_ERR_MPI, "MPI_Allgather of the stage digests failed: %s", msg);
    }
    for (int k = 1; s == MK_OK && k < world; k++) {
        const char *d = all + (size_t)k * sizeof mine;
        if (!d[0] || !all[0]) {
            s = plan != MK_OK ? mk_fail(plan, "%s", why)
                              : mk_fail(MK_ERR_INVALID_ARGUMENT, "rank %d could not plan its stage: refused at startup",
                                        d[0] ? 0 : k);
        } else if (strcmp(d, all) != 0) {
            s = mk_fail(MK_ERR_RECIPE_DIGEST,
                        "rank %d's stage digest %.16s... differs from rank 0's %.16s... (another model file, weight mode, "
                        "cuts or seam): refused at startup, before any request",
                        k, d, all);
        }
    }
    free(all);
    MK_TRY(s);
    /* Rank 0's address for the control connections. */
    char address[300] = "";
    if (rank == 0 && (!o->rendezvous || !*o->rendezvous)) s = mk_root_address(address, sizeof address);
    else if (rank == 0) snprintf(address, sizeof address, "%s", o->rendezvous);
    int ok = s == MK_OK;
    MK_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (!ok) return rank == 0 ? s : mk_fail(MK_ERR_CONNECT, "rank 0 found no rendezvous address");
    MK_MPI_CHECK(MPI_Bcast(address, (int)sizeof address, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (strlen(address) + 1 > cap) return mk_fail(MK_ERR_INVALID_ARGUMENT, "rendezvous buffer of %zu bytes too small", cap);
    memcpy(rendezvous, address, strlen(address) + 1);
    o->rendezvous = rendezvous;
    return o->seam == MK_SEAM_NCCL ? mk_mpi_nccl_ids(o, rank, world, nccl_ids) : MK_OK;
}

mk_status mk_stage_mpi_setup(const mk_model *model, mk_stage_options *o, char *rendezvous, size_t cap,
                             mk_stage_nccl_ids **nccl_ids) {
    mk_clear_error();
    if (!model || !o || !rendezvous || cap == 0 || !nccl_ids)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_stage_mpi_setup: NULL argument");
    *nccl_ids = NULL;
    /* The caller's struct by its struct_size; what setup decides is written back into it
     * (fields of every version). */
    mk_stage_options taken = mk_stage_options_default();
    MK_TRY(mk_options_take(&taken, sizeof taken, MK_STAGE_OPTIONS_V1_SIZE, o, "mk_stage_options"));
    MK_TRY(mk_mpi_setup(model, &taken, rendezvous, cap, nccl_ids));
    o->rank = taken.rank;
    o->world = taken.world;
    o->rendezvous = taken.rendezvous;
    o->nccl_ids = taken.nccl_ids;
    return MK_OK;
}

void mk_stage_mpi_finalize(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
}
