// Shared helpers for the GoogleTest suites: owning wrappers and whole/split drivers.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <strings.h>
#include <unistd.h>
#include <vector>

#include "meshkern.h"

// ====================================================================== skips ==
// One rule for every conditional skip in the suite: a test may skip only when its
// prerequisite is *absent*, and only where absence is allowed.
//  - The default model (or MESHKERN_MODEL) missing: a skip on a developer's machine, a
//    failure under CI (CI=true) or MESHKERN_REQUIRE_MODEL=1 (scripts/test.sh sets it).
//  - A model file that is present but does not open is always a failure: a corrupt file
//    or a loader regression must never read as a green skip.
//  - Device tests (MK_REQUIRE_DEVICE, with the CUDA runtime header included first) skip
//    only when cudaGetDeviceCount says there is no device; any other answer fails.

inline bool mk_test_env_true(const char *name) {
    const char *v = std::getenv(name);
    return v && (std::strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0);
}

inline bool mk_test_model_required() { return mk_test_env_true("CI") || mk_test_env_true("MESHKERN_REQUIRE_MODEL"); }

// The folder holding the source tree's data (models/, tests/fixtures/): MESHKERN_SOURCE_DIR
// if set; else the build's source directory (MK_SOURCE_DIR, empty in a relocatable build:
// MESHKERN_RELOCATABLE, which scripts/gpu_bundle.sh uses so that no absolute path of this
// machine is baked into a carried binary); else <executable>/../share/meshkern, where the
// GPU bundle unpacks the fixtures; else the current directory.
inline std::string mk_test_source_dir() {
    if (const char *p = std::getenv("MESHKERN_SOURCE_DIR"); p && *p) return p;
#if defined(MK_SOURCE_DIR)
    if (MK_SOURCE_DIR[0] != '\0') return MK_SOURCE_DIR;
#endif
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        std::string dir(exe, (size_t)n);
        dir = dir.substr(0, dir.rfind('/'));
        const std::string share = dir + "/../share/meshkern";
        if (access(share.c_str(), F_OK) == 0) return share;
    }
    return ".";
}

// The SmolLM2 model the suites run: MESHKERN_MODEL if set, else the fetched default.
inline std::string mk_test_model_path() {
    if (const char *p = std::getenv("MESHKERN_MODEL"); p && *p) return p;
    return mk_test_source_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool mk_test_file_present(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

// In a test body or SetUp: returns from it with a skip (developer machine) or a failure
// (CI / MESHKERN_REQUIRE_MODEL=1) when `path` does not exist. Whatever follows must
// ASSERT that the present file opens.
#define MK_REQUIRE_MODEL_FILE(path)                                                                            \
    do {                                                                                                      \
        const std::string mk_model_path_ = (path);                                                            \
        if (!mk_test_file_present(mk_model_path_)) {                                                          \
            if (mk_test_model_required())                                                                     \
                FAIL() << mk_model_path_ << " is missing and required here (CI or MESHKERN_REQUIRE_MODEL=1)"; \
            GTEST_SKIP() << mk_model_path_ << " not present: run scripts/fetch_model.sh";                     \
        }                                                                                                     \
    } while (0)

#if defined(__CUDA_RUNTIME_API_H__)
// Number of CUDA devices; 0 only when the runtime says there are none (no device, or no
// driver on a machine without an NVIDIA device node). Any other error goes to *error.
inline int mk_test_device_count(std::string *error) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) return n;
    (void)cudaGetLastError();
    if (e == cudaErrorNoDevice) return 0;
    if (e == cudaErrorInsufficientDriver && access("/dev/nvidiactl", F_OK) != 0) return 0;
    *error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return 0;
}

#define MK_REQUIRE_DEVICE()                                                  \
    do {                                                                     \
        std::string mk_device_error_;                                        \
        const int mk_devices_ = mk_test_device_count(&mk_device_error_);     \
        if (!mk_device_error_.empty()) FAIL() << mk_device_error_;           \
        if (mk_devices_ == 0) GTEST_SKIP() << "no CUDA device";              \
    } while (0)
#endif

#define MK_ASSERT_OK(expr)                                                          \
    do {                                                                            \
        mk_status mk_assert_status_ = (expr);                                       \
        ASSERT_EQ(mk_assert_status_, MK_OK) << #expr << ": " << mk_status_name(mk_assert_status_) \
                                            << ": " << mk_last_error();            \
    } while (0)

// A failing call: the expected status, and a message of its own that names the problem
// (`needle` is a part specific to the case; a stale or generic message does not pass).
inline ::testing::AssertionResult mk_error_is(const char *expr_text, mk_status got, mk_status want, const char *needle) {
    const std::string message = mk_last_error();
    if (got != want)
        return ::testing::AssertionFailure() << expr_text << ": got " << mk_status_name(got) << ", want "
                                             << mk_status_name(want) << " (message: '" << message << "')";
    if (message.find(needle) == std::string::npos)
        return ::testing::AssertionFailure() << expr_text << ": message '" << message << "' does not name '" << needle
                                             << "'";
    return ::testing::AssertionSuccess();
}
#define EXPECT_ERROR(expr, want, needle) EXPECT_TRUE(mk_error_is(#expr, (expr), (want), (needle)))
#define ASSERT_ERROR(expr, want, needle) ASSERT_TRUE(mk_error_is(#expr, (expr), (want), (needle)))

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

