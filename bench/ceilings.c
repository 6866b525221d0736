/* Measured ceilings: what this machine's memory system can do, so a benchmark figure can be
 * read as a fraction of something real instead of a datasheet number.
 *
 *   memcpy_1t   one thread copying a buffer (bytes copied per second; each byte is read
 *               once and written once)
 *   read_1t     one thread summing a buffer (bytes read per second)
 *   read_mt     every thread summing its own share of one buffer: the ceiling of a decode
 *               step that streams its weights from all cores (llama.cpp on 2 threads beats
 *               a single-thread memcpy, so that is no ceiling for a multi-threaded reader)
 *   cuda_d2d    (built with MK_CEILINGS_CUDA, with a device) cudaMemcpy on the device, bytes
 *               read + written per second (device memory traffic, as kernel_bench counts it)
 *   cuda_h2d_pinned, cuda_d2h_pinned: pinned host<->device cudaMemcpy, bytes copied per second
 *   cublas_gemm_f32, cublas_gemm_bf16: cublasGemmEx on 4096^3 (F32, and BF16 inputs with F32
 *               accumulation), FLOP per second (2*M*N*K per GEMM)
 *
 * Each figure is the best of --reps rounds after one warm-up round (the best, because
 * other work on a shared machine only ever makes a round slower). The buffer is filled
 * with a non-zero pattern first, so every page is resident before anything is timed.
 *
 *   ceilings [--bytes N] [--threads T] [--reps R] [--json PATH]
 *
 * Exit: 0 ok; 1 bad arguments or allocation failure. Self-contained on purpose (libc,
 * pthreads, optionally cudart) so bench/run.sh can build it with a bare compiler when the
 * CMake project cannot be configured. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef MK_CEILINGS_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

#include "bench_time.h"

/* ---- options and results ----------------------------------------------------------------- */

typedef struct {
    size_t bytes;   /* buffer size for the host figures */
    size_t threads; /* readers for read_mt */
    int reps;
    const char *json_path;
} options;

enum { MAX_FIGURES = 10, MAX_THREADS = 256 };

typedef struct {
    const char *name;
    const char *what;
    const char *unit; /* "GB/s" or "GFLOP/s" */
    double gbps;      /* the value, in unit */
    size_t bytes;
    size_t threads;
} figure;

typedef struct {
    figure f[MAX_FIGURES];
    size_t n;
    char device[256];
} results;

static void add_unit(results *r, const char *name, const char *what, const char *unit, double value, size_t bytes,
                     size_t threads) {
    if (r->n < MAX_FIGURES) r->f[r->n++] = (figure){name, what, unit, value, bytes, threads};
}

static void add(results *r, const char *name, const char *what, double gbps, size_t bytes, size_t threads) {
    add_unit(r, name, what, "GB/s", gbps, bytes, threads);
}

/* ---- host: memcpy and reads --------------------------------------------------------------- */

static double memcpy_gbps(size_t bytes, int reps) {
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    double best = 0.0;
    if (a && b) {
        memset(a, 0x5A, bytes);
        memset(b, 0xA5, bytes);
        for (int i = 0; i <= reps; i++) {
            const double t0 = now_s();
            memcpy(b, a, bytes);
            __asm__ volatile("" ::"r"(b) : "memory"); /* the copy is observable */
            const double gbps = (double)bytes / 1e9 / (now_s() - t0);
            if (i > 0 && gbps > best) best = gbps; /* round 0 warms up */
        }
    }
    free(a);
    free(b);
    return best;
}

typedef struct {
    const uint64_t *p; /* [n] this reader's share */
    size_t n;
    pthread_barrier_t *start;
    uint64_t sum;
    double t_end;
} reader;

static void *read_share(void *arg) {
    reader *r = arg;
    pthread_barrier_wait(r->start);
    r->sum = sum_words(r->p, r->n);
    r->t_end = now_s();
    return NULL;
}

