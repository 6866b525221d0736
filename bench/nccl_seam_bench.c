/* NCCL seam benchmark: one hop of the residual between two ranks (the seam primitives of
 * host/seam/nccl: header block + payload, header checked before the payload receive), against
 * cudaMemcpyPeer of the same bytes between the same two devices, measured in the same run.
 *
 * Sizes: one decode row of a 4096-wide model (16 KiB) for per-hop latency, and a 512-row
 * prefill of it (8 MiB) for throughput; SmolLM2's decode row (2.25 KiB) as a small case.
 * Median of many hops after a warm-up; inputs are random, and the first hop of every size
 * is checked bit for bit before anything is timed. Times are host wall-clock per completed
 * hop (post, receive, wait), which is what a pipeline stage waits for.
 *
 * Needs two devices: real NCCL refuses two ranks on one GPU. Built against cudasim
 * (nccl_seam_bench_sim) it runs on the CPU through loopback sockets and says so: those
 * figures describe the simulator, not a GPU. Results also go to nccl_seam_bench.json ($OUT). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshkern.h"
#include "bench_time.h"
#include "seam/nccl/nccl_comm.h"

#ifdef MK_BENCH_CUDASIM
#define FLAVOUR "SIMULATED (cudasim: CPU threads and loopback sockets, not a GPU)"
#else
#define FLAVOUR "device"
#endif

#define CHECK_CUDA(x)                                                                          \
    do {                                                                                       \
        const cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "nccl_seam_bench: %s: %s\n", #x, cudaGetErrorString(e_));          \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CHECK_MK(x)                                                                            \
    do {                                                                                       \
        const mk_status s_ = (x);                                                              \
        if (s_ != MK_OK) {                                                                     \
            fprintf(stderr, "nccl_seam_bench: %s: %s: %s\n", #x, mk_status_name(s_), mk_last_error()); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* One hop rank 0 -> rank 1 through the seam primitives. */
static void hop(mk_nccl_ctx *ctx, const void *src, void *dst, size_t bytes) {
    const uint32_t header[4] = {1, (uint32_t)(bytes / 4), 0, 0};
    uint32_t got[4];
    size_t hb = 0, pb = 0;
    CHECK_MK(mk_nccl_send_post(&ctx[0], 1, header, sizeof header, src, bytes));
    CHECK_MK(mk_nccl_recv(&ctx[1], 0, NULL, NULL, got, sizeof got, &hb, dst, bytes, &pb));
    CHECK_MK(mk_nccl_send_wait(&ctx[0]));
    if (pb != bytes) {
        fprintf(stderr, "nccl_seam_bench: received %zu of %zu bytes\n", pb, bytes);
        exit(1);
    }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
        fprintf(stderr, "nccl_seam_bench: needs 2 CUDA devices (NCCL allows one rank per GPU), found %d\n", ndev);
        return 2;
    }
    struct {
        const char *what;
        size_t bytes;
        int runs;
    } cases[] = {
        {"SmolLM2 decode row (576 x f32)", 576 * 4, 101},
        {"decode row, 4096 wide", 4096 * 4, 101},
        {"512-row prefill, 4096 wide", (size_t)512 * 4096 * 4, 21},
    };
#ifdef MK_BENCH_CUDASIM
    cases[2].runs = 7;
#endif
    const int devices[2] = {0, 1};
    mk_nccl_ctx ctx[2];
    CHECK_MK(mk_nccl_init_all(ctx, 2, devices, NULL, 60000)); /* includes the warm-up exchange */

    const char *out_dir = getenv("OUT");
    char path[4096];
    snprintf(path, sizeof path, "%s/nccl_seam_bench.json", out_dir && *out_dir ? out_dir : ".");
    FILE *json = fopen(path, "w");
    if (json) fprintf(json, "{\"flavour\": \"%s\", \"cases\": [\n", FLAVOUR);
    printf("nccl_seam_bench: %s\n", FLAVOUR);
    printf("%-32s %10s | %10s %9s | %10s %9s | %6s\n", "case", "bytes", "nccl us", "GB/s", "peer us", "GB/s", "nccl%");
    unsigned seed = 2024;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; ++c) {
        const size_t bytes = cases[c].bytes, n = bytes / 4;
        float *host = malloc(bytes), *back = malloc(bytes);
        if (!host || !back) return 1;
        for (size_t i = 0; i < n; ++i) host[i] = (float)(rand_r(&seed) % 20001 - 10000) * 1e-3f + 0.5f;
        void *src = NULL, *dst = NULL;
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaMalloc(&src, bytes));
        CHECK_CUDA(cudaMemcpy(src, host, bytes, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&dst, bytes));
        CHECK_CUDA(cudaMemset(dst, 0, bytes));

        /* Validate before timing: the hop delivers the exact bytes. */
        hop(ctx, src, dst, bytes);
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMemcpy(back, dst, bytes, cudaMemcpyDeviceToHost));
        if (memcmp(back, host, bytes) != 0) {
            fprintf(stderr, "nccl_seam_bench: %s: the received residual differs from the sent one\n", cases[c].what);
            return 1;
        }

        const int runs = cases[c].runs;
        double *t_nccl = malloc(sizeof(double) * (size_t)runs), *t_peer = malloc(sizeof(double) * (size_t)runs);
        if (!t_nccl || !t_peer) return 1;
        for (int w = 0; w < 3; ++w) hop(ctx, src, dst, bytes);
        for (int r = 0; r < runs; ++r) {
            const double t0 = now_s();
            hop(ctx, src, dst, bytes);
            t_nccl[r] = now_s() - t0;
        }
        /* The ceiling: the same bytes, device 0 -> device 1, by the runtime's peer copy. */
        CHECK_CUDA(cudaSetDevice(0));
        for (int w = 0; w < 3; ++w) {
            CHECK_CUDA(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, ctx[0].stream));
            CHECK_CUDA(cudaStreamSynchronize(ctx[0].stream));
        }
        for (int r = 0; r < runs; ++r) {
            const double t0 = now_s();
            CHECK_CUDA(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, ctx[0].stream));
            CHECK_CUDA(cudaStreamSynchronize(ctx[0].stream));
            t_peer[r] = now_s() - t0;
        }
        const double mn = median_in_place(t_nccl, runs), mp = median_in_place(t_peer, runs);
        printf("%-32s %10zu | %10.1f %9.2f | %10.1f %9.2f | %5.0f%%\n", cases[c].what, bytes, mn * 1e6,
               (double)bytes / mn * 1e-9, mp * 1e6, (double)bytes / mp * 1e-9, 100.0 * mp / mn);
        if (json)
            fprintf(json,
                    "  {\"case\": \"%s\", \"bytes\": %zu, \"nccl_us\": %.2f, \"nccl_gbps\": %.3f, \"peer_us\": %.2f, "
                    "\"peer_gbps\": %.3f}%s\n",
                    cases[c].what, bytes, mn * 1e6, (double)bytes / mn * 1e-9, mp * 1e6, (double)bytes / mp * 1e-9,
                    c + 1 < sizeof cases / sizeof *cases ? "," : "");
        free(t_nccl);
        free(t_peer);
        cudaFree(src);
        cudaFree(dst);
        free(host);
        free(back);
    }
    if (json) {
        fprintf(json, "]}\n");
        fclose(json);
    }
    mk_nccl_ctx_destroy(&ctx[0]);
    mk_nccl_ctx_destroy(&ctx[1]);
    return 0;
}
