// The seed's boundary-adapter parity suite (shared/reference/test_boundary_adapter_parity.py),
// ported test by test: same cases, same error wording. Parity here is bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "mk_test_util.h"
#include "model/model.h"

namespace {

TailPtr whole_model_next_token(const mk_model *model, const std::vector<int32_t> &tokens) {
    Pipeline p(model, {});
    EXPECT_EQ(p.status(), MK_OK) << mk_last_error();
    TailPtr out;
    EXPECT_EQ(p.step(tokens, &out), MK_OK) << mk_last_error();
    return out;
}

TailPtr split_next_token(const mk_model *model, const std::vector<int32_t> &tokens, const std::vector<int64_t> &cuts) {
    Pipeline p(model, cuts);
    EXPECT_EQ(p.status(), MK_OK) << mk_last_error();
    TailPtr out;
    EXPECT_EQ(p.step(tokens, &out), MK_OK) << mk_last_error();
    return out;
}

// Full recomputation each step, as the reference does.
std::vector<int32_t> greedy_generate_recompute(const mk_model *model, const std::vector<int64_t> &cuts,
                                               std::vector<int32_t> prompt, int n_new) {
    std::vector<int32_t> generated;
    for (int i = 0; i < n_new; i++) {
        TailPtr out = cuts.empty() ? whole_model_next_token(model, prompt) : split_next_token(model, prompt, cuts);
        if (!out) return generated;
        prompt.push_back(out->token_ids[0]);
        generated.push_back(out->token_ids[0]);
    }
    return generated;
}

RangePtr make_range(const mk_model *model, int64_t start, int64_t end, const char *arch = nullptr) {
    mk_range_options opt = mk_range_options_default();
    opt.architecture = arch;
    mk_range *r = nullptr;
    EXPECT_EQ(mk_range_create(model, start, end, &opt, &r), MK_OK) << mk_last_error();
    return RangePtr(r);
}

BundlePtr head_forward(mk_range *head, const std::vector<int32_t> &tokens) {
    mk_sequence *s = nullptr;
    EXPECT_EQ(mk_sequence_open(head, &s), MK_OK);
    SequencePtr seq(s);
    mk_bundle *b = nullptr;
    EXPECT_EQ(mk_range_forward(head, seq.get(), tokens.data(), tokens.size(), nullptr, nullptr, &b, nullptr), MK_OK)
        << mk_last_error();
    return BundlePtr(b);
}

// Forward of a fresh sequence of `range` with a bundle; returns the status and message.
mk_status forward_bundle(mk_range *range, const mk_bundle *bundle, std::string *message) {
    mk_sequence *s = nullptr;
    EXPECT_EQ(mk_sequence_open(range, &s), MK_OK);
    SequencePtr seq(s);
    mk_bundle *out_b = nullptr;
    mk_tail_output *out_t = nullptr;
    const mk_status st = mk_range_forward(range, seq.get(), nullptr, 0, bundle, nullptr, &out_b, &out_t);
    *message = mk_last_error();
    mk_bundle_free(out_b);
    mk_tail_output_free(out_t);
    return st;
}

// ------------------------------------------------------------ certification ---

TEST(Certification, DenseLlamaAndAliasesAreCertified) {
    for (const char *name : {"dense-llama", "llama", "LlamaForCausalLM", "LlamaModel"}) {
        mk_architecture arch;
        MK_ASSERT_OK(mk_certified_architecture(name, &arch));
        EXPECT_STREQ(arch.adapter, "dense-llama");
        EXPECT_STREQ(arch.boundary_tensor_name, "residual_stream");
        EXPECT_TRUE(mk_is_certified_architecture(name));
    }
}

class Uncertified : public ::testing::TestWithParam<const char *> {};

TEST_P(Uncertified, FailsClosed) {
    const char *name = GetParam();
    EXPECT_FALSE(mk_is_certified_architecture(name));
    mk_architecture arch;
    const std::string needle = std::string("uncertified architecture '") + (name ? name : "(null)") + "'";
    EXPECT_ERROR(mk_certified_architecture(name, &arch), MK_ERR_UNCERTIFIED_ARCHITECTURE, needle.c_str());
}

INSTANTIATE_TEST_SUITE_P(Names, Uncertified,
                         ::testing::Values("qwen3", "qwen3-moe", "mixtral", "gpt2", "", nullptr, "LLAMA", "llama "));

TEST(Certification, AdapterConstructionFailsClosedForUncertifiedBackend) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options opt = mk_range_options_default();
    opt.architecture = "qwen3-moe";
    mk_range *r = nullptr;
    EXPECT_ERROR(mk_range_create(model.get(), 0, 2, &opt, &r), MK_ERR_UNCERTIFIED_ARCHITECTURE,
                 "uncertified architecture 'qwen3-moe'");
    EXPECT_EQ(r, nullptr);
    // A model that itself advertises an uncertified architecture fails the same way.
    ModelPtr qwen = make_random_model(mk_hparams_seed_default(), 1, "qwen3");
    EXPECT_ERROR(mk_range_create(qwen.get(), 0, 2, nullptr, &r), MK_ERR_UNCERTIFIED_ARCHITECTURE,
                 "uncertified architecture 'qwen3'");
}

