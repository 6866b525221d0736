// mk_native_gguf.h - small random llama models written as GGUF files with their matrices
// quantized in the test (Q8_0, Q4_1, Q4_0, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, F16, BF16,
// F32): the native weight
// mode's fixtures (test_native_model.cpp on the cpu backend, test_cuda_backend.cpp on cuda).
#ifndef MK_NATIVE_GGUF_H
#define MK_NATIVE_GGUF_H

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "model/gguf.h"
#include "mk_test_util.h"

namespace mk_native_gguf {

// ---------------------------------------------------------------- quantizers (tests) --

inline void put_f16(std::vector<uint8_t> &o, float v) {
    const uint16_t h = mk_f32_to_f16(v);
    o.push_back((uint8_t)(h & 0xff));
    o.push_back((uint8_t)(h >> 8));
}

// ggml's formats written from their definition: nearest level, scale from the block range.
inline void quantize(uint32_t type, const float *x, size_t n, std::vector<uint8_t> &o) {
    if (type == MK_GGML_TYPE_F32) {
        o.insert(o.end(), (const uint8_t *)x, (const uint8_t *)(x + n));
        return;
    }
    if (type == MK_GGML_TYPE_F16 || type == MK_GGML_TYPE_BF16) {
        for (size_t i = 0; i < n; i++) {
            const uint16_t h = type == MK_GGML_TYPE_F16 ? mk_f32_to_f16(x[i]) : mk_f32_to_bf16(x[i]);
            o.push_back((uint8_t)(h & 0xff));
            o.push_back((uint8_t)(h >> 8));
        }
        return;
    }
    const size_t be = type == MK_GGML_TYPE_Q2_K || type == MK_GGML_TYPE_Q3_K || type == MK_GGML_TYPE_Q4_K || type == MK_GGML_TYPE_Q5_K ||
                              type == MK_GGML_TYPE_Q6_K || type == MK_GGML_TYPE_IQ4_XS
                          ? 256
                          : 32;
    // IQ4: the index of the value nearest val / scale (0 for a zero scale)
    auto iq4_index = [](float val, float scale) {
        int best = 0;
        float err = INFINITY;
        for (int q = 0; q < 16; q++) {
            const float e = std::fabs(val - scale * (float)mk_iq4_values[q]);
            if (e < err) err = e, best = q;
        }
        return (uint8_t)best;
    };
    for (size_t b = 0; b < n / be; b++) {
        const float *v = x + b * be;
        float amax = 0, lo = v[0], hi = v[0];
        for (size_t i = 0; i < be; i++) {
            amax = std::max(amax, std::fabs(v[i]));
            lo = std::min(lo, v[i]);
            hi = std::max(hi, v[i]);
        }
        switch (type) {
            case MK_GGML_TYPE_Q8_0: {
                const float d = amax / 127;
                put_f16(o, d);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                for (size_t i = 0; i < 32; i++) o.push_back((uint8_t)(int8_t)std::lround(dd ? v[i] / dd : 0));
                break;
            }
            case MK_GGML_TYPE_Q4_0: case MK_GGML_TYPE_Q4_1: {
                const bool min = type == MK_GGML_TYPE_Q4_1;
                const float d = min ? (hi - lo) / 15 : amax / 7, m = min ? lo : 0;
                put_f16(o, d);
                if (min) put_f16(o, m);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                auto level = [&](float val) {
                    const long q = dd ? std::lround((val - mm) / dd) + (min ? 0 : 8) : (min ? 0 : 8);
                    return (uint8_t)std::min(15L, std::max(0L, q));
                };
                for (size_t i = 0; i < 16; i++) o.push_back((uint8_t)(level(v[i]) | (level(v[i + 16]) << 4)));
                break;
            }
            case MK_GGML_TYPE_Q5_0: case MK_GGML_TYPE_Q5_1: {
                // five-bit levels: the low four in the nibbles (value j and j + 16 share a
                // byte), the fifth of value j in bit j of qh
                const bool min = type == MK_GGML_TYPE_Q5_1;
                const float d = min ? (hi - lo) / 31 : amax / 15, m = min ? lo : 0;
                put_f16(o, d);
                if (min) put_f16(o, m);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                uint8_t q[32];
                uint32_t qh = 0;
                for (size_t i = 0; i < 32; i++) {
                    const long l = dd ? std::lround((v[i] - mm) / dd) + (min ? 0 : 16) : (min ? 0 : 16);
                    q[i] = (uint8_t)std::min(31L, std::max(0L, l));
                    qh |= (uint32_t)(q[i] >> 4) << i;
                }
                for (int k = 0; k < 4; k++) o.push_back((uint8_t)(qh >> (8 * k)));
                for (size_t i = 0; i < 16; i++) o.push_back((uint8_t)((q[i] & 15) | ((q[i + 16] & 15) << 4)));
                break;
            }
            case MK_GGML_TYPE_IQ4_NL: {
                const float d = amax / 127;
                put_f16(o, d);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                for (size_t i = 0; i < 16; i++)
                    o.push_back((uint8_t)(iq4_index(v[i], dd) | (iq4_index(v[i + 16], dd) << 4)));
                break;
            }
            case MK_GGML_TYPE_IQ4_XS: {
                // sub-block ib's scale ls (1..31, stored + 32: every field's top bits set)
                // from its own range; values the nearest of d * ls * mk_iq4_values
                const float d = amax / (127 * 16);
                put_f16(o, d);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                int ls[8];
                uint16_t sh = 0;
                uint8_t sl[4] = {};
                for (int ib = 0; ib < 8; ib++) {
                    float a = 0;
                    for (int i = 0; i < 32; i++) a = std::max(a, std::fabs(v[32 * ib + i]));
                    ls[ib] = dd ? (int)std::min(31L, std::max(1L, std::lround(a / (127 * dd)))) : 1;
                    const int u = ls[ib] + 32;
                    sl[ib / 2] |= (uint8_t)((u & 15) << (4 * (ib % 2)));
                    sh |= (uint16_t)((u >> 4) << (2 * ib));
                }
                o.push_back((uint8_t)(sh & 0xff));
                o.push_back((uint8_t)(sh >> 8));
                o.insert(o.end(), sl, sl + 4);
                for (int ib = 0; ib < 8; ib++)
                    for (int j = 0; j < 16; j++)
                        o.push_back((uint8_t)(iq4_index(v[32 * ib + j], dd * ls[ib]) |
                                              (iq4_index(v[32 * ib + j + 16], dd * ls[ib]) << 4)));
                break;
            }
            case MK_GGML_TYPE_Q2_K: {
                // every group's scale and min 1 (0x11): value i = d * q - dmin, q in 0..3 as
                // bits 2 ((i % 128) / 32) of qs[32 (i / 128) + i % 32]
                const float d = (hi - lo) / 3, m = -lo;
                const uint8_t scales[16] = {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
                                            0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11};
                o.insert(o.end(), scales, scales + 16);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                uint8_t qs[64] = {};
                for (int i = 0; i < 256; i++) {
                    const long l = dd ? std::lround((v[i] + mm) / dd) : 0;
                    qs[32 * (i / 128) + i % 32] |= (uint8_t)(std::min(3L, std::max(0L, l)) << (2 * ((i % 128) / 32)));
                }
                o.insert(o.end(), qs, qs + 64);
                put_f16(o, d);
                put_f16(o, m);
                break;
            }
            case MK_GGML_TYPE_Q3_K: {
                // every group scale 1 (33 - 32: low nibbles 1, top bits 2); value i as
                // round(v / d) + 4 in 0..7, two bits in qs, the third in hmask
                const float d = amax / 4;
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                uint8_t hmask[32] = {}, qs[64] = {};
                for (int i = 0; i < 256; i++) {
                    const long l = dd ? std::lround(v[i] / dd) : 0;
                    const int u = (int)std::min(3L, std::max(-4L, l)) + 4;
                    qs[32 * (i / 128) + i % 32] |= (uint8_t)((u & 3) << (2 * ((i % 128) / 32)));
                    hmask[i % 32] |= (uint8_t)((u >> 2) << (i / 32));
                }
                o.insert(o.end(), hmask, hmask + 32);
                o.insert(o.end(), qs, qs + 64);
                const uint8_t scales[12] = {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0xaa, 0xaa, 0xaa, 0xaa};
                o.insert(o.end(), scales, scales + 12);
                put_f16(o, d);
                break;
            }
            case MK_GGML_TYPE_Q5_K: {
                // As Q4_K below with 32 levels: value l of sub-block u takes its fifth bit
                // from bit u of qh[l]
                const float d = (hi - lo) / 31, m = -lo;
                put_f16(o, d);
                put_f16(o, m);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                const uint8_t scales[12] = {1, 1, 1, 1, 1, 1, 1, 1, 0x11, 0x11, 0x11, 0x11};
                o.insert(o.end(), scales, scales + 12);
                uint8_t q[256], qh[32] = {};
                for (int i = 0; i < 256; i++) {
                    const long l = dd ? std::lround((v[i] + mm) / dd) : 0;
                    q[i] = (uint8_t)std::min(31L, std::max(0L, l));
                    qh[i % 32] |= (uint8_t)((q[i] >> 4) << (i / 32));
                }
                o.insert(o.end(), qh, qh + 32);
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 32; l++)
                        o.push_back((uint8_t)((q[64 * j + l] & 15) | ((q[64 * j + 32 + l] & 15) << 4)));
                break;
            }
            case MK_GGML_TYPE_Q4_K: {
                // One scale and min per super-block (sub-block scales 1, mins 1): coarse but
                // a valid Q4_K block that exercises every field.
                const float d = (hi - lo) / 15, m = -lo;
                put_f16(o, d);
                put_f16(o, m);
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d)), mm = mk_f16_to_f32(mk_f32_to_f16(m));
                const uint8_t scales[12] = {1, 1, 1, 1, 1, 1, 1, 1, 0x11, 0x11, 0x11, 0x11};
                o.insert(o.end(), scales, scales + 12);
                auto level = [&](float val) {
                    const long q = dd ? std::lround((val + mm) / dd) : 0;
                    return (uint8_t)std::min(15L, std::max(0L, q));
                };
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 32; l++)
                        o.push_back((uint8_t)(level(v[64 * j + l]) | (level(v[64 * j + 32 + l]) << 4)));
                break;
            }
            case MK_GGML_TYPE_Q6_K: {
                const float d = amax / 31; // every sub-block scale 1
                const float dd = mk_f16_to_f32(mk_f32_to_f16(d));
                uint8_t ql[128] = {}, qh[64] = {};
                for (int h = 0; h < 2; h++)
                    for (int k = 0; k < 4; k++)
                        for (int l = 0; l < 32; l++) {
                            const float val = v[128 * h + 32 * k + l];
                            const int q = (int)std::min(63L, std::max(0L, (dd ? std::lround(val / dd) : 0) + 32));
                            ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((q & 15) << (4 * (k >> 1)));
                            qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
                        }
                o.insert(o.end(), ql, ql + 128);
                o.insert(o.end(), qh, qh + 64);
                for (int i = 0; i < 16; i++) o.push_back(1);
                put_f16(o, d);
                break;
            }
        }
    }
}

