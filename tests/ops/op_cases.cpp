// The kernel op case tables (op_cases.h): the op grid's odd and edge shapes, and the
// model-sized shapes kernel_bench times (Llama 3 8B: hidden 4096, ffn 14336, vocab 128256,
// 32/8 heads of 128; SmolLM2-135M: 576, 1536, 49152, 9/3 heads of 64), which the grid checks too.
#include "op_cases.h"

#include <random>

#include "core/half.h"
#include "model/gguf.h"

namespace mk_ops {

namespace {
constexpr CaseUse P = CaseUse::Perf, PD = CaseUse::PerfDevice;
std::string n2s(size_t v) { return std::to_string(v); }
} // namespace

const char *dtype_tag(mk_dtype d) {
    switch (d) {
        case MK_DTYPE_F32: return "f32";
        case MK_DTYPE_F16: return "f16";
        case MK_DTYPE_BF16: return "bf16";
        default: return "other";
    }
}

const char *gemv_tag(GemvFormat f) {
    switch (f) {
        case GemvFormat::F32: return "f32";
        case GemvFormat::F16: return "f16";
        case GemvFormat::BF16: return "bf16";
        case GemvFormat::Q4_0: return "q4_0";
        case GemvFormat::Q4_1: return "q4_1";
        case GemvFormat::Q5_0: return "q5_0";
        case GemvFormat::Q5_1: return "q5_1";
        case GemvFormat::Q8_0: return "q8_0";
        case GemvFormat::Q2_K: return "q2_k";
        case GemvFormat::Q3_K: return "q3_k";
        case GemvFormat::Q4_K: return "q4_k";
        case GemvFormat::Q5_K: return "q5_k";
        case GemvFormat::Q6_K: return "q6_k";
        case GemvFormat::IQ4_NL: return "iq4_nl";
        default: return "iq4_xs";
    }
}

const GemvFormat kGemvBlockFormats[12] = {GemvFormat::Q4_0, GemvFormat::Q4_1, GemvFormat::Q5_0, GemvFormat::Q5_1,
                                          GemvFormat::Q8_0, GemvFormat::IQ4_NL, GemvFormat::Q2_K, GemvFormat::Q3_K,
                                          GemvFormat::Q4_K, GemvFormat::Q5_K, GemvFormat::Q6_K, GemvFormat::IQ4_XS};

bool gemv_is_blocks(GemvFormat f) { return f != GemvFormat::F32 && f != GemvFormat::F16 && f != GemvFormat::BF16; }

size_t gemv_block_elements(GemvFormat f) {
    return f == GemvFormat::Q2_K || f == GemvFormat::Q3_K || f == GemvFormat::Q4_K || f == GemvFormat::Q5_K || f == GemvFormat::Q6_K ||
                   f == GemvFormat::IQ4_XS
               ? 256
               : 32;
}

uint32_t gemv_ggml_type(GemvFormat f) {
    switch (f) {
        case GemvFormat::Q4_0: return MK_GGML_TYPE_Q4_0;
        case GemvFormat::Q4_1: return MK_GGML_TYPE_Q4_1;
        case GemvFormat::Q5_0: return MK_GGML_TYPE_Q5_0;
        case GemvFormat::Q5_1: return MK_GGML_TYPE_Q5_1;
        case GemvFormat::Q8_0: return MK_GGML_TYPE_Q8_0;
        case GemvFormat::Q2_K: return MK_GGML_TYPE_Q2_K;
        case GemvFormat::Q3_K: return MK_GGML_TYPE_Q3_K;
        case GemvFormat::Q4_K: return MK_GGML_TYPE_Q4_K;
        case GemvFormat::Q5_K: return MK_GGML_TYPE_Q5_K;
        case GemvFormat::Q6_K: return MK_GGML_TYPE_Q6_K;
        case GemvFormat::IQ4_NL: return MK_GGML_TYPE_IQ4_NL;
        case GemvFormat::IQ4_XS: return MK_GGML_TYPE_IQ4_XS;
        default: return MK_GGML_TYPE_BF16;
    }
}

// Random blocks of a GGUF format with sane scales: the f16 scales (d, and m / dmin where the
// format has one; mk_ggml_type_f16_scales) in +-[1/512, 1/16] with random signs, every other
// byte (quants, fifth bits, packed 6-bit or int8 sub-block scales) random.
std::vector<uint8_t> random_blocks(GemvFormat f, size_t n_values, uint64_t seed) {
    size_t be = 0, bb = 0;
    const uint32_t type = gemv_ggml_type(f);
    mk_ggml_type_layout(type, &be, &bb);
    int scales[2] = {-1, -1};
    mk_ggml_type_f16_scales(type, scales);
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> out(n_values / be * bb);
    for (auto &b : out) b = (uint8_t)rng();
    std::uniform_real_distribution<float> u(1.0f / 512.0f, 1.0f / 16.0f);
    for (size_t blk = 0; blk < out.size(); blk += bb)
        for (int off : scales) {
            if (off < 0) continue;
            const uint16_t h = mk_f32_to_f16((rng() & 1 ? 1.0f : -1.0f) * u(rng));
            out[blk + (size_t)off] = (uint8_t)(h & 0xff);
            out[blk + (size_t)off + 1] = (uint8_t)(h >> 8);
        }
    return out;
}

// ============================================================================ rmsnorm ==

std::string NormCase::name() const {
    return std::string(add ? "add_" : "") + "r" + n2s(rows) + "_c" + n2s(cols) + (tiny ? "_tiny" : "");
}

std::vector<NormCase> norm_cases() {
    std::vector<NormCase> v;
    for (size_t cols : {1, 31, 33, 100, 576, 4097})
        for (bool add : {false, true}) v.push_back({cols > 1000 ? size_t(2) : size_t(5), cols, add});
    v.push_back({4, 8192, false});
    v.push_back({4, 8192, true});
    v.push_back({64, 32, false});
    v.push_back({16, 8192, true});
    for (size_t cols : {1, 33, 576, 4097})
        for (bool add : {false, true}) v.push_back({cols > 1000 ? size_t(2) : size_t(5), cols, add, true});
    // perf: a 4096-row prefill of the 8B's hidden size, plain and with the residual add; one decode row
    v.push_back({4096, 4096, false, false, PD});
    v.push_back({4096, 4096, true, false, PD});
    v.push_back({1, 8192, false, false, P});
    return v;
}

// ============================================================================== embed ==

std::string EmbedCase::name() const {
    return std::string(dtype_tag(dtype)) + "_n" + n2s(n) + "_h" + n2s(hidden) + "_v" + n2s(vocab);
}

std::vector<EmbedCase> embed_cases() {
    std::vector<EmbedCase> v;
    for (mk_dtype d : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16}) {
        v.push_back({d, 1, 1, 5});
        v.push_back({d, 7, 33, 100});
        v.push_back({d, 9, 576, 300});
        v.push_back({d, 3, 4097, 20});
    }
    v.push_back({MK_DTYPE_BF16, 4096, 4096, 128256, PD}); // perf: 4096 tokens from the 8B's table
    return v;
}

