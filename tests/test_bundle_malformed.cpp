// Malformed bundles: every way the wire can lie gets a distinct status and a message,
// never a crash. Mutations are made on the decoded protobuf message and re-packed, so
// each case breaks exactly one thing.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "meshkern.pb-c.h"
#include "mk_test_util.h"
#include "protocol/boundary.h" // mk_protocol_bundle_*: internal test helpers

namespace {

class MalformedBundle : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = make_random_model(mk_hparams_seed_default());
        mk_range *h = nullptr, *t = nullptr;
        MK_ASSERT_OK(mk_range_create(model_.get(), 0, 2, nullptr, &h));
        MK_ASSERT_OK(mk_range_create(model_.get(), 3, 5, nullptr, &t));
        head_.reset(h);
        tail_.reset(t);
        mk_sequence *s = nullptr;
        MK_ASSERT_OK(mk_sequence_open(head_.get(), &s));
        SequencePtr seq(s);
        const int32_t ids[] = {3, 1, 4};
        mk_bundle *b = nullptr;
        MK_ASSERT_OK(mk_range_forward(head_.get(), s, ids, 3, nullptr, nullptr, &b, nullptr));
        BundlePtr bundle(b);
        uint8_t *bytes = nullptr;
        size_t len = 0;
        MK_ASSERT_OK(mk_bundle_pack(bundle.get(), &bytes, &len));
        valid_.assign(bytes, bytes + len);
        mk_buffer_free(bytes);
    }

    // Decode the valid bytes, apply `mutate`, re-encode.
    std::vector<uint8_t> mutated(const std::function<void(Meshkern__V1__TensorBundle *)> &mutate) {
        Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(nullptr, valid_.size(), valid_.data());
        EXPECT_NE(msg, nullptr);
        mutate(msg);
        std::vector<uint8_t> out(meshkern__v1__tensor_bundle__get_packed_size(msg));
        meshkern__v1__tensor_bundle__pack(msg, out.data());
        mutate(msg);  // undo swaps (value edits repeated are harmless to free)
        meshkern__v1__tensor_bundle__free_unpacked(msg, nullptr);
        return out;
    }

    mk_status unpack(const std::vector<uint8_t> &bytes, std::string *message = nullptr) {
        mk_bundle *b = nullptr;
        const mk_status s = mk_bundle_unpack(bytes.data(), bytes.size(), &b);
        if (message) *message = mk_last_error();
        if (s == MK_OK) EXPECT_NE(b, nullptr);
        else EXPECT_EQ(b, nullptr);
        mk_bundle_free(b);
        return s;
    }

    // Unpack (must succeed) and hand to the tail range.
    mk_status accept(const std::vector<uint8_t> &bytes, std::string *message) {
        mk_bundle *b = nullptr;
        const mk_status us = mk_bundle_unpack(bytes.data(), bytes.size(), &b);
        EXPECT_EQ(us, MK_OK) << mk_last_error();
        if (us != MK_OK) return us;
        BundlePtr bundle(b);
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(tail_.get(), &s), MK_OK);
        SequencePtr seq(s);
        mk_tail_output *t = nullptr;
        const mk_status st = mk_range_forward(tail_.get(), s, nullptr, 0, bundle.get(), nullptr, nullptr, &t);
        *message = mk_last_error();
        mk_tail_output_free(t);
        return st;
    }

    ModelPtr model_;
    RangePtr head_, tail_;
    std::vector<uint8_t> valid_;
};

// Values swapped into a decoded message. A mutation that swaps is its own inverse, so
// mutated() applies it a second time after packing and the message frees what it owns.
char kEmpty[] = "";
char *kEmptyPtr = kEmpty;
size_t kZero = 0;
Meshkern__V1__Tensor *kNullTensor = nullptr;
uint64_t kShape[4];
uint64_t *kShapePtr = kShape;

TEST_F(MalformedBundle, ValidBundleIsAccepted) {
    EXPECT_EQ(unpack(valid_), MK_OK);
    std::string msg;
    EXPECT_EQ(accept(valid_, &msg), MK_OK) << msg;
}

