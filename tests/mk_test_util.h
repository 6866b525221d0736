// Shared helpers for the GoogleTest suites: owning wrappers and whole/split drivers.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "meshkern.h"

#define MK_ASSERT_OK(expr)                                                          \
    do {                                                                            \
        mk_status mk_assert_status_ = (expr);                                       \
        ASSERT_EQ(mk_assert_status_, MK_OK) << #expr << ": " << mk_status_name(mk_assert_status_) \
                                            << ": " << mk_last_error();            \
    } while (0)

struct ModelDeleter { void operator()(mk_model *m) const { mk_model_free(m); } };
struct RangeDeleter { void operator()(mk_range *r) const { mk_range_free(r); } };
struct SequenceDeleter { void operator()(mk_sequence *s) const { mk_sequence_close(s); } };
struct BundleDeleter { void operator()(mk_bundle *b) const { mk_bundle_free(b); } };
struct TailDeleter { void operator()(mk_tail_output *t) const { mk_tail_output_free(t); } };
struct BufferDeleter { void operator()(uint8_t *p) const { mk_buffer_free(p); } };
using ModelPtr = std::unique_ptr<mk_model, ModelDeleter>;
using RangePtr = std::unique_ptr<mk_range, RangeDeleter>;
using SequencePtr = std::unique_ptr<mk_sequence, SequenceDeleter>;
using BundlePtr = std::unique_ptr<mk_bundle, BundleDeleter>;
using TailPtr = std::unique_ptr<mk_tail_output, TailDeleter>;
using BufferPtr = std::unique_ptr<uint8_t, BufferDeleter>;

inline ModelPtr make_random_model(const mk_hparams &hp, uint64_t seed = 20260715, const char *arch = nullptr) {
    mk_model *m = nullptr;
    const mk_status s = mk_model_create_random(&hp, seed, arch, &m);
    EXPECT_EQ(s, MK_OK) << mk_last_error();
    return ModelPtr(m);
}

inline mk_hparams gqa_tied_hparams() {
    mk_hparams hp = mk_hparams_seed_default();
    hp.n_heads = 6;
    hp.n_kv_heads = 2;
    hp.head_dim = 6;
    hp.hidden = 36;
    hp.intermediate = 72;
    hp.vocab = 53;
    hp.n_layers = 5;
    hp.tied_embeddings = true;
    hp.rope_layout = MK_ROPE_ADJACENT_PAIRS;
    return hp;
}

// Inclusive [start, end] ranges from the last layer of each non-final range.
inline std::vector<std::pair<int64_t, int64_t>> ranges_from_cuts(const std::vector<int64_t> &cuts, int64_t n_layers) {
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t start = 0;
    for (int64_t cut : cuts) {
        out.push_back({start, cut});
        start = cut + 1;
    }
    out.push_back({start, n_layers - 1});
    return out;
}

// A model run as a chain of ranges, one sequence each, with every seam shipped through
// pack/unpack (the wire) unless through_wire is false.
class Pipeline {
  public:
    Pipeline(const mk_model *model, const std::vector<int64_t> &cuts, mk_range_options options = mk_range_options_default(),
             bool through_wire = true)
        : through_wire_(through_wire) {
        for (auto [start, end] : ranges_from_cuts(cuts, (int64_t)mk_model_hparams(model)->n_layers)) {
            mk_range *r = nullptr;
            status_ = mk_range_create(model, start, end, &options, &r);
            if (status_ != MK_OK) return;
            ranges_.emplace_back(r);
            mk_sequence *s = nullptr;
            status_ = mk_sequence_open(r, &s);
            if (status_ != MK_OK) return;
            seqs_.emplace_back(s);
        }
    }
    mk_status status() const { return status_; }
    mk_range *range(size_t i) { return ranges_[i].get(); }

    // One step: tokens into the head, bundles across the seams, a tail output out.
    mk_status step(const std::vector<int32_t> &tokens, TailPtr *out) {
        BundlePtr carried;
        for (size_t i = 0; i < ranges_.size(); i++) {
            const bool last = i + 1 == ranges_.size();
            mk_bundle *emitted = nullptr;
            mk_tail_output *tail = nullptr;
            BundlePtr incoming;
            if (i > 0) {
                if (through_wire_) {
                    uint8_t *bytes = nullptr;
                    size_t len = 0;
                    mk_status s = mk_bundle_pack(carried.get(), &bytes, &len);
                    if (s != MK_OK) return s;
                    BufferPtr hold(bytes);
                    mk_bundle *unpacked = nullptr;
                    s = mk_bundle_unpack(bytes, len, &unpacked);
                    if (s != MK_OK) return s;
                    incoming.reset(unpacked);
                } else {
                    incoming = std::move(carried);
                }
            }
            const mk_status s = mk_range_forward(ranges_[i].get(), seqs_[i].get(), i == 0 ? tokens.data() : nullptr,
                                                 i == 0 ? tokens.size() : 0, incoming.get(), nullptr,
                                                 last ? nullptr : &emitted, last ? &tail : nullptr);
            if (s != MK_OK) return s;
            if (last) out->reset(tail);
            else carried.reset(emitted);
        }
        return MK_OK;
    }

    mk_status reset() {
        for (auto &s : seqs_) {
            const mk_status st = mk_sequence_reset(s.get());
            if (st != MK_OK) return st;
        }
        return MK_OK;
    }

  private:
    bool through_wire_;
    mk_status status_ = MK_OK;
    std::vector<RangePtr> ranges_;
    std::vector<SequencePtr> seqs_;
};

inline std::vector<float> logits_of(const TailPtr &t) { return std::vector<float>(t->logits, t->logits + t->batch * t->vocab); }

inline bool bit_identical(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