// =============================================================================== rope ==

std::string RopeCase::name() const {
    return std::string(layout == MK_ROPE_ROTATE_HALF ? "half" : "adjacent") + "_r" + n2s(rows) + "_h" + n2s(heads) +
           "_d" + n2s(head_dim) + "_t" + std::to_string((long)theta) + "_p" + std::to_string(pos0);
}

std::vector<RopeCase> rope_cases() {
    std::vector<RopeCase> v;
    for (mk_rope_layout l : {MK_ROPE_ROTATE_HALF, MK_ROPE_ADJACENT_PAIRS}) {
        v.push_back({l, 5, 3, 6, 10000.0f, 0});
        v.push_back({l, 4, 2, 8, 10000.0f, 7});
        v.push_back({l, 6, 8, 64, 10000.0f, 100000});
        v.push_back({l, 5, 4, 128, 500000.0f, 99990});
        v.push_back({l, 3, 2, 256, 10000.0f, 12345});
    }
    v.push_back({MK_ROPE_ROTATE_HALF, 33, 32, 128, 500000.0f, 0});
    v.push_back({MK_ROPE_ROTATE_HALF, 4096, 32, 128, 500000.0f, 1000, P}); // perf: the 8B's Q of 4096 rows
    return v;
}

// ========================================================================== attention ==