// The options of the one pipeline constructor, spelled out (seam NULL: LOCAL; no devices:
// every range on range->backend.device).
inline mk_pipeline_options pipeline_options(const int64_t *cuts, size_t n_cuts, const mk_range_options *range,
                                            const mk_seam_options *seam = nullptr, const int *devices = nullptr,
                                            size_t n_devices = 0) {
    mk_pipeline_options o = mk_pipeline_options_default();
    o.range = range;
    o.cuts = cuts;
    o.n_cuts = n_cuts;
    o.seam = seam;
    o.devices = devices;
    o.n_devices = n_devices;
    return o;
}

// The library's pipeline driver with ownership (every seam through the wire unless
// through_wire is false).
class Pipeline {
  public:
    // Every seam packed to bytes and unpacked (WIRE), or a local copy (LOCAL).
    Pipeline(const mk_model *model, const std::vector<int64_t> &cuts, mk_range_options options = mk_range_options_default(),
             bool through_wire = true)
        : Pipeline(model, cuts, options, mk_seam_options_default(through_wire ? MK_SEAM_WIRE : MK_SEAM_LOCAL)) {}
    // Every seam over the given transport.
    Pipeline(const mk_model *model, const std::vector<int64_t> &cuts, mk_range_options options,
             const mk_seam_options &seam) {
        mk_pipeline *p = nullptr;
        const mk_pipeline_options po = pipeline_options(cuts.data(), cuts.size(), &options, &seam);
        status_ = mk_pipeline_create(model, &po, &p);
        pipeline_.reset(p);
    }
    mk_pipeline *get() { return pipeline_.get(); }
    mk_status status() const { return status_; }
    mk_range *range(size_t i) { return mk_pipeline_range(pipeline_.get(), i); }
    mk_status step(const std::vector<int32_t> &tokens, TailPtr *out) {
        mk_tail_output *t = nullptr;
        const mk_status s = mk_pipeline_step(pipeline_.get(), tokens.data(), tokens.size(), &t);
        out->reset(t);
        return s;
    }
    mk_status reset() { return mk_pipeline_reset(pipeline_.get()); }

  private:
    struct Deleter { void operator()(mk_pipeline *p) const { mk_pipeline_free(p); } };
    mk_status status_ = MK_OK;
    std::unique_ptr<mk_pipeline, Deleter> pipeline_;
};

// A bundle as a peer receives it: packed to protobuf bytes and unpacked.
inline BundlePtr through_wire(const mk_bundle *bundle) {
    uint8_t *bytes = nullptr;
    size_t len = 0;
    EXPECT_EQ(mk_bundle_pack(bundle, &bytes, &len), MK_OK) << mk_last_error();
    BufferPtr hold(bytes);
    mk_bundle *received = nullptr;
    EXPECT_EQ(mk_bundle_unpack(bytes, len, &received), MK_OK) << mk_last_error();
    return BundlePtr(received);
}

// The tail output's logits; empty for a token_only range (no logits came back).
inline std::vector<float> logits_of(const TailPtr &t) {
    if (!t->logits) return {};
    return std::vector<float>(t->logits, t->logits + t->batch * t->vocab);
}

inline bool bit_identical(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Greedy decode through a pipeline: prefill the prompt, then one token per step with the
// KV cache; n_steps outputs in all (prefill's first). With `forced`, step i+1 is fed
// forced[i] instead of the sampled token (teacher forcing).
struct Decode {
    std::vector<std::vector<float>> logits; // per step
    std::vector<int32_t> tokens;
};

inline Decode decode_greedy_on(Pipeline &p, const std::vector<int32_t> &prompt, size_t n_steps,
                               const std::vector<int32_t> *forced = nullptr);

inline Decode decode_greedy(const mk_model *model, const std::vector<int64_t> &cuts, const mk_range_options &options,
                            const std::vector<int32_t> &prompt, size_t n_steps,
                            const std::vector<int32_t> *forced = nullptr) {
    Pipeline p(model, cuts, options);
    return decode_greedy_on(p, prompt, n_steps, forced);
}

// The same through a given seam transport.
inline Decode decode_greedy_seam(const mk_model *model, const std::vector<int64_t> &cuts, const mk_range_options &options,
                                 const mk_seam_options &seam, const std::vector<int32_t> &prompt, size_t n_steps) {
    Pipeline p(model, cuts, options, seam);
    return decode_greedy_on(p, prompt, n_steps);
}

inline Decode decode_greedy_on(Pipeline &p, const std::vector<int32_t> &prompt, size_t n_steps,
                               const std::vector<int32_t> *forced) {
    Decode d;
    EXPECT_EQ(p.status(), MK_OK) << mk_status_name(p.status()) << ": " << mk_last_error();
    if (p.status() != MK_OK) return d;
    std::vector<int32_t> next = prompt;
    for (size_t i = 0; i < n_steps; i++) {
        TailPtr out;
        const mk_status s = p.step(next, &out);
        EXPECT_EQ(s, MK_OK) << mk_status_name(s) << ": " << mk_last_error();
        if (s != MK_OK) return d;
        d.logits.push_back(logits_of(out));
        d.tokens.push_back(out->token_ids[0]);
        next = {forced ? (*forced)[i] : out->token_ids[0]};
    }
    return d;
}

// The random models every parity suite runs: the seed's shapes, and GQA + tied
// embeddings + adjacent-pairs RoPE.
struct ModelCase {
    const char *name;
    mk_hparams hp;
    std::vector<int32_t> prompt;
};

inline std::vector<ModelCase> model_cases() {
    return {{"seed", mk_hparams_seed_default(), {2, 17, 8, 25, 40, 1, 33}},
            {"gqa_tied_adjacent", gqa_tied_hparams(), {50, 3, 17, 9, 44, 2, 21, 11, 30}}};
}