// --------------------------------------------------------------------- roles ---

TEST(Roles, Classification) {
    mk_role role;
    MK_ASSERT_OK(mk_role_for_range(0, 2, 6, &role));
    EXPECT_EQ(role, MK_ROLE_HEAD);
    MK_ASSERT_OK(mk_role_for_range(2, 3, 6, &role));
    EXPECT_EQ(role, MK_ROLE_MIDDLE);
    MK_ASSERT_OK(mk_role_for_range(4, 5, 6, &role));
    EXPECT_EQ(role, MK_ROLE_TAIL);
    MK_ASSERT_OK(mk_role_for_range(0, 5, 6, &role));
    EXPECT_EQ(role, MK_ROLE_FULL);
    EXPECT_TRUE(mk_role_owns_embedding(MK_ROLE_HEAD));
    EXPECT_FALSE(mk_role_owns_final_head(MK_ROLE_HEAD));
    EXPECT_TRUE(mk_role_owns_final_head(MK_ROLE_TAIL));
    EXPECT_FALSE(mk_role_owns_embedding(MK_ROLE_TAIL));
    EXPECT_TRUE(mk_role_owns_embedding(MK_ROLE_FULL) && mk_role_owns_final_head(MK_ROLE_FULL));
    EXPECT_FALSE(mk_role_owns_embedding(MK_ROLE_MIDDLE) || mk_role_owns_final_head(MK_ROLE_MIDDLE));
}

TEST(Roles, InvalidRangesAreRefused) {
    mk_role role;
    EXPECT_ERROR(mk_role_for_range(-1, 2, 6, &role), MK_ERR_INVALID_RANGE, "[-1, 2] is empty or inverted");
    EXPECT_ERROR(mk_role_for_range(3, 2, 6, &role), MK_ERR_INVALID_RANGE, "[3, 2] is empty or inverted");
    EXPECT_ERROR(mk_role_for_range(4, 6, 6, &role), MK_ERR_INVALID_RANGE, "[4, 6] lies outside the model (6 layers)");
    EXPECT_ERROR(mk_role_for_range(0, 0, 0, &role), MK_ERR_INVALID_RANGE, "model has no layers");
}

// -------------------------------------------------------------- input side ---

TEST(InputSide, HeadAcceptsTokenIdsAndOwnsEmbedding) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr head = make_range(model.get(), 0, 2);
    BundlePtr bundle = head_forward(head.get(), {1, 2, 3});
    ASSERT_TRUE(bundle);
    std::string msg;
    EXPECT_EQ(forward_bundle(head.get(), bundle.get(), &msg), MK_ERR_HEAD_OWNS_EMBEDDING);
    EXPECT_NE(msg.find("head owns token embedding"), std::string::npos) << msg;
}

