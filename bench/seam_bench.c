/* Seam benchmark: what it costs to carry the residual across a seam on the wire.
 *
 * For residuals of [1, seq, hidden] F32 it times pack (bundle -> protobuf bytes, into a
 * reused buffer) and unpack (bytes -> validated bundle), and reports GB/s of payload
 * against a measured ceiling: memcpy of the same bytes between warm buffers, same run. Median of many runs after
 * a warm-up; inputs are random, and every unpacked residual is checked bit for bit before
 * anything is timed. Results also go to seam_bench.json (in $OUT if set). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meshkern.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

int main(void) {
    const size_t seqs[] = {1, 16, 128, 512, 2048};
    const size_t hiddens[] = {576, 4096, 8192};
    enum { RUNS = 31 };
    const char *out_dir = getenv("OUT");
    char path[4096];
    snprintf(path, sizeof path, "%s/seam_bench.json", out_dir && *out_dir ? out_dir : ".");
    FILE *json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "seam_bench: cannot write %s\n", path);
        return 1;
    }
    fprintf(json, "[\n");
    printf("%8s %6s %10s | %9s %9s %9s | %7s %7s\n", "seq", "hidden", "payload", "memcpy", "pack", "unpack",
           "pack%", "unpack%");
    printf("%8s %6s %10s | %9s %9s %9s | %7s %7s\n", "", "", "KiB", "GB/s", "GB/s", "GB/s", "of cpy", "of cpy");
    unsigned seed = 12345;
    int first = 1;
    for (size_t hi = 0; hi < sizeof hiddens / sizeof *hiddens; hi++) {
        for (size_t si = 0; si < sizeof seqs / sizeof *seqs; si++) {
            const size_t seq = seqs[si], hidden = hiddens[hi], n = seq * hidden, bytes = n * sizeof(float);
            mk_bundle *b = NULL;
            if (mk_bundle_create(1, seq, hidden, &b) != MK_OK) {
                fprintf(stderr, "seam_bench: %s\n", mk_last_error());
                return 1;
            }
            float *res = mk_bundle_residual(b);
            for (size_t i = 0; i < n; i++) res[i] = (float)(rand_r(&seed) % 20001 - 10000) * 1e-3f;
            for (size_t i = 0; i < seq; i++) mk_bundle_positions(b)[i] = (int32_t)i;
            mk_boundary_header hd = *mk_bundle_header(b);
            memset(hd.recipe_digest, 'a', MK_DIGEST_HEX_LEN);
            mk_bundle_set_header(b, &hd);
            /* The wire buffer is reused (mk_bundle_pack_to), as a peer's send buffer would be. */
            const size_t cap = mk_bundle_packed_size(b);
            /* Ceiling buffer: cache-line aligned and offset half a page from the source, so
             * glibc's memcpy is not measured in its 4 KiB-aliasing slow case. */
            uint8_t *copy_block = aligned_alloc(4096, ((bytes + 8192) + 4095) & ~(size_t)4095);
            float *copy = (float *)(void *)(copy_block + (((uintptr_t)res + 2048) & 4095));
            uint8_t *wire = malloc(cap);
            memset(copy, 0, bytes);
            memset(wire, 0, cap);
            double t_pack[RUNS], t_unpack[RUNS], t_copy[RUNS];
            /* Small payloads are copied many times per sample so the clock can see them. */
            const int reps = bytes >= (1u << 22) ? 1 : (int)((1u << 22) / bytes);
            for (int r = -3; r < RUNS; r++) { /* three warm-up runs */
                size_t len = 0;
                const double tc = now_s();
                for (int k = 0; k < reps; k++) {
                    memcpy(copy, res, bytes);
                    __asm__ volatile("" ::"r"(copy) : "memory"); /* keep every copy */
                }
                const double t0 = now_s();
                if (mk_bundle_pack_to(b, wire, cap, &len) != MK_OK) return 1;
                const double t1 = now_s();
                mk_bundle *back = NULL;
                if (mk_bundle_unpack(wire, len, &back) != MK_OK) {
                    fprintf(stderr, "seam_bench: %s\n", mk_last_error());
                    return 1;
                }
                const double t2 = now_s();
                if (memcmp(mk_bundle_residual(back), res, bytes) != 0 || memcmp(copy, res, bytes) != 0) {
                    fprintf(stderr, "seam_bench: round trip is not exact at seq %zu hidden %zu\n", seq, hidden);
                    return 1;
                }
                mk_bundle_free(back);
                if (r >= 0) {
                    t_pack[r] = t1 - t0;
                    t_unpack[r] = t2 - t1;
                    t_copy[r] = (t0 - tc) / reps;
                }
            }
            const double gb = (double)bytes / 1e9;
            const double cpy = gb / median(t_copy, RUNS), pk = gb / median(t_pack, RUNS), un = gb / median(t_unpack, RUNS);
            printf("%8zu %6zu %10.1f | %9.2f %9.2f %9.2f | %6.0f%% %6.0f%%\n", seq, hidden, bytes / 1024.0, cpy, pk, un,
                   100.0 * pk / cpy, 100.0 * un / cpy);
            fprintf(json,
                    "%s  {\"seq\": %zu, \"hidden\": %zu, \"payload_bytes\": %zu, \"memcpy_gbps\": %.3f, "
                    "\"pack_gbps\": %.3f, \"unpack_gbps\": %.3f}",
                    first ? "" : ",\n", seq, hidden, bytes, cpy, pk, un);
            first = 0;
            free(copy_block);
            free(wire);
            mk_bundle_free(b);
        }
    }
    fprintf(json, "\n]\n");
    fclose(json);
    printf("results: %s\n", path);
    return 0;
}
