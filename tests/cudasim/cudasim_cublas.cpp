/* cudasim_cublas.cpp - the cuBLAS subset the cuda backend calls, computed on the CPU.
 *
 * Link-time stand-ins: the same C functions libcublas exports, declared by the real
 * cublas_api.h, so host code compiled against <cublas_v2.h> links against these instead.
 * A GEMM is checked when called and queued on the handle's stream like a kernel (it runs
 * when the simulated device gets to it; cudasim_async.cpp).
 *
 * GEMMs are plain loops: every element of C is one dot product accumulated in float as
 * eight interleaved partial sums over k combined by a fixed tree (deterministic, and
 * independent of the thread count and of the other rows), inputs converted exactly to
 * float first. Compute types behave as on a GPU where it
 * matters for numerics: CUBLAS_COMPUTE_32F_FAST_TF32 (and CUBLAS_COMPUTE_32F under
 * CUBLAS_TF32_TENSOR_OP_MATH) rounds F32 inputs to TF32 (10-bit mantissa, nearest even);
 * CUBLAS_COMPUTE_32F / _PEDANTIC keep F32.
 *
 * Arguments are validated the way cuBLAS does: a handle that is not live gives
 * CUBLAS_STATUS_NOT_INITIALIZED; negative sizes, leading dimensions below their minimum,
 * null pointers or a C type other than F32 give CUBLAS_STATUS_INVALID_VALUE; A/B/C must
 * lie inside one device allocation of the handle's device, else
 * CUBLAS_STATUS_EXECUTION_FAILED (a GPU would fault). Unsupported type combinations give
 * CUBLAS_STATUS_NOT_SUPPORTED.
 */
#include <cublas_v2.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cudasim.h"
#include "cudasim_internal.h"

struct cublasContext {
  int device;          /* current device when the handle was created */
  cudaStream_t stream; /* 0 = legacy default stream */
  cublasMath_t math;
  void *workspace = nullptr; /* cublasSetWorkspace; cublasSetStream resets it, as cuBLAS does */
  size_t workspace_bytes = 0;
};

namespace {

std::mutex g_mu;
std::set<cublasHandle_t> g_handles;

bool handle_live(cublasHandle_t h) {
  std::lock_guard<std::mutex> g(g_mu);
  return h && g_handles.count(h) != 0;
}

cublasStatus_t fail(cublasStatus_t st, const char *fn, const std::string &why) {
  if (cudasim::sim_config().verbose) fprintf(stderr, "cudasim cuBLAS: %s: %s\n", fn, why.c_str());
  return st;
}

float tf32_round(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) == 0x7f800000u) return x; /* inf / NaN unchanged */
  b += 0xfffu + ((b >> 13) & 1u);                 /* nearest even at bit 13 */
  b &= ~0x1fffu;
  std::memcpy(&x, &b, 4);
  return x;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112u) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_f32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

size_t type_size(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

/* A (rows x cols) column-major operand with leading dimension ld, as float. */
std::vector<float> load_matrix(const void *p, cudaDataType t, int rows, int cols, int ld, bool tf32) {
  std::vector<float> m(static_cast<size_t>(rows) * cols);
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(c) * ld + r;
      float v;
      if (t == CUDA_R_32F) v = static_cast<const float *>(p)[i];
      else if (t == CUDA_R_16F) v = f16_to_f32(static_cast<const uint16_t *>(p)[i]);
      else v = bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
      m[static_cast<size_t>(c) * rows + r] = tf32 ? tf32_round(v) : v;
    }
  return m;
}

/* The bytes a column-major (rows x cols, ld) operand spans. */
size_t span_bytes(int rows, int cols, int ld, size_t elem) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) * elem;
}