TEST(InputSide, MiddleAndTailBypassEmbeddingAndRequireTheBundle) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    for (auto [start, end] : {std::pair<int64_t, int64_t>{3, 5}, {2, 3}}) {
        RangePtr range = make_range(model.get(), start, end);
        mk_sequence *s = nullptr;
        MK_ASSERT_OK(mk_sequence_open(range.get(), &s));
        SequencePtr seq(s);
        const int32_t ids[] = {1, 2, 3};
        mk_bundle *b = nullptr;
        mk_tail_output *t = nullptr;
        EXPECT_ERROR(mk_range_forward(range.get(), seq.get(), ids, 3, nullptr, nullptr, &b, &t), MK_ERR_BYPASS_EMBEDDING,
                     "bypass token embedding");
        EXPECT_ERROR(mk_range_forward(range.get(), seq.get(), nullptr, 0, nullptr, nullptr, &b, &t),
                     MK_ERR_BUNDLE_REQUIRED, "must receive the named boundary bundle");
        EXPECT_EQ(b, nullptr);
        EXPECT_EQ(t, nullptr);
        EXPECT_EQ(mk_sequence_length(seq.get()), 0u);
    }
}

TEST(InputSide, BoundarySeamLayerMismatchIsRejected) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr head = make_range(model.get(), 0, 2);
    BundlePtr bundle = head_forward(head.get(), {1, 2, 3});
    ASSERT_TRUE(bundle);
    EXPECT_EQ(mk_bundle_header_of(bundle.get())->next_layer, 3);
    RangePtr wrong = make_range(model.get(), 4, 5);
    std::string msg;
    EXPECT_EQ(forward_bundle(wrong.get(), bundle.get(), &msg), MK_ERR_SEAM_MISMATCH);
    EXPECT_NE(msg.find("starts at layer 4"), std::string::npos) << msg;
    // A range that starts before the cut (it would run layers the bundle already went
    // through) is refused too, not only one that starts after it.
    RangePtr behind = make_range(model.get(), 2, 5);
    EXPECT_EQ(forward_bundle(behind.get(), bundle.get(), &msg), MK_ERR_SEAM_MISMATCH);
    EXPECT_NE(msg.find("starts at layer 2"), std::string::npos) << msg;
}

TEST(InputSide, NormalizedBundleIsRejected) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr head = make_range(model.get(), 0, 2);
    BundlePtr bundle = head_forward(head.get(), {1, 2, 3});
    ASSERT_TRUE(bundle);
    mk_bundle *copy = nullptr;
    MK_ASSERT_OK(mk_bundle_clone(bundle.get(), &copy));
    BundlePtr normalized(copy);
    mk_boundary_header marked = *mk_bundle_header_of(normalized.get());
    marked.normalized = true;
    MK_ASSERT_OK(mk_bundle_set_header(normalized.get(), &marked));
    RangePtr tail = make_range(model.get(), 3, 5);
    std::string msg;
    EXPECT_EQ(forward_bundle(tail.get(), normalized.get(), &msg), MK_ERR_NORMALIZED_BUNDLE);
    EXPECT_NE(msg.find("UNNORMALIZED"), std::string::npos) << msg;
    // The flag survives the wire, and the receiver still refuses it.
    BundlePtr received = through_wire(normalized.get());
    ASSERT_TRUE(received);
    EXPECT_TRUE(mk_bundle_header_of(received.get())->normalized);
    EXPECT_EQ(forward_bundle(tail.get(), received.get(), &msg), MK_ERR_NORMALIZED_BUNDLE);
    EXPECT_NE(msg.find("UNNORMALIZED"), std::string::npos) << msg;
}

// ------------------------------------------------------------- output side ---