/* All readers start at a barrier; the round lasts until the slowest finishes. */
static double read_gbps(size_t bytes, size_t threads, int reps, uint64_t *checksum) {
    const size_t words = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(words * sizeof(uint64_t));
    if (!buf || threads == 0) {
        free(buf);
        return 0.0;
    }
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_t tid[MAX_THREADS];
    reader rd[MAX_THREADS];
    double best = 0.0;
    for (int rep = 0; rep <= reps; rep++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        const size_t share = words / threads;
        size_t started = 0;
        for (size_t t = 0; t < threads; t++) {
            const size_t lo = t * share, hi = t + 1 == threads ? words : lo + share;
            rd[t] = (reader){buf + lo, hi - lo, &start, 0, 0.0};
            if (pthread_create(&tid[t], NULL, read_share, &rd[t]) != 0) break;
            started++;
        }
        if (started != threads) { /* fewer readers than asked for measure something else; the
                                     * started ones wait at the barrier, so leave at once */
            fprintf(stderr, "ceilings: could start only %zu of %zu threads\n", started, threads);
            exit(1);
        }
        const double t0 = now_s();
        pthread_barrier_wait(&start);
        double t1 = t0;
        uint64_t sum = 0;
        for (size_t t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            if (rd[t].t_end > t1) t1 = rd[t].t_end;
            sum += rd[t].sum;
        }
        pthread_barrier_destroy(&start);
        *checksum += sum; /* printed, so the sums cannot be optimised away */
        const double gbps = (double)(words * sizeof(uint64_t)) / 1e9 / (t1 - t0);
        if (rep > 0 && gbps > best) best = gbps;
    }
    free(buf);
    return best;
}

/* ---- device: copies (only with a CUDA device) ---------------------------------------------- */

#ifdef MK_CEILINGS_CUDA
#define CK(expr)                                                                                   \
    do {                                                                                           \
        const cudaError_t e_ = (expr);                                                             \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "ceilings: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
            return 0.0;                                                                            \
        }                                                                                          \
    } while (0)

/* Times one cudaMemcpyAsync kind on a stream with events; best of reps. */
static double cuda_copy_gbps(enum cudaMemcpyKind kind, size_t bytes, int reps) {
    void *src = NULL, *dst = NULL;
    const int src_host = kind == cudaMemcpyHostToDevice, dst_host = kind == cudaMemcpyDeviceToHost;
    CK(src_host ? cudaMallocHost(&src, bytes) : cudaMalloc(&src, bytes));
    CK(dst_host ? cudaMallocHost(&dst, bytes) : cudaMalloc(&dst, bytes));
    if (src_host) memset(src, 0x5A, bytes);
    else CK(cudaMemset(src, 0x5A, bytes));
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double best = 0.0;
    for (int i = 0; i <= reps; i++) {
        float ms = 0.0f;
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(dst, src, bytes, kind, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double gbps = (double)bytes / 1e9 / (ms * 1e-3);
        if (i > 0 && gbps > best) best = gbps;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(st));
    CK(src_host ? cudaFreeHost(src) : cudaFree(src));
    CK(dst_host ? cudaFreeHost(dst) : cudaFree(dst));
    return best;
}

/* cublasGemmEx C = A * B, n x n x n, inputs of one type (a non-zero byte pattern: never
 * time on zeros), F32 accumulation; GFLOP/s, best of reps after a warm-up. */
static double gemm_gflops(cudaDataType_t type, size_t elem, int n, int reps) {
    void *a = NULL, *b = NULL, *c = NULL;
    const size_t in_bytes = (size_t)n * (size_t)n * elem, out_bytes = (size_t)n * (size_t)n * sizeof(float);
    CK(cudaMalloc(&a, in_bytes));
    CK(cudaMalloc(&b, in_bytes));
    CK(cudaMalloc(&c, out_bytes));
    CK(cudaMemset(a, 0x3C, in_bytes));
    CK(cudaMemset(b, 0x3C, in_bytes));
    cublasHandle_t h = NULL;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "ceilings: cublasCreate failed\n");
        return 0.0;
    }
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cublasSetStream(h, st);
    const float alpha = 1.0f, beta = 0.0f;
    double best = 0.0;
    for (int i = 0; i <= reps; i++) {
        float ms = 0.0f;
        CK(cudaEventRecord(e0, st));
        const cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, type, n, b, type, n,
                                               &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (cs != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "ceilings: cublasGemmEx failed (status %d)\n", (int)cs);
            best = 0.0;
            break;
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double gflops = 2.0 * (double)n * (double)n * (double)n / 1e9 / (ms * 1e-3);
        if (i > 0 && gflops > best) best = gflops;
    }
    cublasDestroy(h);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(st));
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    return best;
}