// --------------------------------------------------------------- GGUF writer (tests) --

struct GgufWriter {
    std::vector<uint8_t> head, data;
    uint64_t n_kv = 0, n_tensors = 0;
    std::vector<uint8_t> kv, infos;
    // Called with each tensor's stored bytes once written (a test corrupts one through it).
    std::function<void(const std::string &name, uint32_t type, uint8_t *bytes, size_t n)> edit;

    static void put(std::vector<uint8_t> &o, const void *p, size_t n) {
        o.insert(o.end(), (const uint8_t *)p, (const uint8_t *)p + n);
    }
    static void put_str(std::vector<uint8_t> &o, const std::string &s) {
        const uint64_t n = s.size();
        put(o, &n, 8);
        put(o, s.data(), s.size());
    }
    void kv_u32(const std::string &k, uint32_t v) {
        put_str(kv, k);
        const uint32_t t = MK_GGUF_TYPE_UINT32;
        put(kv, &t, 4);
        put(kv, &v, 4);
        n_kv++;
    }
    void kv_f32(const std::string &k, float v) {
        put_str(kv, k);
        const uint32_t t = MK_GGUF_TYPE_FLOAT32;
        put(kv, &t, 4);
        put(kv, &v, 4);
        n_kv++;
    }
    void kv_str(const std::string &k, const std::string &v) {
        put_str(kv, k);
        const uint32_t t = MK_GGUF_TYPE_STRING;
        put(kv, &t, 4);
        put_str(kv, v);
        n_kv++;
    }
    // A [rows, cols] tensor (cols fastest) of `type`, quantized from x.
    void tensor(const std::string &name, uint32_t type, const std::vector<float> &x, size_t rows, size_t cols) {
        while (data.size() % 32) data.push_back(0);
        const uint64_t offset = data.size();
        quantize(type, x.data(), x.size(), data);
        if (edit) edit(name, type, data.data() + offset, data.size() - offset);
        put_str(infos, name);
        const uint32_t n_dims = rows == 1 ? 1 : 2;
        put(infos, &n_dims, 4);
        const uint64_t d0 = cols, d1 = rows;
        put(infos, &d0, 8);
        if (n_dims == 2) put(infos, &d1, 8);
        put(infos, &type, 4);
        put(infos, &offset, 8);
        n_tensors++;
    }
    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> f;
        put(f, "GGUF", 4);
        const uint32_t version = 3;
        put(f, &version, 4);
        put(f, &n_tensors, 8);
        put(f, &n_kv, 8);
        put(f, kv.data(), kv.size());
        put(f, infos.data(), infos.size());
        while (f.size() % 32) f.push_back(0);
        put(f, data.data(), data.size());
        return f;
    }
};