// A direct computation of the residual after layers [0, n) from the CPU ops and the
// model's own tensors, independent of the executor.
std::vector<float> direct_residual(const mk_model *model, const std::vector<int32_t> &tokens, int n_layers) {
    const mk_hparams &hp = *mk_model_hparams(model);
    const size_t rows = tokens.size(), q_dim = hp.n_heads * hp.head_dim, kv_dim = hp.n_kv_heads * hp.head_dim;
    auto load = [&](const std::string &name, size_t n) {
        std::vector<float> w(n);
        EXPECT_EQ(mk_model_load_tensor(model, name.c_str(), w.data(), n), MK_OK) << mk_last_error();
        return w;
    };
    std::vector<float> embd = load("token_embd.weight", hp.vocab * hp.hidden);
    std::vector<float> x(rows * hp.hidden), xn(x.size()), q(rows * q_dim), k(rows * kv_dim), v(rows * kv_dim),
        att(rows * q_dim), proj(x.size()), gate(rows * hp.intermediate), up(gate.size());
    mk_cpu_embed(x.data(), embd.data(), tokens.data(), rows, hp.hidden);
    std::vector<int32_t> pos(rows);
    for (size_t i = 0; i < rows; i++) pos[i] = (int32_t)i;
    for (int l = 0; l < n_layers; l++) {
        const std::string p = "blk." + std::to_string(l) + ".";
        mk_cpu_rmsnorm(xn.data(), x.data(), load(p + "attn_norm.weight", hp.hidden).data(), rows, hp.hidden, hp.rms_eps);
        mk_cpu_matmul(q.data(), xn.data(), load(p + "attn_q.weight", q_dim * hp.hidden).data(), rows, hp.hidden, q_dim);
        mk_cpu_matmul(k.data(), xn.data(), load(p + "attn_k.weight", kv_dim * hp.hidden).data(), rows, hp.hidden, kv_dim);
        mk_cpu_matmul(v.data(), xn.data(), load(p + "attn_v.weight", kv_dim * hp.hidden).data(), rows, hp.hidden, kv_dim);
        mk_cpu_rope(q.data(), pos.data(), rows, hp.n_heads, hp.head_dim, hp.rope_theta, hp.rope_layout);
        mk_cpu_rope(k.data(), pos.data(), rows, hp.n_kv_heads, hp.head_dim, hp.rope_theta, hp.rope_layout);
        mk_cpu_attention(att.data(), q.data(), k.data(), v.data(), rows, 0, hp.n_heads, hp.n_kv_heads, hp.head_dim);
        mk_cpu_matmul(proj.data(), att.data(), load(p + "attn_output.weight", hp.hidden * q_dim).data(), rows, q_dim, hp.hidden);
        mk_cpu_add(x.data(), proj.data(), x.size());
        mk_cpu_rmsnorm(xn.data(), x.data(), load(p + "ffn_norm.weight", hp.hidden).data(), rows, hp.hidden, hp.rms_eps);
        mk_cpu_matmul(gate.data(), xn.data(), load(p + "ffn_gate.weight", hp.intermediate * hp.hidden).data(), rows, hp.hidden, hp.intermediate);
        mk_cpu_matmul(up.data(), xn.data(), load(p + "ffn_up.weight", hp.intermediate * hp.hidden).data(), rows, hp.hidden, hp.intermediate);
        mk_cpu_swiglu(gate.data(), gate.data(), up.data(), gate.size());
        mk_cpu_matmul(proj.data(), gate.data(), load(p + "ffn_down.weight", hp.hidden * hp.intermediate).data(), rows, hp.intermediate, hp.hidden);
        mk_cpu_add(x.data(), proj.data(), x.size());
    }
    return x;
}