std::string AttnCase::name() const {
    return "r" + n2s(rows) + "_past" + n2s(past) + "_h" + n2s(n_heads) + "_kv" + n2s(n_kv_heads) + "_d" + n2s(head_dim);
}

std::vector<AttnCase> prefill_cases() {
    return {
        {1, 0, 1, 1, 8},     {5, 0, 4, 2, 6},     {3, 40, 6, 3, 6},     {33, 0, 8, 8, 64},    {17, 100, 16, 2, 128},
        {70, 17, 6, 2, 128}, {300, 0, 8, 1, 64},  {40, 5, 2, 1, 256},   {20, 3, 3, 1, 96},    {16, 16, 4, 4, 128},
        {2, 250, 3, 3, 32},  {64, 2000, 8, 1, 128}, {300, 0, 8, 1, 128}, {129, 7, 12, 4, 64},
        // perf: the 8B's heads, a 2048-token prompt, 512 rows after 4096 cached, and head_dim 64
        {2048, 0, 32, 8, 128, PD}, {512, 4096, 32, 8, 128, PD}, {2048, 0, 32, 8, 64, PD},
    };
}

std::string DecodeCase::name() const {
    return "past" + n2s(past) + "_max" + n2s(max_keys) + "_h" + n2s(n_heads) + "_kv" + n2s(n_kv_heads) + "_d" +
           n2s(head_dim) + "_" + dtype_tag(kv);
}

std::vector<DecodeCase> decode_cases() {
    // {past, max_keys, n_heads, n_kv_heads, head_dim}: keys 1, 2, 255, 256, 257, 1000 and near
    // or at max_keys; GQA 1:1, 3:1 (SmolLM2's 9:3), 4:1, 8:1 and 16:1 (two head groups per KV
    // head); head_dim 64, 128, 256 and odd widths (6 and 34: 2-element loads; 40: F16/BF16
    // 16-byte loads, F32 4-wide).
    const DecodeCase shapes[] = {
        {0, 1, 1, 1, 64},       {1, 600, 9, 3, 64},      {254, 256, 8, 2, 128},   {255, 700, 9, 3, 64},
        {256, 1024, 4, 4, 128}, {999, 1100, 12, 3, 64},  {2046, 2048, 9, 3, 64},  {4095, 4096, 8, 2, 128},
        {300, 512, 6, 2, 6},    {77, 300, 6, 3, 34},     {130, 200, 3, 1, 256},   {500, 600, 16, 1, 64},
        {1999, 2048, 8, 1, 128}, {257, 1100, 3, 3, 40},  {0, 600, 2, 1, 8},
    };
    std::vector<DecodeCase> out;
    for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16})
        for (DecodeCase c : shapes) {
            c.kv = kv;
            out.push_back(c);
        }
    // perf: KV bandwidth, 8B-shaped (32/8 heads, d128) at a few context lengths in a 32K-row
    // cache and SmolLM2-shaped (9/3, d64), F32 (parity) and F16 (speed) caches; BF16 once
    for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_F16}) {
        for (const size_t past : {1023, 8191, 32767}) out.push_back({past, 32768, 32, 8, 128, kv, past < 4096 ? P : PD});
        out.push_back({4095, 8192, 9, 3, 64, kv, P});
    }
    out.push_back({8191, 32768, 32, 8, 128, MK_DTYPE_BF16, PD});
    return out;
}