TEST_F(MalformedBundle, TruncatedBytesAreRefusedAtEveryLength) {
    std::set<mk_status> seen;
    for (size_t len = 0; len < valid_.size(); len++) {
        std::vector<uint8_t> prefix(valid_.begin(), valid_.begin() + (long)len);
        std::string msg;
        const mk_status s = unpack(prefix, &msg);
        ASSERT_NE(s, MK_OK) << "prefix of " << len << " bytes was accepted";
        ASSERT_TRUE(msg.find("bundle") != std::string::npos || msg.find("tensor") != std::string::npos) << msg;
        seen.insert(s);
    }
    EXPECT_TRUE(seen.count(MK_ERR_WIRE_DECODE));
}

TEST_F(MalformedBundle, EveryMissingFieldIsNamed) {
    struct Case {
        const char *field;
        std::function<void(Meshkern__V1__TensorBundle *)> drop;
    };
    const std::vector<Case> cases = {
        {"schema_version", [](auto *m) { m->schema_version = 0; }},
        {"architecture", [](auto *m) { m->architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_UNSPECIFIED; }},
        {"adapter", [](auto *m) { std::swap(m->adapter, kEmptyPtr); }},
        {"boundary_point", [](auto *m) { std::swap(m->boundary_point, kEmptyPtr); }},
        {"next_layer", [](auto *m) { m->has_next_layer = 0; }},
        {"tensors", [](auto *m) { std::swap(m->n_tensors, kZero); }},
        {"positions", [](auto *m) { std::swap(m->positions, kNullTensor); }},
        {"runtime_recipe_digest", [](auto *m) { std::swap(m->runtime_recipe_digest, kEmptyPtr); }},
        {"name", [](auto *m) { std::swap(m->tensors[0]->name, kEmptyPtr); }},
        {"dtype", [](auto *m) { m->tensors[0]->dtype = MESHKERN__V1__DTYPE__DTYPE_UNSPECIFIED; }},
        {"shape", [](auto *m) { std::swap(m->tensors[0]->n_shape, kZero); }},
        {"byte_order", [](auto *m) { m->tensors[0]->byte_order = MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_UNSPECIFIED; }},
        {"data", [](auto *m) { std::swap(m->tensors[0]->data.len, kZero); }},
    };
    for (const Case &c : cases) {
        Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(nullptr, valid_.size(), valid_.data());
        ASSERT_NE(msg, nullptr);
        c.drop(msg);
        std::vector<uint8_t> bytes(meshkern__v1__tensor_bundle__get_packed_size(msg));
        meshkern__v1__tensor_bundle__pack(msg, bytes.data());
        c.drop(msg);  // swap the original back so free_unpacked frees what it allocated
        meshkern__v1__tensor_bundle__free_unpacked(msg, nullptr);
        std::string text;
        EXPECT_EQ(unpack(bytes, &text), MK_ERR_MISSING_FIELD) << c.field << ": " << text;
        EXPECT_NE(text.find(std::string("missing field ") + c.field), std::string::npos) << text;
    }
}

