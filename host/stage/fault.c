/* Test-only fault injection: MESHKERN_FAULT="rank=R,step=K,kind=KIND" makes rank R
 * misbehave at the K-th boundary it handles (0-based). Read by the stage runtime only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"
#include "stage/stage.h"

/* One table: kind <-> name. */
static const struct {
    mk_fault_kind kind;
    const char *name;
} mk_fault_kinds[] = {{MK_FAULT_EXIT, "exit"},
                      {MK_FAULT_SILENT, "silent"},
                      {MK_FAULT_CORRUPT_HEADER, "corrupt_header"},
                      {MK_FAULT_OTHER_DIGEST, "other_digest"},
                      {MK_FAULT_OTHER_LAYER, "other_layer"},
                      {MK_FAULT_BUSY, "busy"},
                      {MK_FAULT_LYING_ENTRY, "lying_entry"},
                      {MK_FAULT_STRAY_RESULT, "stray_result"},
                      {MK_FAULT_HALF_FRAME, "half_frame"},
                      {MK_FAULT_LATE_FINISHED, "late_finished"}};

mk_status mk_fault_read(int rank, mk_fault *out) {
    memset(out, 0, sizeof *out);
    const char *v = getenv("MESHKERN_FAULT");
    if (!v || !*v) return MK_OK;
    int r = -1;
    unsigned long long step = 0;
    char kind[32] = "";
    if (sscanf(v, "rank=%d,step=%llu,kind=%31s", &r, &step, kind) != 3)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "MESHKERN_FAULT='%s': expected rank=R,step=K,kind=exit|silent|"
                       "corrupt_header|other_digest|other_layer|busy|lying_entry|stray_result|half_frame|late_finished", v);
    mk_fault_kind k = MK_FAULT_NONE;
    for (size_t i = 0; i < sizeof mk_fault_kinds / sizeof *mk_fault_kinds; i++)
        if (strcmp(kind, mk_fault_kinds[i].name) == 0) k = mk_fault_kinds[i].kind;
    if (k == MK_FAULT_NONE) return mk_fail(MK_ERR_INVALID_ARGUMENT, "MESHKERN_FAULT: unknown kind '%s'", kind);
    if (r != rank) return MK_OK;
    out->kind = k;
    out->rank = r;
    out->step = step;
    return MK_OK;
}

bool mk_fault_due(const mk_fault *f, uint64_t step, mk_fault_kind kind) { return f->kind == kind && f->step == step; }
