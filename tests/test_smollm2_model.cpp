// The embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF), end to end on the cpu
// backend: agreement with an independent float64 NumPy forward (scripts/
// make_smollm2_reference.py, fixtures in tests/fixtures/smollm2), whole vs 2-range vs
// 3-range bit-exact parity over 32 greedy tokens, per-range resident weights, digests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mk_test_util.h"

namespace {

const std::string kModelPath = mk_test_model_path();
const std::string kFixtures = std::string(MK_FIXTURE_DIR) + "/smollm2/";

std::vector<int32_t> read_ints(std::istream &in) {
    std::vector<int32_t> v;
    std::string line;
    std::getline(in, line);
    std::istringstream s(line);
    int32_t x;
    while (s >> x) v.push_back(x);
    return v;
}

std::vector<int32_t> read_int_file(const std::string &name) {
    std::ifstream f(kFixtures + name);
    return read_ints(f);
}

std::vector<float> read_floats(const std::string &name) {
    std::ifstream f(kFixtures + name, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / sizeof(float));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    return v;
}

class SmolLM2 : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (!mk_test_file_present(kModelPath)) return;
        mk_model *m = nullptr;
        if (mk_model_open_gguf(kModelPath.c_str(), &m) == MK_OK) model_.reset(m);
        else open_error_ = mk_last_error();
    }
    static void TearDownTestSuite() { model_.reset(); }
    // Absent: skip (or fail under CI); present but unopenable: fail (tests/mk_test_util.h).
    void SetUp() override {
        MK_REQUIRE_MODEL_FILE(kModelPath);
        ASSERT_TRUE(model_) << kModelPath << " is present but does not open: " << open_error_;
    }
    static mk_range_options options(size_t context) {
        mk_range_options o = mk_range_options_default();
        o.max_context = context;
        return o;
    }
    static ModelPtr model_;
    static std::string open_error_;
};
ModelPtr SmolLM2::model_;
std::string SmolLM2::open_error_;

TEST_F(SmolLM2, TeacherForcedAgreesWithIndependentReference) {
    const std::vector<int32_t> tokens = read_int_file("tokens.txt");
    const std::vector<int32_t> argmax = read_int_file("argmax.txt");
    const std::vector<int32_t> indices = read_int_file("indices.txt");
    const std::vector<float> sample = read_floats("logits_sample.bin");
    const std::vector<float> last = read_floats("last_logits.bin");
    const size_t T = tokens.size(), K = indices.size();
    ASSERT_GE(T, 64u);
    ASSERT_EQ(argmax.size(), T);
    ASSERT_EQ(sample.size(), T * K);
    const size_t vocab = mk_model_hparams(model_.get())->vocab;
    ASSERT_EQ(last.size(), vocab);

    // One token per step through the KV cache gives the logits at every position.
    Pipeline p(model_.get(), {}, options(T));
    MK_ASSERT_OK(p.status());
    float worst = 0.0f;
    for (size_t t = 0; t < T; t++) {
        TailPtr out;
        MK_ASSERT_OK(p.step({tokens[t]}, &out));
        EXPECT_EQ(out->token_ids[0], argmax[t]) << "argmax differs at position " << t;
        float scale = 0.0f;
        for (size_t j = 0; j < K; j++) scale = std::max(scale, std::fabs(sample[t * K + j]));
        for (size_t j = 0; j < K; j++) {
            const float err = std::fabs(out->logits[indices[j]] - sample[t * K + j]);
            worst = std::max(worst, err / scale);
            ASSERT_LE(err, 1e-3f * scale) << "position " << t << " vocab " << indices[j];
        }
        if (t + 1 == T) {
            for (size_t j = 0; j < vocab; j++) ASSERT_LE(std::fabs(out->logits[j] - last[j]), 1e-3f * scale) << j;
        }
    }
    std::printf("teacher-forced: %zu positions, worst |logit error| / max|logit| = %.2e\n", T, worst);
}

TEST_F(SmolLM2, PrefillOfTheWholeSequenceMatchesTheReferenceLastRow) {
    const std::vector<int32_t> tokens = read_int_file("tokens.txt");
    const std::vector<float> last = read_floats("last_logits.bin");
    Pipeline p(model_.get(), {14}, options(tokens.size()));
    MK_ASSERT_OK(p.status());
    TailPtr out;
    MK_ASSERT_OK(p.step(tokens, &out));
    float scale = 0.0f;
    for (float v : last) scale = std::max(scale, std::fabs(v));
    for (size_t j = 0; j < last.size(); j++) ASSERT_LE(std::fabs(out->logits[j] - last[j]), 1e-3f * scale) << j;
    EXPECT_EQ(out->token_ids[0], (int32_t)(std::max_element(last.begin(), last.end()) - last.begin()));
}