TEST(OutputSide, NonTailEmitsUnnormalizedFullRowBoundary) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const mk_hparams &hp = *mk_model_hparams(model.get());
    const std::vector<int32_t> tokens = {3, 7, 1, 9, 2};
    RangePtr head = make_range(model.get(), 0, 2);
    BundlePtr bundle = head_forward(head.get(), tokens);
    ASSERT_TRUE(bundle);
    const mk_boundary_header *h = mk_bundle_header_of(bundle.get());
    EXPECT_FALSE(h->normalized);
    EXPECT_STREQ(h->tensor_name, "residual_stream");
    EXPECT_EQ(h->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
    EXPECT_EQ(h->next_layer, 3);
    EXPECT_EQ(h->batch, 1u);
    EXPECT_EQ(h->rows, tokens.size());
    EXPECT_EQ(h->hidden, hp.hidden);
    EXPECT_EQ(h->position, 0);
    EXPECT_EQ(h->dtype, MK_DTYPE_F32);
    for (size_t i = 0; i < tokens.size(); i++) EXPECT_EQ(mk_bundle_positions(bundle.get())[i], (int32_t)i);
    EXPECT_STREQ(h->recipe_digest, mk_range_recipe_digest(head.get()));

    const std::vector<float> direct = direct_residual(model.get(), tokens, 3);
    const std::vector<float> emitted(mk_bundle_residual(bundle.get()), mk_bundle_residual(bundle.get()) + direct.size());
    EXPECT_TRUE(bit_identical(emitted, direct));

    std::vector<float> final_ln(hp.hidden), normed(direct.size());
    MK_ASSERT_OK(mk_model_load_tensor(model.get(), "output_norm.weight", final_ln.data(), hp.hidden));
    mk_cpu_rmsnorm(normed.data(), direct.data(), final_ln.data(), tokens.size(), hp.hidden, hp.rms_eps);
    size_t far = 0;
    for (size_t i = 0; i < normed.size(); i++) far += std::fabs(normed[i] - emitted[i]) > 1e-3f;
    EXPECT_GT(far, normed.size() / 2) << "the emitted residual looks normalized";
}

TEST(OutputSide, TailEmitsPrunedLogitsThroughTheSamplingContract) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    TailPtr out = whole_model_next_token(model.get(), {4, 8, 15, 16, 23});
    ASSERT_TRUE(out);
    EXPECT_EQ(out->batch, 1u);
    EXPECT_EQ(out->vocab, 48u);
    EXPECT_EQ(out->sampling.mode, MK_SAMPLING_GREEDY);
    EXPECT_STREQ(mk_sampling_mode_name(out->sampling.mode), "greedy");
    const int32_t token = out->token_ids[0];
    ASSERT_GE(token, 0);
    ASSERT_LT(token, 48);
    for (size_t j = 0; j < out->vocab; j++) {
        EXPECT_LE(out->logits[j], out->logits[token]);
        if (out->logits[j] == out->logits[token]) {
            EXPECT_GE((int32_t)j, token);
        }
    }
}

TEST(OutputSide, SamplingContractRejectsUncertifiedModes) {
    mk_sampling_contract c;
    EXPECT_ERROR(mk_sampling_contract_from_name(&c, "top_p"), MK_ERR_UNCERTIFIED_SAMPLING, "'top_p' is not certified");
    EXPECT_ERROR(mk_sampling_contract_init(&c, MK_SAMPLING_TOP_K), MK_ERR_UNCERTIFIED_SAMPLING, "'top_k' is not certified");
    EXPECT_ERROR(mk_sampling_contract_init(&c, MK_SAMPLING_TEMPERATURE), MK_ERR_UNCERTIFIED_SAMPLING,
                 "'temperature' is not certified");
    EXPECT_ERROR(mk_sampling_contract_from_name(&c, "nucleus"), MK_ERR_UNCERTIFIED_SAMPLING,
                 "unknown sampling mode 'nucleus'");
    MK_ASSERT_OK(mk_sampling_contract_from_name(&c, "greedy"));
    EXPECT_EQ(c.mode, MK_SAMPLING_GREEDY);
    // The executor refuses an uncertified contract too.
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr full = make_range(model.get(), 0, 5);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(full.get(), &s));
    SequencePtr seq(s);
    const mk_sampling_contract top_p = {MK_SAMPLING_TOP_P};
    const int32_t ids[] = {1, 2};
    mk_tail_output *t = nullptr;
    EXPECT_ERROR(mk_range_forward(full.get(), seq.get(), ids, 2, nullptr, &top_p, nullptr, &t), MK_ERR_UNCERTIFIED_SAMPLING,
                 "top_p");
    EXPECT_EQ(t, nullptr);
}

// ---------------------------------------------------------------- parity gate ---