TEST_F(MalformedBundle, EachCorruptionHasItsOwnStatus) {
    std::map<std::string, mk_status> got;
    std::map<std::string, std::string> said;
    std::string msg;
    auto note = [&](const char *name, mk_status s) {
        got[name] = s;
        said[name] = msg;
    };
    note("data length", unpack(mutated([](auto *m) { m->tensors[0]->data.len -= 4; }), &msg));
    note("shape overflow", unpack(mutated([](auto *m) {
                                      kShape[0] = 1ull << 40;
                                      kShape[1] = 1ull << 40;
                                      kShape[2] = 32;
                                      std::swap(m->tensors[0]->shape, kShapePtr);
                                  }),
                                  &msg));
    note("schema version", unpack(mutated([](auto *m) { m->schema_version = 2; }), &msg));
    note("positions shape", unpack(mutated([](auto *m) { m->positions->shape[1] = 2; m->positions->data.len = 8; }), &msg));
    note("dtype", unpack(mutated([](auto *m) { m->tensors[0]->dtype = (Meshkern__V1__DType)99; }), &msg));
    note("byte order", unpack(mutated([](auto *m) { m->tensors[0]->byte_order = MESHKERN__V1__BYTE_ORDER__BYTE_ORDER_BIG; }), &msg));
    note("rank", unpack(mutated([](auto *m) { m->tensors[0]->n_shape = 2; m->tensors[0]->shape[1] *= 32; }), &msg));
    note("tensor name", unpack(mutated([](auto *m) { m->tensors[0]->name[0] = 'X'; }), &msg));
    note("boundary point", unpack(mutated([](auto *m) { m->boundary_point[0] = 'X'; }), &msg));
    note("architecture kind", unpack(mutated([](auto *m) { m->architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MOE; }), &msg));
    note("uncertified adapter", unpack(mutated([](auto *m) { m->adapter[0] = 'X'; }), &msg));
    note("random bytes", unpack(std::vector<uint8_t>{0xff, 0xff, 0xff, 0xff, 0x0f, 0x12}, &msg));
    // Model-dependent checks happen when the tail accepts the bundle.
    note("recipe digest", accept(mutated([](auto *m) { m->runtime_recipe_digest[0] = m->runtime_recipe_digest[0] == 'a' ? 'b' : 'a'; }), &msg));
    note("hidden width", accept(mutated([](auto *m) {
                                    m->tensors[0]->shape[2] = 16;
                                    m->tensors[0]->data.len /= 2;
                                }),
                                &msg));
    note("seam", accept(mutated([](auto *m) { m->next_layer = 2; }), &msg));

    // Each its own status, and a message that names the problem.
    const std::map<std::string, std::pair<mk_status, const char *>> expected = {
        {"data length", {MK_ERR_DATA_LENGTH, "data bytes but its shape and dtype need"}},
        {"shape overflow", {MK_ERR_SHAPE_OVERFLOW, "shape overflows at dimension"}},
        {"schema version", {MK_ERR_SCHEMA_VERSION, "schema version 2"}},
        {"positions shape", {MK_ERR_POSITIONS_SHAPE, "positions"}},
        {"dtype", {MK_ERR_DTYPE, "unknown dtype 99"}},
        {"byte order", {MK_ERR_BYTE_ORDER, "byte order"}},
        {"rank", {MK_ERR_SHAPE, "rank 2, expected 3"}},
        {"tensor name", {MK_ERR_TENSOR_NAME, "expected 'residual_stream'"}},
        {"boundary point", {MK_ERR_BOUNDARY_POINT, "incompatible dense residual boundary schema"}},
        {"architecture kind", {MK_ERR_ARCHITECTURE_MISMATCH, "not executable"}},
        {"uncertified adapter", {MK_ERR_UNCERTIFIED_ARCHITECTURE, "uncertified architecture 'Xense-llama'"}},
        {"random bytes", {MK_ERR_WIRE_DECODE, "not a valid TensorBundle message"}},
        {"recipe digest", {MK_ERR_RECIPE_DIGEST, "recipe digest"}},
        {"hidden width", {MK_ERR_HIDDEN_WIDTH, "hidden width 16"}},
        {"seam", {MK_ERR_SEAM_MISMATCH, "starts at layer"}},
    };
    std::set<mk_status> distinct;
    for (const auto &[name, want] : expected) {
        EXPECT_EQ(got[name], want.first) << name << " gave " << mk_status_name(got[name]) << ": " << said[name];
        EXPECT_NE(said[name].find(want.second), std::string::npos)
            << name << ": message '" << said[name] << "' does not name '" << want.second << "'";
        distinct.insert(want.first);
    }
    EXPECT_EQ(distinct.size(), expected.size());
}