std::string AttnTcCase::name() const {
    return "r" + n2s(rows) + "_past" + n2s(past) + "_h" + n2s(n_heads) + "_kv" + n2s(n_kv_heads) + "_d" + n2s(head_dim) +
           "_" + dtype_tag(kv);
}

std::vector<AttnTcCase> prefill_tc_cases() {
    std::vector<AttnTcCase> v;
    const mk_dtype kvs[] = {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16};
    size_t i = 0;
    for (size_t rows : {1, 17, 64, 100})
        for (size_t past : {0, 37})
            for (size_t kv_heads : {2, 8})     // GQA 4:1 and 1:1 over 8 query heads
                for (size_t hd : {64, 128}) // every cache dtype in turn, each over every shape family
                    v.push_back({rows, past, 8, kv_heads, hd, kvs[i++ % 3]});
    v.push_back({130, 300, 4, 1, 64, MK_DTYPE_BF16}); // three row blocks, several key tiles
    v.push_back({33, 5, 6, 3, 80, MK_DTYPE_F32});     // generic head_dim (a multiple of 16)
    v.push_back({40, 70, 2, 1, 256, MK_DTYPE_F16});   // the widest head: 32-key tiles
    // perf: the plain prefill's shapes (prefill_cases), F32 and BF16 caches, against the cuBLAS GEMM rate
    for (const AttnCase &p : prefill_cases())
        if (is_perf(p.use))
            for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_BF16})
                v.push_back({p.rows, p.past, p.n_heads, p.n_kv_heads, p.head_dim, kv, p.use});
    return v;
}

// ========================================================================== kv append ==

std::string KvAppendCase::name() const {
    return "ctx" + n2s(ctx) + "_kv" + n2s(kv_dim) + "_past" + n2s(past) + "_r" + n2s(rows);
}

std::vector<KvAppendCase> kv_append_cases() {
    return {
        {40, 3 * 6, 13, 9},
        {8192, 1024, 4096, 4096, P}, // perf: 4096 rows of the 8B's K and V (8 heads of 128)
    };
}

// ============================================================================= swiglu ==

std::string SwigluCase::name() const { return std::string(dtype_tag(dtype)) + "_n" + n2s(n); }

std::vector<SwigluCase> swiglu_cases() {
    std::vector<SwigluCase> v;
    for (mk_dtype d : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16})
        for (size_t n : {1, 31, 1000, 65537}) v.push_back({d, n});
    // perf: the 8B's FFN activation for 4096 rows
    v.push_back({MK_DTYPE_F32, size_t(4096) * 14336, PD});
    v.push_back({MK_DTYPE_BF16, size_t(4096) * 14336, PD});
    return v;
}

// ============================================================================= argmax ==

std::string ArgmaxCase::name() const {
    static const char *tags[] = {"random", "ties", "nans", "allnan", "neginf", "misaligned", "threadties",
                                 "threadties_misaligned"};
    return std::string(tags[(int)pattern]) + "_r" + n2s(rows) + "_n" + n2s(n);
}

std::vector<ArgmaxCase> argmax_cases() {
    std::vector<ArgmaxCase> v;
    for (size_t n : {1, 31, 1000, 4097, 49152}) {
        v.push_back({3, n, ArgPattern::Random});
        v.push_back({3, n, ArgPattern::Ties});
        v.push_back({2, n, ArgPattern::Nans});
    }
    v.push_back({2, 100, ArgPattern::AllNan});
    v.push_back({2, 37, ArgPattern::NegInf});
    v.push_back({2, 4096, ArgPattern::Misaligned});
    v.push_back({1, 262144, ArgPattern::Ties});
    v.push_back({1, 262144, ArgPattern::Nans});
    v.push_back({1, 256000, ArgPattern::Random, P}); // perf too: a 256K vocabulary's greedy pick
    v.push_back({1, 151937, ArgPattern::Ties});
    for (size_t n : {100, 1000, 4097, 49152}) v.push_back({3, n, ArgPattern::ThreadTies});
    v.push_back({3, 1000, ArgPattern::ThreadTiesMisaligned});
    v.push_back({2, 8192, ArgPattern::ThreadTiesMisaligned});
    // perf: a power-of-two vocabulary, and 32 rows of the 8B's
    v.push_back({1, 262144, ArgPattern::Random, P});
    v.push_back({32, 128256, ArgPattern::Random, P});
    return v;
}