// A random llama model with hidden 64, 4 heads (2 kv), head_dim 16, ffn 256, 3 layers,
// vocab 40; every matrix quantized to the type `pick` chooses for it.
struct TempModel {
    std::string path;
    ModelPtr model;
    using Edit = std::function<void(const std::string &, uint32_t, uint8_t *, size_t)>;
    template <typename Pick> explicit TempModel(Pick pick, bool tied, Edit edit = nullptr) {
        const size_t hidden = 256, ffn = 512, layers = 3, vocab = 40, heads = 4, kv_heads = 2, hd = 64;
        std::mt19937 rng(77);
        std::normal_distribution<float> nd(0.0f, 0.08f), norm(1.0f, 0.05f);
        auto random = [&](size_t n, bool is_norm) {
            std::vector<float> v(n);
            for (auto &x : v) x = is_norm ? norm(rng) : nd(rng);
            return v;
        };
        GgufWriter w;
        w.edit = edit;
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.context_length", 64);
        w.kv_u32("llama.embedding_length", (uint32_t)hidden);
        w.kv_u32("llama.block_count", (uint32_t)layers);
        w.kv_u32("llama.feed_forward_length", (uint32_t)ffn);
        w.kv_u32("llama.attention.head_count", (uint32_t)heads);
        w.kv_u32("llama.attention.head_count_kv", (uint32_t)kv_heads);
        w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
        w.kv_f32("llama.rope.freq_base", 10000.0f);
        w.tensor("token_embd.weight", pick("token_embd"), random(vocab * hidden, false), vocab, hidden);
        w.tensor("output_norm.weight", MK_GGML_TYPE_F32, random(hidden, true), 1, hidden);
        if (!tied) w.tensor("output.weight", pick("output"), random(vocab * hidden, false), vocab, hidden);
        for (size_t l = 0; l < layers; l++) {
            const std::string b = "blk." + std::to_string(l) + ".";
            w.tensor(b + "attn_norm.weight", MK_GGML_TYPE_F32, random(hidden, true), 1, hidden);
            w.tensor(b + "attn_q.weight", pick("attn_q"), random(heads * hd * hidden, false), heads * hd, hidden);
            w.tensor(b + "attn_k.weight", pick("attn_k"), random(kv_heads * hd * hidden, false), kv_heads * hd, hidden);
            w.tensor(b + "attn_v.weight", pick("attn_v"), random(kv_heads * hd * hidden, false), kv_heads * hd, hidden);
            w.tensor(b + "attn_output.weight", pick("attn_output"), random(hidden * heads * hd, false), hidden, heads * hd);
            w.tensor(b + "ffn_norm.weight", MK_GGML_TYPE_F32, random(hidden, true), 1, hidden);
            w.tensor(b + "ffn_gate.weight", pick("ffn_gate"), random(ffn * hidden, false), ffn, hidden);
            w.tensor(b + "ffn_up.weight", pick("ffn_up"), random(ffn * hidden, false), ffn, hidden);
            w.tensor(b + "ffn_down.weight", pick("ffn_down"), random(hidden * ffn, false), hidden, ffn);
        }
        char tmpl[] = "/tmp/mk_native_XXXXXX";
        const int fd = mkstemp(tmpl);
        EXPECT_GE(fd, 0);
        path = tmpl;
        const std::vector<uint8_t> bytes = w.bytes();
        EXPECT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
        close(fd);
        mk_model *m = nullptr;
        EXPECT_EQ(mk_model_open_gguf(path.c_str(), &m), MK_OK) << mk_last_error();
        model.reset(m);
    }
    ~TempModel() {
        model.reset();
        std::remove(path.c_str());
    }
};

}  // namespace mk_native_gguf

#endif