static void cuda_ceilings(results *r, size_t bytes, int reps) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return; /* host figures only */
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) snprintf(r->device, sizeof r->device, "%s", prop.name);
    const double d2d = cuda_copy_gbps(cudaMemcpyDeviceToDevice, bytes, reps);
    const double h2d = cuda_copy_gbps(cudaMemcpyHostToDevice, bytes, reps);
    const double d2h = cuda_copy_gbps(cudaMemcpyDeviceToHost, bytes, reps);
    /* A device copy reads and writes every byte: counted twice, as kernel_bench counts its
     * copy and every kernel's traffic, so the kernels' and decode's bytes compare with it. */
    if (d2d > 0) add(r, "cuda_d2d", "device-to-device cudaMemcpy, bytes read + written per second", 2.0 * d2d, bytes, 1);
    if (h2d > 0) add(r, "cuda_h2d_pinned", "pinned host to device cudaMemcpy", h2d, bytes, 1);
    if (d2h > 0) add(r, "cuda_d2h_pinned", "device to pinned host cudaMemcpy", d2h, bytes, 1);
    enum { GEMM_N = 4096 };
    const double f32 = gemm_gflops(CUDA_R_32F, sizeof(float), GEMM_N, reps);
    const double bf16 = gemm_gflops(CUDA_R_16BF, 2, GEMM_N, reps);
    if (f32 > 0) add_unit(r, "cublas_gemm_f32", "cublasGemmEx F32, 4096^3, FLOP per second", "GFLOP/s", f32, 0, 1);
    if (bf16 > 0)
        add_unit(r, "cublas_gemm_bf16", "cublasGemmEx BF16 inputs, F32 accumulation, 4096^3", "GFLOP/s", bf16, 0, 1);
}
#endif

/* ---- main ------------------------------------------------------------------------------------ */

static int usage(void) {
    fprintf(stderr, "usage: ceilings [--bytes N] [--threads T] [--reps R] [--json PATH]\n"
                    "  defaults: 512 MiB, every online core, 5 rounds after a warm-up\n");
    return 1;
}

int main(int argc, char **argv) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    options o = {(size_t)512 << 20, cores > 0 ? (size_t)cores : 1, 5, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return usage();
        if (strcmp(a, "--bytes") == 0) o.bytes = strtoull(argv[++i], NULL, 10);
        else if (strcmp(a, "--threads") == 0) o.threads = strtoull(argv[++i], NULL, 10);
        else if (strcmp(a, "--reps") == 0) o.reps = atoi(argv[++i]);
        else if (strcmp(a, "--json") == 0) o.json_path = argv[++i];
        else return usage();
    }
    if (o.bytes < ((size_t)1 << 20) || o.threads == 0 || o.threads > MAX_THREADS || o.reps < 1 || o.reps > 100)
        return usage();

    results r = {0};
    uint64_t checksum = 0;
    const double cpy = memcpy_gbps(o.bytes, o.reps);
    const double rd1 = read_gbps(o.bytes, 1, o.reps, &checksum);
    const double rdn = read_gbps(o.bytes, o.threads, o.reps, &checksum);
    if (cpy <= 0 || rd1 <= 0 || rdn <= 0) {
        fprintf(stderr, "ceilings: cannot allocate %zu bytes\n", o.bytes);
        return 1;
    }
    add(&r, "memcpy_1t", "memcpy on one thread, bytes copied per second", cpy, o.bytes, 1);
    add(&r, "read_1t", "one thread summing the buffer, bytes read per second", rd1, o.bytes, 1);
    add(&r, "read_mt", "every thread summing its share of one buffer, bytes read per second", rdn, o.bytes,
        o.threads);
#ifdef MK_CEILINGS_CUDA
    cuda_ceilings(&r, o.bytes, o.reps);
#endif

    printf("%-16s %10s %-8s %8s %12s  %s\n", "ceiling", "value", "unit", "threads", "buffer MiB", "what");
    for (size_t i = 0; i < r.n; i++)
        printf("%-16s %10.2f %-8s %8zu %12.0f  %s\n", r.f[i].name, r.f[i].gbps, r.f[i].unit, r.f[i].threads,
               (double)r.f[i].bytes / (1 << 20), r.f[i].what);
    printf("(checksum %016llx)\n", (unsigned long long)checksum);

    if (o.json_path) {
        FILE *j = fopen(o.json_path, "w");
        if (!j) {
            fprintf(stderr, "ceilings: cannot write %s\n", o.json_path);
            return 1;
        }
        fprintf(j, "{\"threads\": %zu, \"bytes\": %zu, \"reps\": %d, \"device\": \"%s\", \"figures\": [", o.threads,
                o.bytes, o.reps, r.device);
        for (size_t i = 0; i < r.n; i++)
            fprintf(j, "%s\n  {\"name\": \"%s\", \"value\": %.4f, \"unit\": \"%s\", \"threads\": %zu, \"bytes\": %zu, "
                       "\"what\": \"%s\"}",
                    i ? "," : "", r.f[i].name, r.f[i].gbps, r.f[i].unit, r.f[i].threads, r.f[i].bytes,
                    r.f[i].what);
        fprintf(j, "\n]}\n");
        fclose(j);
    }
    return 0;
}
