/* Host time a range's forward spends in each op family, for benchmarks (e2e_bench prints
 * decode ms/token per family) and for finding where a token's time goes.
 *
 * Off by default: the range executor then pays one predictable branch per op. On, each op
 * costs two clock reads (~50 ns), about 0.3% of a SmolLM2 decode step. On the cpu backend
 * ops run synchronously, so the host time is the op's time; on an asynchronous backend it
 * is only the time to enqueue it. State lives in the range (no globals). */
#ifndef MK_OP_PROFILE_H
#define MK_OP_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The clock ops are timed on; a build may define CLOCK_THREAD_CPUTIME_ID to see the CPU
 * time of single-threaded runs on a loaded machine. */
#ifndef MK_OP_PROFILE_CLOCK
#define MK_OP_PROFILE_CLOCK CLOCK_MONOTONIC
#endif

typedef enum mk_op_family {
    MK_OPF_EMBED,     /* token embedding rows */
    MK_OPF_NORM,      /* rmsnorm and the residual add fused into it */
    MK_OPF_QKV,       /* Q, K, V projections */
    MK_OPF_ROPE_KV,   /* RoPE of q and k, KV-cache write */
    MK_OPF_ATTENTION, /* softmax(q k^T) v over the cache */
    MK_OPF_ATTN_OUT,  /* output projection */
    MK_OPF_GATE_UP,   /* gate and up projections with SwiGLU */
    MK_OPF_DOWN,      /* down projection */
    MK_OPF_ADD,       /* the plain residual add after a range's last layer */
    MK_OPF_LM_HEAD,   /* final norm and lm_head */
    MK_OPF_SAMPLE,    /* argmax and the logits/token download */
    MK_OPF_COUNT
} mk_op_family;

typedef struct mk_op_profile {
    bool on;
    uint64_t forwards;                /* forwards timed since the last reset */
    double seconds[MK_OPF_COUNT];     /* host seconds per family, summed over those forwards */
} mk_op_profile;

/* Short printable name of a family ("qkv", "attention", ...). */
static inline const char *mk_op_family_name(mk_op_family f) {
    static const char *const names[MK_OPF_COUNT] = {"embed",    "norm",    "qkv", "rope_kv", "attention", "attn_out",
                                                    "gate_up", "down", "add", "lm_head", "sample"};
    return (unsigned)f < MK_OPF_COUNT ? names[f] : "?";
}

static inline double mk_op_profile_clock(const mk_op_profile *p) {
    if (!p->on) return 0.0;
    struct timespec ts;
    clock_gettime(MK_OP_PROFILE_CLOCK, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Adds the time since t0 (a mk_op_profile_clock reading) to family f. */
static inline void mk_op_profile_add(mk_op_profile *p, mk_op_family f, double t0) {
    if (p->on) p->seconds[f] += mk_op_profile_clock(p) - t0;
}

#ifdef __cplusplus
}
#endif
#endif