TEST(Parity, TwoRangePrefillMatchesWholeModel) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int32_t> prompt = {5, 12, 3, 41, 7, 19, 2, 33};
    TailPtr whole = whole_model_next_token(model.get(), prompt);
    TailPtr split = split_next_token(model.get(), prompt, {2});
    ASSERT_TRUE(whole && split);
    EXPECT_TRUE(bit_identical(logits_of(whole), logits_of(split)));
    EXPECT_EQ(whole->token_ids[0], split->token_ids[0]);
}

TEST(Parity, ThreeRangePrefillExercisesTheMiddleRole) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int32_t> prompt = {9, 1, 44, 6, 30, 11};
    TailPtr whole = whole_model_next_token(model.get(), prompt);
    TailPtr split = split_next_token(model.get(), prompt, {1, 3});
    ASSERT_TRUE(whole && split);
    EXPECT_TRUE(bit_identical(logits_of(whole), logits_of(split)));
    EXPECT_EQ(whole->token_ids[0], split->token_ids[0]);
}

TEST(Parity, TwoRangeGreedyDecodeMatchesWholeModel) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int32_t> prompt = {2, 17, 8, 25};
    const auto whole = greedy_generate_recompute(model.get(), {}, prompt, 12);
    const auto split = greedy_generate_recompute(model.get(), {2}, prompt, 12);
    EXPECT_EQ(whole, split);
    EXPECT_EQ(whole.size(), 12u);
}

TEST(Wire, BoundaryBundleRoundTripIsExact) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr head = make_range(model.get(), 0, 2);
    BundlePtr bundle = head_forward(head.get(), {1, 2, 3, 4});
    ASSERT_TRUE(bundle);
    BundlePtr restored = through_wire(bundle.get());
    ASSERT_TRUE(restored);
    const mk_boundary_header *sent = mk_bundle_header_of(bundle.get()), *got = mk_bundle_header_of(restored.get());
    const size_t n = sent->batch * sent->rows * sent->hidden;
    EXPECT_EQ(std::memcmp(mk_bundle_residual(restored.get()), mk_bundle_residual(bundle.get()), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(mk_bundle_positions(restored.get()), mk_bundle_positions(bundle.get()), sent->rows * sizeof(int32_t)), 0);
    EXPECT_EQ(got->next_layer, sent->next_layer);
    EXPECT_STREQ(got->adapter, sent->adapter);
    EXPECT_STREQ(got->recipe_digest, sent->recipe_digest);
    EXPECT_EQ(got->normalized, sent->normalized);
    EXPECT_EQ(got->step, sent->step);
    EXPECT_EQ(got->position, sent->position);

    mk_tensor_fields fields;
    MK_ASSERT_OK(mk_bundle_tensor_fields(bundle.get(), &fields));
    EXPECT_STREQ(fields.name, "residual_stream");
    ASSERT_EQ(fields.rank, 3u);
    EXPECT_EQ(fields.shape[0], 1u);
    EXPECT_EQ(fields.shape[1], 4u);
    EXPECT_EQ(fields.shape[2], 32u);
    EXPECT_EQ(fields.dtype, MK_DTYPE_F32);
    EXPECT_TRUE(std::string(fields.byte_order) == "little" || std::string(fields.byte_order) == "big");
}

TEST(Parity, AliasArchitectureStillParityMatches) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int32_t> prompt = {7, 3, 22, 5};
    TailPtr whole = whole_model_next_token(model.get(), prompt);
    RangePtr head = make_range(model.get(), 0, 2, "LlamaForCausalLM");
    BundlePtr bundle = head_forward(head.get(), prompt);
    ASSERT_TRUE(bundle);
    BundlePtr incoming = through_wire(bundle.get());
    ASSERT_TRUE(incoming);
    RangePtr tail = make_range(model.get(), 3, 5, "llama");
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(tail.get(), &s));
    SequencePtr seq(s);
    mk_tail_output *t = nullptr;
    MK_ASSERT_OK(mk_range_forward(tail.get(), seq.get(), nullptr, 0, incoming.get(), nullptr, nullptr, &t));
    TailPtr split(t);
    ASSERT_TRUE(whole);
    EXPECT_TRUE(bit_identical(logits_of(whole), logits_of(split)));
    EXPECT_EQ(whole->token_ids[0], split->token_ids[0]);
}