TEST_F(SmolLM2, WholeTwoAndThreeRangeSplitsAreBitIdenticalOver32GreedyTokens) {
    std::ifstream f(kFixtures + "greedy.txt");
    std::vector<std::vector<int32_t>> prompts, references;
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream s(line);
        std::string tag;
        s >> tag;
        std::vector<int32_t> ids;
        int32_t x;
        while (s >> x) ids.push_back(x);
        (tag == "prompt:" ? prompts : references).push_back(ids);
    }
    ASSERT_EQ(prompts.size(), 3u);
    ASSERT_EQ(references.size(), 3u);
    const size_t n_new = 32;
    Pipeline whole(model_.get(), {}, options(64)), two(model_.get(), {14}, options(64)),
        three(model_.get(), {9, 19}, options(64));
    MK_ASSERT_OK(whole.status());
    MK_ASSERT_OK(two.status());
    MK_ASSERT_OK(three.status());
    for (size_t k = 0; k < prompts.size(); k++) {
        std::vector<int32_t> tokens[3];
        Pipeline *pipes[3] = {&whole, &two, &three};
        std::vector<std::vector<float>> whole_logits;
        for (int pi = 0; pi < 3; pi++) {
            MK_ASSERT_OK(pipes[pi]->reset());
            std::vector<int32_t> input = prompts[k];
            for (size_t i = 0; i < n_new; i++) {
                TailPtr out;
                MK_ASSERT_OK(pipes[pi]->step(input, &out));
                if (pi == 0) {
                    whole_logits.push_back(logits_of(out));
                } else {
                    ASSERT_TRUE(bit_identical(whole_logits[i], logits_of(out))) << "prompt " << k << " split " << pi << " step " << i;
                }
                tokens[pi].push_back(out->token_ids[0]);
                input = {out->token_ids[0]};
            }
        }
        EXPECT_EQ(tokens[0], tokens[1]);
        EXPECT_EQ(tokens[0], tokens[2]);
        // And the independent float64 implementation generated the same 32 tokens.
        EXPECT_EQ(tokens[0], references[k]) << "prompt " << k;
    }
}

TEST_F(SmolLM2, RangesHoldOnlyTheirShareOfWeights) {
    Pipeline whole(model_.get(), {}, options(16)), split(model_.get(), {14}, options(16));
    MK_ASSERT_OK(whole.status());
    MK_ASSERT_OK(split.status());
    const mk_hparams &hp = *mk_model_hparams(model_.get());
    const size_t full = mk_range_weight_bytes(whole.range(0));
    const size_t head = mk_range_weight_bytes(split.range(0)), tail = mk_range_weight_bytes(split.range(1));
    const size_t embd = hp.vocab * hp.hidden * sizeof(float);
    std::printf("resident weights: full %.1f MiB, head [0-14] %.1f MiB, tail [15-29] %.1f MiB (embedding %.1f MiB each)\n",
                full / 1048576.0, head / 1048576.0, tail / 1048576.0, embd / 1048576.0);
    // Tied embeddings: the head embeds and the tail projects with the same table, so
    // both hold it; the layers are split evenly and nothing else is duplicated.
    ASSERT_TRUE(hp.tied_embeddings);
    EXPECT_EQ(head + tail, full + embd);
    const size_t layers_full = full - embd;
    EXPECT_NEAR((double)(head - embd), layers_full / 2.0, layers_full * 0.01);
    EXPECT_NEAR((double)(tail - embd), layers_full / 2.0, layers_full * 0.01);
}