// A tensor's rank is bounded before its dimensions are read into a fixed array: one past the
// bound (9 of 8) is refused by the bound; the bound itself is read whole (eight ones: 4 bytes
// of data needed, the 384 there refused by the length check).
uint64_t kOnes[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
uint64_t *kOnesPtr = kOnes;
size_t kNine = 9, kEight = 8;

TEST_F(MalformedBundle, ARankPastTheBoundIsRefusedBeforeItsDimensionsAreRead) {
    std::string msg;
    EXPECT_EQ(unpack(mutated([](auto *m) {
                  std::swap(m->tensors[0]->shape, kOnesPtr);
                  std::swap(m->tensors[0]->n_shape, kNine);
              }),
                     &msg),
              MK_ERR_SHAPE);
    EXPECT_NE(msg.find("rank 9 exceeds 8"), std::string::npos) << msg;
    EXPECT_EQ(unpack(mutated([](auto *m) {
                  std::swap(m->tensors[0]->shape, kOnesPtr);
                  std::swap(m->tensors[0]->n_shape, kEight);
              }),
                     &msg),
              MK_ERR_DATA_LENGTH);
    EXPECT_NE(msg.find("shape and dtype need 4"), std::string::npos) << msg;
}

// Data bytes must be exactly what the shape and dtype need: more is refused as firmly as
// fewer (trailing bytes are not ignored).
TEST_F(MalformedBundle, DataLongerOrShorterThanItsShapeIsRefused) {
    Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(nullptr, valid_.size(), valid_.data());
    ASSERT_NE(msg, nullptr);
    const ProtobufCBinaryData original = msg->tensors[0]->data;
    for (const long extra : {4L, 1L, (long)original.len, -1L, -4L}) {
        std::vector<uint8_t> data(original.data, original.data + std::min<size_t>(original.len, original.len + extra));
        data.resize(original.len + extra, 0x3f);
        msg->tensors[0]->data.data = data.data();
        msg->tensors[0]->data.len = data.size();
        std::vector<uint8_t> bytes(meshkern__v1__tensor_bundle__get_packed_size(msg));
        meshkern__v1__tensor_bundle__pack(msg, bytes.data());
        std::string text;
        EXPECT_EQ(unpack(bytes, &text), MK_ERR_DATA_LENGTH) << extra << " bytes: " << text;
        EXPECT_NE(text.find("carries " + std::to_string(original.len + extra) + " data bytes but its shape and dtype need " +
                            std::to_string(original.len)),
                  std::string::npos)
            << text;
    }
    msg->tensors[0]->data = original;
    meshkern__v1__tensor_bundle__free_unpacked(msg, nullptr);
}

TEST_F(MalformedBundle, BundleFromAnotherModelOrDtypeIsRefusedByDigest) {
    ModelPtr other = make_random_model(mk_hparams_seed_default(), 7);
    mk_range *h = nullptr;
    MK_ASSERT_OK(mk_range_create(other.get(), 0, 2, nullptr, &h));
    RangePtr other_head(h);
    mk_range_options bf16 = mk_range_options_default();
    bf16.backend.weight_dtype = MK_DTYPE_BF16;
    MK_ASSERT_OK(mk_range_create(model_.get(), 0, 2, &bf16, &h));
    RangePtr bf16_head(h);
    for (mk_range *head : {other_head.get(), bf16_head.get()}) {
        EXPECT_STRNE(mk_range_recipe_digest(head), mk_range_recipe_digest(tail_.get()));
        mk_sequence *s = nullptr;
        MK_ASSERT_OK(mk_sequence_open(head, &s));
        SequencePtr seq(s);
        const int32_t ids[] = {1, 2};
        mk_bundle *b = nullptr;
        MK_ASSERT_OK(mk_range_forward(head, s, ids, 2, nullptr, nullptr, &b, nullptr));
        BundlePtr bundle(b);
        mk_sequence *ts = nullptr;
        MK_ASSERT_OK(mk_sequence_open(tail_.get(), &ts));
        SequencePtr tseq(ts);
        mk_tail_output *t = nullptr;
        EXPECT_ERROR(mk_range_forward(tail_.get(), ts, nullptr, 0, bundle.get(), nullptr, nullptr, &t), MK_ERR_RECIPE_DIGEST,
                     "recipe digest");
    }
}

TEST_F(MalformedBundle, RandomBytesAndMutationsNeverCrash) {
    std::mt19937_64 rng(1234);
    size_t refused = 0;
    for (int i = 0; i < 3000; i++) {
        std::vector<uint8_t> bytes;
        if (i % 2 == 0) {
            bytes.resize(rng() % 300);
            for (auto &b : bytes) b = (uint8_t)rng();
        } else {
            bytes = valid_;
            const int flips = 1 + (int)(rng() % 4);
            for (int f = 0; f < flips; f++) bytes[rng() % bytes.size()] ^= (uint8_t)(1u << (rng() % 8));
        }
        std::string msg;
        const mk_status s = unpack(bytes, &msg);
        if (s != MK_OK) {
            refused++;
            EXPECT_FALSE(msg.empty());
        }
    }
    EXPECT_GT(refused, 1500u);
}

// ---------------------------------------------------- protocol-level kinds ---

TEST(ProtocolBundles, MoeAndMlaAreValidatedButNotExecutable) {
    const std::vector<float> hidden(24, 0.5f), router(8, 0.25f), mla(6, 1.5f);
    struct Kind {
        mk_protocol_arch arch;
        std::vector<mk_named_payload> full;
        const char *second;
    };
    const std::vector<Kind> kinds = {
        {MK_PROTOCOL_ARCH_MOE, {{"hidden_states", hidden.data(), 24}, {"router_logits", router.data(), 8}}, "router_logits"},
        {MK_PROTOCOL_ARCH_MLA, {{"hidden_states", hidden.data(), 24}, {"mla_position_state", mla.data(), 6}}, "mla_position_state"},
    };
    for (const Kind &k : kinds) {
        uint8_t *bytes = nullptr;
        size_t len = 0;
        MK_ASSERT_OK(mk_protocol_bundle_pack(k.arch, k.full.data(), k.full.size(), &bytes, &len));
        BufferPtr hold(bytes);
        mk_protocol_arch arch;
        MK_ASSERT_OK(mk_protocol_bundle_validate(bytes, len, &arch));
        EXPECT_EQ(arch, k.arch);
        mk_bundle *b = nullptr;
        EXPECT_ERROR(mk_bundle_unpack(bytes, len, &b), MK_ERR_ARCHITECTURE_MISMATCH, "not executable");
        // Missing the second required tensor is refused when packing.
        EXPECT_ERROR(mk_protocol_bundle_pack(k.arch, k.full.data(), 1, &bytes, &len), MK_ERR_REQUIRED_TENSORS, k.second);
    }
    const char *names[] = {"hidden_states"};
    EXPECT_ERROR(mk_protocol_check_tensors(MK_PROTOCOL_ARCH_MOE, names, 1), MK_ERR_REQUIRED_TENSORS,
                 "moe boundary requires tensor 'router_logits'");
}

TEST(ProtocolBundles, PayloadCountWhoseByteSizeOverflowsIsRefused) {
    const float data[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    // count * sizeof(float) wraps to 8 bytes: the shape would claim far more than is packed.
    const mk_named_payload payloads[] = {{"hidden_states", data, SIZE_MAX / sizeof(float) + 3},
                                         {"router_logits", data, 1}};
    uint8_t *bytes = nullptr;
    size_t len = 0;
    EXPECT_ERROR(mk_protocol_bundle_pack(MK_PROTOCOL_ARCH_MOE, payloads, 2, &bytes, &len), MK_ERR_SHAPE_OVERFLOW,
                 "payload 'hidden_states' of");
    EXPECT_EQ(bytes, nullptr);
    mk_buffer_free(bytes);
}

// ------------------------------------------------------------- tail result ---

TEST(TailResult, TokenAndLogitsOutputsRoundTrip) {
    const mk_request_identity id = {"req-1", "ab12", "chatml", "1", "off", MK_PROTOCOL_ARCH_DENSE};
    const mk_sampling_params greedy = {0.0f, 1.0f, 0, 42};
    uint8_t *bytes = nullptr;
    size_t len = 0;
    MK_ASSERT_OK(mk_tail_result_pack_token(&id, &greedy, 17, &bytes, &len));
    mk_tail_result_info info;
    MK_ASSERT_OK(mk_tail_result_validate(bytes, len, &info));
    mk_buffer_free(bytes);
    EXPECT_EQ(info.kind, MK_TAIL_OUTPUT_TOKEN);
    EXPECT_EQ(info.token_id, 17);
    EXPECT_TRUE(info.greedy);
    EXPECT_STREQ(info.request_id, "req-1");
    EXPECT_STREQ(info.runtime_recipe_digest, "ab12");

    const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, -0.5f};
    const mk_sampling_params warm = {0.7f, 0.9f, 40, 7};
    MK_ASSERT_OK(mk_tail_result_pack_logits(&id, &warm, logits.data(), 2, 3, &bytes, &len));
    MK_ASSERT_OK(mk_tail_result_validate(bytes, len, &info));
    mk_buffer_free(bytes);
    EXPECT_EQ(info.kind, MK_TAIL_OUTPUT_LOGITS);
    EXPECT_EQ(info.batch, 2u);
    EXPECT_EQ(info.vocab, 3u);
    EXPECT_FALSE(info.greedy);
}

TEST(TailResult, IdentityAndOutputAreEnforced) {
    const mk_sampling_params greedy = {0.0f, 1.0f, 0, 0};
    uint8_t *bytes = nullptr;
    size_t len = 0;
    const mk_request_identity no_request = {"", "ab12", "", "", "", MK_PROTOCOL_ARCH_DENSE};
    EXPECT_ERROR(mk_tail_result_pack_token(&no_request, &greedy, 1, &bytes, &len), MK_ERR_TAIL_RESULT,
                 "exact request and recipe identity");
    const mk_request_identity no_digest = {"r", nullptr, "", "", "", MK_PROTOCOL_ARCH_DENSE};
    EXPECT_ERROR(mk_tail_result_pack_token(&no_digest, &greedy, 1, &bytes, &len), MK_ERR_TAIL_RESULT,
                 "exact request and recipe identity");
    const mk_request_identity moe = {"r", "d", "", "", "", MK_PROTOCOL_ARCH_MOE};
    EXPECT_ERROR(mk_tail_result_pack_token(&moe, &greedy, 1, &bytes, &len), MK_ERR_TAIL_RESULT,
                 "does not match certified adapter");
    const mk_request_identity ok = {"r", "d", "", "", "", MK_PROTOCOL_ARCH_DENSE};
    EXPECT_ERROR(mk_tail_result_pack_token(&ok, &greedy, -1, &bytes, &len), MK_ERR_TAIL_RESULT, "non-negative");
    EXPECT_ERROR(mk_tail_result_pack_logits(&ok, &greedy, nullptr, 1, 3, &bytes, &len), MK_ERR_TAIL_RESULT,
                 "non-empty [batch, vocab] tensor");

    // A message with no output, and garbage bytes.
    Meshkern__V1__RequestRecipeIdentity ident = MESHKERN__V1__REQUEST_RECIPE_IDENTITY__INIT;
    ident.request_id = (char *)"r";
    ident.runtime_recipe_digest = (char *)"d";
    ident.architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE;
    Meshkern__V1__SamplingParameters sp = MESHKERN__V1__SAMPLING_PARAMETERS__INIT;
    Meshkern__V1__TailResult msg = MESHKERN__V1__TAIL_RESULT__INIT;
    msg.identity = &ident;
    msg.sampling = &sp;
    std::vector<uint8_t> buf(meshkern__v1__tail_result__get_packed_size(&msg));
    meshkern__v1__tail_result__pack(&msg, buf.data());
    EXPECT_ERROR(mk_tail_result_validate(buf.data(), buf.size(), nullptr), MK_ERR_TAIL_RESULT, "carries no output");
    msg.identity = nullptr;
    buf.resize(meshkern__v1__tail_result__get_packed_size(&msg));
    meshkern__v1__tail_result__pack(&msg, buf.data());
    EXPECT_ERROR(mk_tail_result_validate(buf.data(), buf.size(), nullptr), MK_ERR_MISSING_FIELD, "missing field identity");
    const uint8_t junk[] = {0x0a, 0xff, 0x01};
    EXPECT_ERROR(mk_tail_result_validate(junk, sizeof junk, nullptr), MK_ERR_WIRE_DECODE, "not a valid TailResult message");
}

// The exact identity fits the info or is refused, at its edge: a request id of 127 bytes
// (the info's 128 less the terminator) and a recipe digest of 64 come back whole; one byte
// more of either is refused, never truncated.
TEST(TailResult, IdentityAtTheInfoCapacityRoundTripsAndOneByteMoreIsRefused) {
    const mk_sampling_params greedy = {0.0f, 1.0f, 0, 0};
    mk_tail_result_info info;
    const std::string request(sizeof info.request_id - 1, 'q'), digest(sizeof info.runtime_recipe_digest - 1, 'd');
    uint8_t *bytes = nullptr;
    size_t len = 0;
    const mk_request_identity fits = {request.c_str(), digest.c_str(), "", "", "", MK_PROTOCOL_ARCH_DENSE};
    MK_ASSERT_OK(mk_tail_result_pack_token(&fits, &greedy, 5, &bytes, &len));
    MK_ASSERT_OK(mk_tail_result_validate(bytes, len, &info));
    mk_buffer_free(bytes);
    EXPECT_EQ(std::string(info.request_id), request);
    EXPECT_EQ(std::string(info.runtime_recipe_digest), digest);
    const std::string request_over = request + "q", digest_over = digest + "d";
    const mk_request_identity long_request = {request_over.c_str(), digest.c_str(), "", "", "", MK_PROTOCOL_ARCH_DENSE};
    bytes = nullptr;
    EXPECT_ERROR(mk_tail_result_pack_token(&long_request, &greedy, 5, &bytes, &len), MK_ERR_TAIL_RESULT,
                 "request id or recipe digest is too long (128 / 64 bytes)");
    EXPECT_EQ(bytes, nullptr);
    const mk_request_identity long_digest = {request.c_str(), digest_over.c_str(), "", "", "", MK_PROTOCOL_ARCH_DENSE};
    EXPECT_ERROR(mk_tail_result_pack_token(&long_digest, &greedy, 5, &bytes, &len), MK_ERR_TAIL_RESULT,
                 "request id or recipe digest is too long (127 / 65 bytes)");
    EXPECT_EQ(bytes, nullptr);
}

// A received token output is checked as a sent one is: a negative token id is refused.
TEST(TailResult, NegativeTokenIdIsRefusedOnReceipt) {
    Meshkern__V1__RequestRecipeIdentity ident = MESHKERN__V1__REQUEST_RECIPE_IDENTITY__INIT;
    ident.request_id = (char *)"r";
    ident.runtime_recipe_digest = (char *)"d";
    ident.architecture = MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE;
    Meshkern__V1__SamplingParameters sp = MESHKERN__V1__SAMPLING_PARAMETERS__INIT;
    Meshkern__V1__TailResult msg = MESHKERN__V1__TAIL_RESULT__INIT;
    msg.identity = &ident;
    msg.sampling = &sp;
    msg.output_case = MESHKERN__V1__TAIL_RESULT__OUTPUT_SAMPLED_TOKEN_ID;
    for (const int64_t id : {int64_t(-1), int64_t(-7), INT64_MIN, int64_t(0), int64_t(3)}) {
        msg.sampled_token_id = id;
        std::vector<uint8_t> buf(meshkern__v1__tail_result__get_packed_size(&msg));
        meshkern__v1__tail_result__pack(&msg, buf.data());
        mk_tail_result_info info;
        if (id < 0) {
            EXPECT_ERROR(mk_tail_result_validate(buf.data(), buf.size(), &info), MK_ERR_TAIL_RESULT,
                         "sampled token id must be non-negative")
                << id;
        } else {
            EXPECT_EQ(mk_tail_result_validate(buf.data(), buf.size(), &info), MK_OK) << id << ": " << mk_last_error();
            EXPECT_EQ(info.token_id, id);
        }
    }
}

// A received TailResult's logits bundle is validated before it is trusted: another schema,
// a non-dense architecture or another request's / recipe's logits are refused, and an
// identity that does not fit is refused rather than silently truncated.
TEST(TailResult, LogitsBundleAndIdentityAreValidatedOnReceipt) {
    const mk_request_identity id = {"req-1", "ab12", "chatml", "1", "off", MK_PROTOCOL_ARCH_DENSE};
    const mk_sampling_params greedy = {0.0f, 1.0f, 0, 42};
    const std::vector<float> logits = {0.5f, -1.0f, 2.0f};
    uint8_t *bytes = nullptr;
    size_t len = 0;
    MK_ASSERT_OK(mk_tail_result_pack_logits(&id, &greedy, logits.data(), 1, 3, &bytes, &len));
    const std::vector<uint8_t> valid(bytes, bytes + len);
    mk_buffer_free(bytes);
    MK_ASSERT_OK(mk_tail_result_validate(valid.data(), valid.size(), nullptr));

    char other[] = "someone-else";
    char *other_ptr = other;
    std::string long_id(200, 'r');
    char *long_ptr = long_id.data();
    struct Case {
        const char *what;
        mk_status expected;
        const char *needle;
        std::function<void(Meshkern__V1__TailResult *)> swap;  // its own inverse
    };
    const std::vector<Case> cases = {
        {"schema version", MK_ERR_SCHEMA_VERSION, "logits bundle schema version", [](auto *m) { m->logits->schema_version ^= 6u; }},
        {"architecture", MK_ERR_TAIL_RESULT, "logits bundle architecture does not match",
         [](auto *m) {
             m->logits->architecture = m->logits->architecture == MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MOE
                                           ? MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_DENSE
                                           : MESHKERN__V1__ARCHITECTURE_TYPE__ARCHITECTURE_TYPE_MOE;
         }},
        {"recipe digest", MK_ERR_TAIL_RESULT, "logits bundle identity does not match", [&](auto *m) { std::swap(m->logits->runtime_recipe_digest, other_ptr); }},
        {"request id", MK_ERR_TAIL_RESULT, "logits bundle identity does not match", [&](auto *m) { std::swap(m->logits->request_id, other_ptr); }},
        {"long request id", MK_ERR_TAIL_RESULT, "is too long", nullptr},  // set below, on both messages
    };
    for (const Case &c : cases) {
        Meshkern__V1__TailResult *msg = meshkern__v1__tail_result__unpack(nullptr, valid.size(), valid.data());
        ASSERT_NE(msg, nullptr);
        ASSERT_EQ(msg->output_case, MESHKERN__V1__TAIL_RESULT__OUTPUT_LOGITS);
        std::vector<uint8_t> buf;
        if (!c.swap) {
            // Both the identity and the bundle carry the same over-long id.
            char *saved_id = msg->identity->request_id, *saved_b = msg->logits->request_id;
            msg->identity->request_id = long_ptr;
            msg->logits->request_id = long_ptr;
            buf.resize(meshkern__v1__tail_result__get_packed_size(msg));
            meshkern__v1__tail_result__pack(msg, buf.data());
            msg->identity->request_id = saved_id;
            msg->logits->request_id = saved_b;
        } else {
            c.swap(msg);
            buf.resize(meshkern__v1__tail_result__get_packed_size(msg));
            meshkern__v1__tail_result__pack(msg, buf.data());
            c.swap(msg);
        }
        meshkern__v1__tail_result__free_unpacked(msg, nullptr);
        mk_tail_result_info info;
        EXPECT_ERROR(mk_tail_result_validate(buf.data(), buf.size(), &info), c.expected, c.needle) << c.what;
    }
}

}  // namespace