// ------------------------------------------------------------- random model ---

// Hyper-parameters no range could run are refused when the model is made, each by name;
// grouped-query heads that divide the heads are accepted.
TEST(RandomModel, HparamsThatCannotRunAreRefusedByName) {
    struct Case {
        const char *what;
        void (*edit)(mk_hparams &);
        const char *needle;
    };
    const Case cases[] = {
        {"kv heads not dividing the heads", [](mk_hparams &h) { h.n_kv_heads = 3; }, "4 heads are not a multiple of 3 kv heads"},
        {"more kv heads than heads", [](mk_hparams &h) { h.n_kv_heads = 8; }, "4 heads are not a multiple of 8 kv heads"},
        {"odd head_dim", [](mk_hparams &h) { h.head_dim = 7; }, "head_dim 7 must be even"},
        {"zero layers", [](mk_hparams &h) { h.n_layers = 0; }, "every size must be positive"},
    };
    for (const Case &c : cases) {
        mk_hparams hp = mk_hparams_seed_default();
        c.edit(hp);
        mk_model *m = nullptr;
        EXPECT_ERROR(mk_model_create_random(&hp, 1, nullptr, &m), MK_ERR_INVALID_ARGUMENT, c.needle) << c.what;
        EXPECT_EQ(m, nullptr) << c.what;
        mk_model_free(m);
    }
    mk_hparams gqa = mk_hparams_seed_default();
    gqa.n_kv_heads = 2;
    mk_model *m = nullptr;
    MK_ASSERT_OK(mk_model_create_random(&gqa, 1, nullptr, &m));
    mk_model_free(m);
}

// The weights come from the model's seed: the same seed gives the same bits, another seed
// other values in every tensor (matrices and norms alike).
TEST(RandomModel, WeightsFollowTheSeed) {
    const mk_hparams hp = mk_hparams_seed_default();
    ModelPtr a = make_random_model(hp, 11), again = make_random_model(hp, 11), b = make_random_model(hp, 12);
    const std::pair<const char *, size_t> tensors[] = {{"token_embd.weight", hp.vocab * hp.hidden},
                                                       {"blk.0.attn_q.weight", hp.n_heads * hp.head_dim * hp.hidden},
                                                       {"blk.5.ffn_down.weight", hp.hidden * hp.intermediate},
                                                       {"blk.2.attn_norm.weight", hp.hidden}};
    for (const auto &[name, n] : tensors) {
        std::vector<float> wa(n), wagain(n), wb(n);
        MK_ASSERT_OK(mk_model_load_tensor(a.get(), name, wa.data(), n));
        MK_ASSERT_OK(mk_model_load_tensor(again.get(), name, wagain.data(), n));
        MK_ASSERT_OK(mk_model_load_tensor(b.get(), name, wb.data(), n));
        EXPECT_TRUE(bit_identical(wa, wagain)) << name;
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) differ += wa[i] != wb[i];
        EXPECT_GT(differ, n * 9 / 10) << name << ": seeds 11 and 12 share " << n - differ << " of " << n << " values";
    }
}

// A load into a buffer of another size than the tensor's is refused, smaller or larger,
// naming both counts, and writes nothing.
TEST(RandomModel, LoadIntoABufferOfAnotherSizeIsRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    std::vector<float> buf(33, 7.0f);
    EXPECT_ERROR(mk_model_load_tensor(model.get(), "blk.1.ffn_norm.weight", buf.data(), 31), MK_ERR_SHAPE,
                 "tensor 'blk.1.ffn_norm.weight' has 32 elements, caller expected 31");
    EXPECT_ERROR(mk_model_load_tensor(model.get(), "blk.1.ffn_norm.weight", buf.data(), 33), MK_ERR_SHAPE,
                 "has 32 elements, caller expected 33");
    EXPECT_EQ(buf, std::vector<float>(33, 7.0f));
    MK_ASSERT_OK(mk_model_load_tensor(model.get(), "blk.1.ffn_norm.weight", buf.data(), 32));
    EXPECT_EQ(buf[32], 7.0f);
}