// ============================================================================ convert ==

std::string ConvertCase::name() const {
    return std::string(dtype_tag(src)) + "_to_" + dtype_tag(dst) + "_n" + n2s(n);
}

std::vector<ConvertCase> convert_cases() {
    std::vector<ConvertCase> v;
    const mk_dtype pairs[][2] = {{MK_DTYPE_F32, MK_DTYPE_F16},  {MK_DTYPE_F32, MK_DTYPE_BF16}, {MK_DTYPE_F16, MK_DTYPE_F32},
                                 {MK_DTYPE_BF16, MK_DTYPE_F32}, {MK_DTYPE_F16, MK_DTYPE_BF16}, {MK_DTYPE_BF16, MK_DTYPE_F16},
                                 {MK_DTYPE_F32, MK_DTYPE_F32}};
    for (auto &p : pairs)
        for (size_t n : {1, 1000, 70001}) v.push_back({p[0], p[1], n});
    v.push_back({MK_DTYPE_F32, MK_DTYPE_BF16, size_t(1) << 26, PD}); // perf: 64M elements to the GEMM dtype
    return v;
}

// =============================================================================== gemv ==

std::string GemvCase::name() const {
    return std::string(gemv_tag(fmt)) + "_r" + n2s(rows) + "_in" + n2s(in_dim) + "_out" + n2s(out_dim) +
           (misaligned ? "_misaligned" : "");
}

std::vector<GemvCase> gemv_cases() {
    std::vector<GemvCase> v;
    for (GemvFormat f : {GemvFormat::F32, GemvFormat::F16, GemvFormat::BF16}) {
        for (size_t rows : {1, 3, 8}) {
            v.push_back({f, rows, 1, 3});
            v.push_back({f, rows, 33, 7});    // no vector path (33 % 8)
            v.push_back({f, rows, 576, 37});  // SmolLM2 width; partial last block of warps
            v.push_back({f, rows, 40, 129});
            v.push_back({f, rows, 36, 11});   // 4-aligned, not 8: F32 takes the vector path, F16/BF16 do not
        }
        for (size_t rows : {2, 4, 5, 6, 7}) v.push_back({f, rows, 72, 9});
        v.push_back({f, 1, 4096, 6});
        v.push_back({f, 2, 576, 5, true});
    }
    for (GemvFormat f : kGemvBlockFormats) {
        const size_t be = gemv_block_elements(f);
        for (size_t rows : {1, 3, 8}) {
            v.push_back({f, rows, be, 5});
            v.push_back({f, rows, be * 3, 37});
            v.push_back({f, rows, be == 256 ? size_t(512) : size_t(576), 129});
        }
        for (size_t rows : {2, 4, 5, 6, 7}) v.push_back({f, rows, be * 2, 9});
        v.push_back({f, 1, 4096, 6});
    }
    // perf: the decode products that dominate a token, one row, in BF16, Q4_1 and Q8_0:
    // SmolLM2-135M's (hidden 576, ffn 1536, vocab 49152) and Llama 3 8B's (4096, 14336, 128256);
    // and 8 rows of the 8B's FFN in Q4_1
    struct Shape {
        const char *model;
        size_t in, out;
        CaseUse use;
    };
    const Shape shapes[] = {{"smollm2", 576, 1536, P}, {"smollm2", 1536, 576, P}, {"smollm2", 576, 49152, P},
                            {"8b", 4096, 4096, P},    {"8b", 4096, 14336, PD},   {"8b", 14336, 4096, PD},
                            {"8b", 4096, 128256, PD}};
    for (const Shape &s : shapes)
        for (const GemvFormat f : {GemvFormat::BF16, GemvFormat::Q4_1, GemvFormat::Q8_0})
            v.push_back({f, 1, s.in, s.out, false, s.use, s.model});
    v.push_back({GemvFormat::Q4_1, 8, 4096, 14336, false, PD, "8b"});
    // and every other block format on the 8B's FFN up product, one row, with the products a
    // Q4_K_M file stores in Q6_K (ffn_down, output) and SmolLM2 Q4_K_M's Q5_0/Q6_K widths
    for (const GemvFormat f : kGemvBlockFormats)
        if (f != GemvFormat::Q4_1 && f != GemvFormat::Q8_0) v.push_back({f, 1, 4096, 14336, false, PD, "8b"});
    v.push_back({GemvFormat::Q4_K, 8, 4096, 14336, false, PD, "8b"});
    v.push_back({GemvFormat::Q6_K, 1, 14336, 4096, false, PD, "8b"});
    v.push_back({GemvFormat::Q6_K, 1, 4096, 128256, false, PD, "8b"});
    v.push_back({GemvFormat::Q5_0, 1, 576, 1536, false, PD, "smollm2"});
    v.push_back({GemvFormat::Q6_K, 1, 1536, 576, false, PD, "smollm2"});
    return v;
}

