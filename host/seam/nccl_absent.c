/* Binaries linked without the NCCL seam (host/seam/nccl/) still link: choosing it reports
 * clearly that this build has none. Weak, so nccl_seam.c's definitions win where linked. */
#include "mk_error.h"
#include "seam/seam.h"

static mk_status mk_no_nccl(void) {
    return mk_fail(MK_ERR_UNSUPPORTED, "this meshkern build has no NCCL seam (built without nccl.h / libnccl); "
                                       "use the local, unix or tcp seam");
}

__attribute__((weak)) mk_status mk_seam_nccl_pair(mk_seam *tx, mk_seam *rx) {
    (void)tx;
    (void)rx;
    return mk_no_nccl();
}

__attribute__((weak)) mk_status mk_seam_nccl_publish(const char *id_path) {
    (void)id_path;
    return mk_no_nccl();
}

__attribute__((weak)) mk_status mk_seam_nccl_join(mk_seam *s, const char *id_path) {
    (void)s;
    (void)id_path;
    return mk_no_nccl();
}

__attribute__((weak)) mk_status mk_seam_nccl_id_new(unsigned char *id, size_t cap) {
    (void)id;
    (void)cap;
    return mk_no_nccl();
}

__attribute__((weak)) mk_status mk_seam_nccl_join_id(mk_seam *s, const unsigned char *id, size_t len) {
    (void)s;
    (void)id;
    (void)len;
    return mk_no_nccl();
}