// Per-layer names exist for layers [0, n_layers) only, and only with their "blk.N." prefix.
TEST(RandomModel, TensorNamesStopAtTheLastLayer) {
    const mk_hparams hp = mk_hparams_seed_default();
    ModelPtr model = make_random_model(hp);
    const std::string last = "blk." + std::to_string(hp.n_layers - 1) + ".attn_q.weight";
    const std::string past = "blk." + std::to_string(hp.n_layers) + ".attn_q.weight";
    const std::string past_norm = "blk." + std::to_string(hp.n_layers) + ".attn_norm.weight";
    EXPECT_TRUE(mk_model_has_tensor(model.get(), last.c_str()));
    EXPECT_TRUE(mk_model_has_tensor(model.get(), "output_norm.weight"));
    for (const std::string &name : {past, past_norm, std::string("blk.-1.attn_q.weight"), std::string("attn_q.weight"),
                                    std::string("blk.0.output_norm.weight")})
        EXPECT_FALSE(mk_model_has_tensor(model.get(), name.c_str())) << name;
    std::vector<float> buf(hp.hidden);
    EXPECT_ERROR(mk_model_load_tensor(model.get(), past_norm.c_str(), buf.data(), hp.hidden), MK_ERR_GGUF_MISSING,
                 ("random model has no tensor '" + past_norm + "'").c_str());
}

}  // namespace

// ------------------------------------------------------------ option structs ---

// Option structs carry struct_size (include/meshkern.h): *_default() sets it, a struct not
// made by *_default() (struct_size 0) or from a newer header (larger) is refused, and a
// caller of an older version (smaller, but at least the first versioned layout) is served.
TEST(OptionStructs, StructSizeIsSetByDefaultAndChecked) {
    const mk_range_options d = mk_range_options_default();
    EXPECT_EQ(d.struct_size, sizeof(mk_range_options));
    EXPECT_EQ(d.backend.struct_size, sizeof(mk_backend_config));
    EXPECT_EQ(mk_backend_config_default(MK_BACKEND_CUDA).struct_size, sizeof(mk_backend_config));

    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *r = nullptr;
    mk_range_options zeroed;
    std::memset(&zeroed, 0, sizeof zeroed);
    EXPECT_ERROR(mk_range_create(model.get(), 0, 5, &zeroed, &r), MK_ERR_INVALID_ARGUMENT,
                 "mk_range_options.struct_size 0 is not a version this meshkern knows");
    EXPECT_EQ(r, nullptr);
    mk_range_options newer = mk_range_options_default();
    newer.struct_size = sizeof newer + 8;
    EXPECT_ERROR(mk_range_create(model.get(), 0, 5, &newer, &r), MK_ERR_INVALID_ARGUMENT, "start from mk_range_options_default()");
    mk_range_options no_backend_size = mk_range_options_default();
    no_backend_size.backend.struct_size = 0;
    EXPECT_ERROR(mk_range_create(model.get(), 0, 5, &no_backend_size, &r), MK_ERR_INVALID_ARGUMENT,
                 "mk_backend_config.struct_size 0");
    EXPECT_ERROR(Pipeline(model.get(), {2}, zeroed).status(), MK_ERR_INVALID_ARGUMENT, "mk_range_options.struct_size 0");

    // An older caller's struct ends after its last field (no tail padding): accepted, and
    // its fields are honoured.
    mk_range_options older = mk_range_options_default();
    older.max_context = 16;
    older.struct_size = offsetof(mk_range_options, max_batch_tokens) + sizeof(size_t);
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 5, &older, &r));
    RangePtr range(r);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(range.get(), &s));
    SequencePtr seq(s);
    std::vector<int32_t> ids(17, 3);
    mk_tail_output *t = nullptr;
    EXPECT_ERROR(mk_range_forward(range.get(), s, ids.data(), ids.size(), nullptr, nullptr, nullptr, &t),
                 MK_ERR_CONTEXT_OVERFLOW, "plus 17 rows exceeds max_context 16");
}
