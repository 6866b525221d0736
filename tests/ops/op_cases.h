// The kernel op cases: one table, read by the op grid (tests/ops/test_ops.cpp checks every case
// against the CPU op) and by kernel_bench (bench/kernel_bench.cpp times the cases marked for
// perf, validating each first), as llama.cpp's test-backend-ops runs one case list in eval
// and perf mode. A case is a parameter struct with a printable name (the gtest parameter
// name, hence the ctest name) and its use; the tables are in op_cases.cpp.
//
// Plain C++17 over the public header: the op grid and kernel_bench include it from the CMake
// build and from bench/standalone/build.sh alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshkern.h"

namespace mk_ops {

// What a case is for. The op grid checks every case; kernel_bench times Perf and PerfDevice.
//   Grid        checked only (odd and edge shapes, small)
//   Perf        checked (by the simulated grid too: a few seconds at most), and timed
//   PerfDevice  a model-sized perf case: timed by kernel_bench, checked by the grid on a real
//               device (test_ops_device); the simulated grid skips it, naming why (cudasim
//               runs the kernel on the CPU: 10 s to minutes a case, gigabytes of memory)
enum class CaseUse { Grid, Perf, PerfDevice };

inline bool is_perf(CaseUse u) { return u != CaseUse::Grid; }

const char *dtype_tag(mk_dtype d); // "f32", "f16", "bf16", else "other"

// ---------------------------------------------------------------------------- rmsnorm --
struct NormCase {
    size_t rows, cols;
    bool add;
    bool tiny = false; // inputs ~1e-3: mean square ~3e-7, below eps, so eps decides the scale
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<NormCase> norm_cases();

// ------------------------------------------------------------------------------ embed --
struct EmbedCase {
    mk_dtype dtype;
    size_t n, hidden, vocab;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<EmbedCase> embed_cases();

// ------------------------------------------------------------------------------- rope --
struct RopeCase {
    mk_rope_layout layout;
    size_t rows, heads, head_dim;
    float theta;
    int32_t pos0; // positions pos0, pos0 + 1, ... (the grid plants a few far ones)
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<RopeCase> rope_cases();

// -------------------------------------------------------------------------- attention --
struct AttnCase { // prefill over an F32 cache
    size_t rows, past, n_heads, n_kv_heads, head_dim;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<AttnCase> prefill_cases();

struct DecodeCase { // one row over a cache of max_keys rows holding past + 1 keys
    size_t past, max_keys, n_heads, n_kv_heads, head_dim;
    mk_dtype kv = MK_DTYPE_F32;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<DecodeCase> decode_cases();

struct AttnTcCase { // prefill on the tensor cores, cache in kv
    size_t rows, past, n_heads, n_kv_heads, head_dim;
    mk_dtype kv;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<AttnTcCase> prefill_tc_cases();

// -------------------------------------------------------------------------- kv append --
struct KvAppendCase { // rows appended at past into a cache of ctx rows, then the last 2 rows
    size_t ctx, kv_dim, past, rows;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<KvAppendCase> kv_append_cases();

// ----------------------------------------------------------------------------- swiglu --
struct SwigluCase {
    mk_dtype dtype;
    size_t n;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<SwigluCase> swiglu_cases();

// ----------------------------------------------------------------------------- argmax --
enum class ArgPattern { Random, Ties, Nans, AllNan, NegInf, Misaligned, ThreadTies, ThreadTiesMisaligned };

struct ArgmaxCase {
    size_t rows, n;
    ArgPattern pattern;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<ArgmaxCase> argmax_cases();

// ---------------------------------------------------------------------------- convert --
struct ConvertCase {
    mk_dtype src, dst;
    size_t n;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<ConvertCase> convert_cases();

// ------------------------------------------------------------------------------- gemv --
// Dense weights (F32, F16, BF16) and the GGUF block formats the device GEMV reads.
enum class GemvFormat { F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS };
const char *gemv_tag(GemvFormat f);
// The block formats, in the order above; the values a block holds (32 or 256).
extern const GemvFormat kGemvBlockFormats[12];
bool gemv_is_blocks(GemvFormat f);
size_t gemv_block_elements(GemvFormat f);
// The GGUF type id of a format (dense formats: BF16's id).
uint32_t gemv_ggml_type(GemvFormat f);
// n_values of format f (a whole number of blocks) as random blocks with sane scales.
std::vector<uint8_t> random_blocks(GemvFormat f, size_t n_values, uint64_t seed);

struct GemvCase {
    GemvFormat fmt;
    size_t rows, in_dim, out_dim;
    bool misaligned = false; // x and w 4 bytes off 16-byte alignment (dense: the scalar path)
    CaseUse use = CaseUse::Grid;
    const char *model = nullptr; // the model whose product a perf case is ("smollm2", "8b")
    std::string name() const;
};
std::vector<GemvCase> gemv_cases();

// Native weights expanded on the device: gathered rows by id and a row slice.
struct DequantCase {
    GemvFormat fmt;
    size_t src_rows, cols;
    CaseUse use = CaseUse::Grid;
    std::string name() const;
};
std::vector<DequantCase> dequant_cases();

// A fused native weight set (Q/K/V, or gate and up with SwiGLU): three matrices, each in its
// own format.
struct QSetCase {
    GemvFormat f[3];
    bool misaligned; // x 4 bytes off 16-byte alignment: the BF16 members take the scalar loads
    CaseUse use = CaseUse::Grid;
    size_t in_dim() const;
    std::string name() const;
};
std::vector<QSetCase> qset_cases();

} // namespace mk_ops