TEST_F(SmolLM2, BundleOfAnotherWeightDtypeIsRefused) {
    mk_range_options bf16 = options(8);
    bf16.backend.weight_dtype = MK_DTYPE_BF16;
    Pipeline head_bf16(model_.get(), {14}, bf16);
    Pipeline f32(model_.get(), {14}, options(8));
    MK_ASSERT_OK(head_bf16.status());
    MK_ASSERT_OK(f32.status());
    mk_sequence *hs = nullptr, *ts = nullptr;
    MK_ASSERT_OK(mk_sequence_open(head_bf16.range(0), &hs));
    MK_ASSERT_OK(mk_sequence_open(f32.range(1), &ts));
    SequencePtr h(hs), t(ts);
    const int32_t ids[] = {1, 4093};
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(head_bf16.range(0), hs, ids, 2, nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    mk_tail_output *out = nullptr;
    EXPECT_ERROR(mk_range_forward(f32.range(1), ts, nullptr, 0, bundle.get(), nullptr, nullptr, &out), MK_ERR_RECIPE_DIGEST,
                 "does not match this range's");
    EXPECT_EQ(out, nullptr);
}

// Native weight mode (Q4_1 and Q8_0 kept as stored, 8-bit activations): teacher-forced
// agreement with the float64 reference at >= 97% of positions, logit error reported.
TEST_F(SmolLM2, NativeWeightsTeacherForcedAgreeWithIndependentReference) {
    const std::vector<int32_t> tokens = read_int_file("tokens.txt");
    const std::vector<int32_t> argmax = read_int_file("argmax.txt");
    const std::vector<int32_t> indices = read_int_file("indices.txt");
    const std::vector<float> sample = read_floats("logits_sample.bin");
    const size_t T = tokens.size(), K = indices.size();
    ASSERT_GE(T, 64u);
    ASSERT_EQ(sample.size(), T * K);
    mk_range_options o = options(T);
    o.backend.weight_dtype = MK_DTYPE_NATIVE;
    Pipeline p(model_.get(), {}, o);
    MK_ASSERT_OK(p.status());
    size_t agree = 0;
    float worst = 0.0f;
    double mean = 0.0;
    for (size_t t = 0; t < T; t++) {
        TailPtr out;
        MK_ASSERT_OK(p.step({tokens[t]}, &out));
        agree += out->token_ids[0] == argmax[t];
        float scale = 0.0f;
        for (size_t j = 0; j < K; j++) scale = std::max(scale, std::fabs(sample[t * K + j]));
        for (size_t j = 0; j < K; j++) {
            const float err = std::fabs(out->logits[indices[j]] - sample[t * K + j]) / scale;
            worst = std::max(worst, err);
            mean += err;
        }
    }
    std::printf("native teacher-forced: argmax agrees at %zu/%zu positions; |logit error| / max|logit|: worst %.2e, "
                "mean %.2e\n", agree, T, worst, mean / (double)(T * K));
    EXPECT_GE((double)agree, 0.97 * (double)T);
    EXPECT_LT(worst, 0.1f); // 8-bit activations: a few percent at most, never garbage
}

// Native mode: whole, 2-range and 3-range splits and 1, 2, 3 threads give the same bits
// (prefill then KV-cached decode).
TEST_F(SmolLM2, NativeWeightsSplitAndThreadCountAreBitIdentical) {
    const std::vector<int32_t> prompt = {1, 4093, 198, 57, 8316, 260, 3371};
    mk_range_options o = options(24);
    o.backend.weight_dtype = MK_DTYPE_NATIVE;
    o.backend.threads = 2;
    const Decode whole = decode_greedy(model_.get(), {}, o, prompt, 6);
    ASSERT_EQ(whole.logits.size(), 6u);
    for (const std::vector<int64_t> &cuts : std::vector<std::vector<int64_t>>{{14}, {9, 19}}) {
        const Decode split = decode_greedy(model_.get(), cuts, o, prompt, 6);
        ASSERT_EQ(split.logits.size(), 6u);
        for (size_t i = 0; i < 6; i++) EXPECT_TRUE(bit_identical(whole.logits[i], split.logits[i])) << cuts[0] << " step " << i;
    }
    for (size_t threads : {1u, 3u}) {
        o.backend.threads = threads;
        const Decode other = decode_greedy(model_.get(), {14}, o, prompt, 6);
        ASSERT_EQ(other.logits.size(), 6u);
        for (size_t i = 0; i < 6; i++) EXPECT_TRUE(bit_identical(whole.logits[i], other.logits[i])) << threads << " threads, step " << i;
    }
    // The native weights are what the file stores: Q4_1 layers and a Q8_0 table, well
    // under a third of the F32 footprint.
    Pipeline native(model_.get(), {}, o), f32(model_.get(), {}, options(8));
    MK_ASSERT_OK(native.status());
    MK_ASSERT_OK(f32.status());
    const size_t nb = mk_range_weight_bytes(native.range(0)), fb = mk_range_weight_bytes(f32.range(0));
    std::printf("resident weights: native %.1f MiB, f32 %.1f MiB\n", nb / 1048576.0, fb / 1048576.0);
    EXPECT_LT(nb * 5, fb);
    EXPECT_STRNE(mk_range_recipe_digest(native.range(0)), mk_range_recipe_digest(f32.range(0)));
}

// A GGUF whose general.architecture is not certified fails closed before any weight.
TEST(GgufModel, UncertifiedArchitectureFailsClosed) {
    std::vector<uint8_t> file;
    auto put = [&](const void *p, size_t n) { file.insert(file.end(), (const uint8_t *)p, (const uint8_t *)p + n); };
    auto put_u32 = [&](uint32_t v) { put(&v, 4); };
    auto put_u64 = [&](uint64_t v) { put(&v, 8); };
    auto put_str = [&](const std::string &s) { put_u64(s.size()); put(s.data(), s.size()); };
    put("GGUF", 4);
    put_u32(3);
    put_u64(0);  // tensors
    put_u64(1);  // kv pairs
    put_str("general.architecture");
    put_u32(8);  // string
    put_str("qwen3");
    char path[] = "/tmp/mk_qwen3_XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    FILE *out = fdopen(fd, "wb");
    ASSERT_EQ(std::fwrite(file.data(), 1, file.size(), out), file.size());
    std::fclose(out);
    mk_model *m = nullptr;
    EXPECT_ERROR(mk_model_open_gguf(path, &m), MK_ERR_UNCERTIFIED_ARCHITECTURE, "uncertified architecture 'qwen3'");
    EXPECT_EQ(m, nullptr);
    std::remove(path);
    EXPECT_ERROR(mk_model_open_gguf("/nonexistent/model.gguf", &m), MK_ERR_IO, "cannot open '/nonexistent/model.gguf'");
}

}  // namespace