cublasStatus_t check_operand(const char *fn, const char *name, const void *p, size_t bytes, int device) {
  if (bytes == 0) return CUBLAS_STATUS_SUCCESS;
  const int where = cudasim::allocation_device(p, bytes);
  if (where == device) return CUBLAS_STATUS_SUCCESS;
  char buf[200];
  if (where == -2)
    snprintf(buf, sizeof buf, "%s [%p, +%zu) is not inside one device allocation", name, p, bytes);
  else if (where == -1)
    snprintf(buf, sizeof buf, "%s %p is pinned host memory, not device memory", name, p);
  else
    snprintf(buf, sizeof buf, "%s %p lives on device %d, the handle's device is %d", name, p, where, device);
  return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, buf);
}

void run_gemm(bool ta, bool tb, int m, int n, int k, float al, const void *A, cudaDataType Atype, int a_rows,
              int a_cols, int lda, const void *B, cudaDataType Btype, int b_rows, int b_cols, int ldb, float be,
              float *c, int ldc, bool tf32);

cublasStatus_t gemm(const char *fn, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                    int n, int k, const float *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                    cudaDataType Btype, int ldb, const float *beta, void *C, cudaDataType Ctype, int ldc,
                    cublasComputeType_t compute) {
  if (!handle_live(handle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is not a live cublasCreate handle");
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T && transa != CUBLAS_OP_C) ||
      (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T && transb != CUBLAS_OP_C))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "bad transpose operation");
  if (m < 0 || n < 0 || k < 0) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "negative m, n or k");
  const int a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int b_rows = tb ? n : k, b_cols = tb ? k : n;
  if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "leading dimension below its minimum");
  if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "null alpha or beta");
  /* Supported: A, B of one type in {F32, F16, BF16}, C F32, 32F compute family. */
  if (Atype != Btype || type_size(Atype) == 0 || Ctype != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "type combination not simulated (A == B in F32/F16/BF16, C F32)");
  bool tf32 = false;
  switch (compute) {
    case CUBLAS_COMPUTE_32F: tf32 = Atype == CUDA_R_32F && (handle->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH; break;
    case CUBLAS_COMPUTE_32F_PEDANTIC: break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      if (Atype != CUDA_R_32F) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "FAST_TF32 needs F32 inputs");
      tf32 = true;
      break;
    default: return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type not simulated");
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const size_t esize = type_size(Atype);
  const bool reads_ab = k > 0 && *alpha != 0.0f;
  if (reads_ab && (!A || !B)) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "null A or B");
  if (!C) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "null C");
  int device = 0;
  cudaGetDevice(&device);
  if (device != handle->device) {
    char buf[120];
    snprintf(buf, sizeof buf, "called with device %d current; the handle belongs to device %d", device,
             handle->device);
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, buf);
  }
  if (reads_ab) {
    if (cublasStatus_t st = check_operand(fn, "A", A, span_bytes(a_rows, a_cols, lda, esize), device)) return st;
    if (cublasStatus_t st = check_operand(fn, "B", B, span_bytes(b_rows, b_cols, ldb, esize), device)) return st;
  }
  if (cublasStatus_t st = check_operand(fn, "C", C, span_bytes(m, n, ldc, 4), device)) return st;

  /* alpha and beta are host values, read now as cuBLAS does in host pointer mode. */
  const float al = *alpha, be = *beta;
  cudasim::stream_submit(handle->stream, [=] {
    run_gemm(ta, tb, m, n, k, al, A, Atype, a_rows, a_cols, lda, B, Btype, b_rows, b_cols, ldb, be,
             static_cast<float *>(C), ldc, tf32);
  });
  return CUBLAS_STATUS_SUCCESS;
}