std::string DequantCase::name() const { return std::string(gemv_tag(fmt)) + "_r" + n2s(src_rows) + "_c" + n2s(cols); }

std::vector<DequantCase> dequant_cases() {
    std::vector<DequantCase> v;
    for (GemvFormat f : kGemvBlockFormats) {
        const size_t be = gemv_block_elements(f);
        v.push_back({f, 5, be == 256 ? size_t(512) : size_t(160)});
    }
    v.push_back({GemvFormat::Q8_0, 7, 96});
    v.push_back({GemvFormat::Q4_K, 3, 256});
    return v;
}

size_t QSetCase::in_dim() const {
    for (GemvFormat g : f)
        if (gemv_block_elements(g) == 256) return 256;
    return misaligned ? 160 : 96; // 3 or 5 blocks of 32
}

std::string QSetCase::name() const {
    return std::string(gemv_tag(f[0])) + "_" + gemv_tag(f[1]) + "_" + gemv_tag(f[2]) + (misaligned ? "_misaligned" : "");
}

std::vector<QSetCase> qset_cases() {
    const GemvFormat q8 = GemvFormat::Q8_0, q41 = GemvFormat::Q4_1, q4k = GemvFormat::Q4_K, b16 = GemvFormat::BF16;
    const GemvFormat q40 = GemvFormat::Q4_0, q50 = GemvFormat::Q5_0, q51 = GemvFormat::Q5_1, q3k = GemvFormat::Q3_K,
                     q5k = GemvFormat::Q5_K, q6k = GemvFormat::Q6_K, inl = GemvFormat::IQ4_NL,
                     ixs = GemvFormat::IQ4_XS;
    return {{{q8, q8, q8}, false},    {{q41, q41, q41}, false}, {{q4k, q4k, q4k}, false}, {{b16, b16, b16}, false},
            {{q4k, q8, b16}, false},  {{q8, q41, b16}, false},  {{b16, q4k, q41}, false}, {{q41, b16, q8}, true},
            {{b16, b16, q8}, true},   {{q40, q50, q51}, false}, {{q51, b16, q40}, true},  {{q3k, q5k, q6k}, false},
            {{q6k, q50, q3k}, false}, {{q5k, q40, b16}, false}, {{inl, ixs, q8}, false},
            {{b16, inl, q51}, true},  {{GemvFormat::Q2_K, q6k, GemvFormat::Q2_K}, false}};
}

} // namespace mk_ops