void run_gemm(bool ta, bool tb, int m, int n, int k, float al, const void *A, cudaDataType Atype, int a_rows,
              int a_cols, int lda, const void *B, cudaDataType Btype, int b_rows, int b_cols, int ldb, float be,
              float *c, int ldc, bool tf32) {
  const bool reads_ab = k > 0 && al != 0.0f;
  if (!reads_ab) {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float &out = c[static_cast<size_t>(j) * ldc + i];
        out = be == 0.0f ? 0.0f : be * out;
      }
    return;
  }
  /* op(A) as At[i][p] rows of length k, op(B) as Bt[j][p]: contiguous dot products. */
  const std::vector<float> a = load_matrix(A, Atype, a_rows, a_cols, lda, tf32);
  const std::vector<float> b = load_matrix(B, Btype, b_rows, b_cols, ldb, tf32);
  std::vector<float> at(static_cast<size_t>(m) * k), bt(static_cast<size_t>(n) * k);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p)
      at[static_cast<size_t>(i) * k + p] =
          ta ? a[static_cast<size_t>(i) * a_rows + p] : a[static_cast<size_t>(p) * a_rows + i];
  for (int j = 0; j < n; ++j)
    for (int p = 0; p < k; ++p)
      bt[static_cast<size_t>(j) * k + p] =
          tb ? b[static_cast<size_t>(p) * b_rows + j] : b[static_cast<size_t>(j) * b_rows + p];
  for (int j = 0; j < n; ++j) {
    const float *bj = &bt[static_cast<size_t>(j) * k];
    for (int i = 0; i < m; ++i) {
      const float *ai = &at[static_cast<size_t>(i) * k];
      /* Eight interleaved partial sums (as a GPU tile splits k), then a fixed tree. */
      float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      int p = 0;
      for (; p + 8 <= k; p += 8)
        for (int l = 0; l < 8; ++l) s[l] += ai[p + l] * bj[p + l];
      for (int l = 0; p < k; ++p, ++l) s[l] += ai[p] * bj[p];
      const float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      float &out = c[static_cast<size_t>(j) * ldc + i];
      out = be == 0.0f ? al * acc : al * acc + be * out; /* beta == 0: C is not read (may be NaN) */
    }
  }
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "null handle pointer");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasHandle_t h = new cublasContext{device, nullptr, CUBLAS_DEFAULT_MATH, nullptr, 0};
  std::lock_guard<std::mutex> g(g_mu);
  g_handles.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!handle || !g_handles.erase(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!cudasim::stream_is_valid(stream)) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream", "invalid stream");
  handle->stream = stream;
  handle->workspace = nullptr; /* cuBLAS: setting the stream resets the user workspace */
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

/* The user workspace cuBLAS uses instead of its own pool (what makes a captured GEMM
 * allocate nothing): device memory of the handle's device, 256-byte aligned. The simulated
 * GEMM needs no scratch, so this only checks and remembers it. */
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes) {
  if (!handle_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && !workspace) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "null workspace");
  if (workspace && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "workspace not 256-byte aligned");
  if (bytes && cudasim::allocation_device(workspace, bytes) != handle->device)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace",
                "workspace is not inside one device allocation of the handle's device");
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
  if (!handle_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const unsigned base = static_cast<unsigned>(mode) & 0xfu;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode", "math mode not simulated");
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
  if (!handle_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
#define N(x) \
  case x: return #x;
    N(CUBLAS_STATUS_SUCCESS) N(CUBLAS_STATUS_NOT_INITIALIZED) N(CUBLAS_STATUS_ALLOC_FAILED)
    N(CUBLAS_STATUS_INVALID_VALUE) N(CUBLAS_STATUS_ARCH_MISMATCH) N(CUBLAS_STATUS_MAPPING_ERROR)
    N(CUBLAS_STATUS_EXECUTION_FAILED) N(CUBLAS_STATUS_INTERNAL_ERROR) N(CUBLAS_STATUS_NOT_SUPPORTED)
    N(CUBLAS_STATUS_LICENSE_ERROR)
#undef N
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  (void)algo; /* every algorithm computes the same thing here */
  return gemm("cublasGemmEx", handle, transa, transb, m, n, k, static_cast<const float *>(alpha), A, Atype, lda, B,
              Btype, ldb, static_cast<const float *>(beta), C, Ctype, ldc, computeType);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc) {
  /* cublasSgemm honours the handle's math mode (TF32 under CUBLAS_TF32_TENSOR_OP_MATH). */
  return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C,
              CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F);
}

}  /* extern "C" */
