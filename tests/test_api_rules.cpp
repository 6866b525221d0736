// The rules the public API keeps (include/meshkern.h), each checked through the calls
// themselves:
//   - cuts: one check and one cut -> range conversion (host/range/cuts.c) behind every
//     driver (pipeline, sched, stage), each refusal with its own status and message;
//   - struct_size: every option struct is read by its struct_size; a size this build does
//     not know (too small, too large) is refused naming the struct, an older one is taken;
//   - the thread's message: calls that cannot fail (names, getters, *_default, free
//     functions) leave it alone (tests/api_surface_check.py checks the same statically).
#include <gtest/gtest.h>

#include <cctype>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "meshkern.h"
#include "mk_test_util.h"
#include "range/range.h"
extern "C" {
#include "core/options.h"
#include "stage/stage.h"
}

namespace {

// ====================================================================== cuts ==

std::vector<mk_layer_span> spans_of(const std::vector<int64_t> &cuts, size_t n_layers, size_t max_ranges = 64) {
    std::vector<mk_layer_span> spans(cuts.size() + 1, mk_layer_span{-7, -7});
    EXPECT_EQ(mk_cuts_to_spans(cuts.data(), cuts.size(), n_layers, max_ranges, spans.data()), MK_OK) << mk_last_error();
    return spans;
}

TEST(Cuts, BecomeRangesThatCoverEveryLayerOnce) {
    const std::vector<mk_layer_span> three = spans_of({1, 3}, 6);
    ASSERT_EQ(three.size(), 3u);
    EXPECT_EQ(three[0].start, 0);
    EXPECT_EQ(three[0].end, 1);
    EXPECT_EQ(three[1].start, 2);
    EXPECT_EQ(three[1].end, 3);
    EXPECT_EQ(three[2].start, 4);
    EXPECT_EQ(three[2].end, 5);
    const std::vector<mk_layer_span> whole = spans_of({}, 6);
    EXPECT_EQ(whole[0].start, 0);
    EXPECT_EQ(whole[0].end, 5);
    // the edges: the last cut just before the last layer, a range per layer
    EXPECT_EQ(spans_of({4}, 6)[1].start, 5);
    const std::vector<mk_layer_span> each = spans_of({0, 1, 2, 3, 4}, 6);
    for (size_t i = 0; i < each.size(); i++) {
        EXPECT_EQ(each[i].start, (int64_t)i);
        EXPECT_EQ(each[i].end, (int64_t)i);
    }
    // exactly max_ranges ranges is allowed; spans may be NULL (check only)
    const int64_t two[2] = {1, 3};
    EXPECT_EQ(mk_cuts_to_spans(two, 2, 6, 3, nullptr), MK_OK) << mk_last_error();
}

// Each refusal by its own status and message, beside the edge that is accepted above.
TEST(Cuts, EachRefusalHasItsOwnStatusAndMessage) {
    mk_layer_span spans[8];
    const int64_t unsorted[2] = {3, 1};
    EXPECT_ERROR(mk_cuts_to_spans(unsorted, 2, 6, 64, spans), MK_ERR_INVALID_RANGE,
                 "cuts are not ascending: cut 1 (layer 1) follows layer 3");
    const int64_t duplicate[2] = {2, 2};
    EXPECT_ERROR(mk_cuts_to_spans(duplicate, 2, 6, 64, spans), MK_ERR_INVALID_RANGE,
                 "cut 1 repeats layer 2: range 1 would be empty");
    const int64_t last[1] = {5}, past[1] = {9}, negative[1] = {-1};
    EXPECT_ERROR(mk_cuts_to_spans(last, 1, 6, 64, spans), MK_ERR_INVALID_RANGE,
                 "cut 0 is layer 5, out of range: a cut is the last layer of a range before the last, in [0, 5)");
    EXPECT_ERROR(mk_cuts_to_spans(past, 1, 6, 64, spans), MK_ERR_INVALID_RANGE, "cut 0 is layer 9, out of range");
    EXPECT_ERROR(mk_cuts_to_spans(negative, 1, 6, 64, spans), MK_ERR_INVALID_RANGE, "cut 0 is layer -1, out of range");
    const int64_t six[6] = {0, 1, 2, 3, 4, 5};
    EXPECT_ERROR(mk_cuts_to_spans(six, 6, 6, 64, spans), MK_ERR_INVALID_ARGUMENT,
                 "6 cuts make 7 ranges: at most 6 here (6 layers, each range needs one)");
    const int64_t two[2] = {1, 3};
    EXPECT_ERROR(mk_cuts_to_spans(two, 2, 6, 2, spans), MK_ERR_INVALID_ARGUMENT,
                 "2 cuts make 3 ranges: at most 2 here");
    EXPECT_ERROR(mk_cuts_to_spans(nullptr, 1, 6, 64, spans), MK_ERR_INVALID_ARGUMENT,
                 "1 cuts given but the cut list is NULL");
    EXPECT_ERROR(mk_cuts_to_spans(nullptr, 0, 0, 64, spans), MK_ERR_INVALID_RANGE, "a model without layers");
}

// The three drivers refuse through the one check: the same status and message each.
TEST(Cuts, EveryDriverRefusesThroughTheOneCheck) {
    ModelPtr model = make_random_model(mk_hparams_seed_default()); // 6 layers
    const int64_t unsorted[2] = {3, 1};
    const char *why = "cuts are not ascending: cut 1 (layer 1) follows layer 3";

    const mk_pipeline_options po = pipeline_options(unsorted, 2, nullptr);
    mk_pipeline *p = nullptr;
    EXPECT_ERROR(mk_pipeline_create(model.get(), &po, &p), MK_ERR_INVALID_RANGE, why);
    EXPECT_EQ(p, nullptr);

    mk_sched_options so = mk_sched_options_default();
    so.cuts = unsorted;
    so.n_cuts = 2;
    mk_sched *s = nullptr;
    EXPECT_ERROR(mk_sched_create(model.get(), &so, &s), MK_ERR_INVALID_RANGE, why);
    EXPECT_EQ(s, nullptr);

    mk_stage_options to = mk_stage_options_default();
    to.world = 3;
    to.cuts = unsorted;
    to.n_cuts = 2;
    to.rendezvous = "127.0.0.1:1"; // never reached: the plan is refused first
    int64_t cuts[MK_STAGE_MAX_WORLD];
    char digest[MK_DIGEST_HEX_LEN + 1] = "";
    EXPECT_ERROR(mk_stage_plan(model.get(), &to, cuts, digest), MK_ERR_INVALID_RANGE, why);
    mk_stage *st = nullptr;
    EXPECT_ERROR(mk_stage_join(model.get(), &to, &st), MK_ERR_INVALID_RANGE, why);
    EXPECT_EQ(st, nullptr);

    const int64_t last[1] = {5};
    const mk_pipeline_options at_last = pipeline_options(last, 1, nullptr);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &at_last, &p), MK_ERR_INVALID_RANGE, "cut 0 is layer 5, out of range");
    to.world = 2;
    to.cuts = last;
    to.n_cuts = 1;
    EXPECT_ERROR(mk_stage_join(model.get(), &to, &st), MK_ERR_INVALID_RANGE, "cut 0 is layer 5, out of range");
}

// ================================================================ struct_size ==

std::string unknown_size(const char *what, size_t size) {
    return std::string(what) + ".struct_size " + std::to_string(size) + " is not a version this meshkern knows";
}

TEST(StructSize, EveryDefaultSetsItsOwnSize) {
    EXPECT_EQ(mk_backend_config_default(MK_BACKEND_CPU).struct_size, sizeof(mk_backend_config));
    EXPECT_EQ(mk_range_options_default().struct_size, sizeof(mk_range_options));
    EXPECT_EQ(mk_seam_options_default(MK_SEAM_TCP).struct_size, sizeof(mk_seam_options));
    EXPECT_EQ(mk_pipeline_options_default().struct_size, sizeof(mk_pipeline_options));
    EXPECT_EQ(mk_sched_options_default().struct_size, sizeof(mk_sched_options));
    EXPECT_EQ(mk_stage_options_default().struct_size, sizeof(mk_stage_options));
}

TEST(StructSize, SeamOptionsTooSmallOrTooLargeAreRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *a = nullptr, *b = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, nullptr, &a));
    RangePtr hold_a(a);
    MK_ASSERT_OK(mk_range_create(model.get(), 3, 5, nullptr, &b));
    RangePtr hold_b(b);
    mk_seam *tx = nullptr, *rx = nullptr;
    mk_seam_listener *l = nullptr;
    for (const size_t size : {size_t{0}, MK_SEAM_OPTIONS_V1_SIZE - 1, sizeof(mk_seam_options) + 8}) {
        mk_seam_options o = mk_seam_options_default(MK_SEAM_LOCAL);
        o.struct_size = size;
        EXPECT_ERROR(mk_seam_pair(&o, a, b, &tx, &rx), MK_ERR_INVALID_ARGUMENT, unknown_size("mk_seam_options", size).c_str());
        EXPECT_EQ(tx, nullptr);
        o.kind = MK_SEAM_TCP;
        o.address = "127.0.0.1:0";
        EXPECT_ERROR(mk_seam_listen(&o, &l), MK_ERR_INVALID_ARGUMENT, unknown_size("mk_seam_options", size).c_str());
        EXPECT_EQ(l, nullptr);
        EXPECT_ERROR(mk_seam_connect(&o, a, &tx), MK_ERR_INVALID_ARGUMENT, unknown_size("mk_seam_options", size).c_str());
    }
    // the size this build knows works
    const mk_seam_options o = mk_seam_options_default(MK_SEAM_LOCAL);
    MK_ASSERT_OK(mk_seam_pair(&o, a, b, &tx, &rx));
    mk_seam_free(tx);
    mk_seam_free(rx);
}

TEST(StructSize, PipelineOptionsAndWhatTheyPointToAreEachReadByTheirOwnSize) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const int64_t cut = 2;
    mk_pipeline *p = nullptr;
    for (const size_t size : {size_t{0}, MK_PIPELINE_OPTIONS_V1_SIZE - 1, sizeof(mk_pipeline_options) + 8}) {
        mk_pipeline_options po = pipeline_options(&cut, 1, nullptr);
        po.struct_size = size;
        EXPECT_ERROR(mk_pipeline_create(model.get(), &po, &p), MK_ERR_INVALID_ARGUMENT,
                     unknown_size("mk_pipeline_options", size).c_str());
        EXPECT_EQ(p, nullptr);
    }
    mk_seam_options seam = mk_seam_options_default(MK_SEAM_WIRE);
    seam.struct_size = sizeof seam + 8;
    mk_pipeline_options po = pipeline_options(&cut, 1, nullptr, &seam);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &po, &p), MK_ERR_INVALID_ARGUMENT,
                 unknown_size("mk_seam_options", sizeof seam + 8).c_str());
    mk_range_options range = mk_range_options_default();
    range.struct_size = MK_RANGE_OPTIONS_V1_SIZE - 1;
    po = pipeline_options(&cut, 1, &range);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &po, &p), MK_ERR_INVALID_ARGUMENT,
                 unknown_size("mk_range_options", MK_RANGE_OPTIONS_V1_SIZE - 1).c_str());
    // an older caller's range options (the first version with struct_size): the rest default
    range = mk_range_options_default();
    range.struct_size = MK_RANGE_OPTIONS_V1_SIZE;
    range.token_only = true; // past the caller's size: not read
    seam = mk_seam_options_default(MK_SEAM_WIRE);
    po = pipeline_options(&cut, 1, &range, &seam);
    MK_ASSERT_OK(mk_pipeline_create(model.get(), &po, &p));
    mk_tail_output *out = nullptr;
    const int32_t prompt[3] = {1, 2, 3};
    MK_ASSERT_OK(mk_pipeline_step(p, prompt, 3, &out));
    EXPECT_NE(out->logits, nullptr) << "token_only lies past the caller's struct_size: its default (false) holds";
    EXPECT_GT(mk_pipeline_seam_bytes(p), 0u) << "the wire seam was taken";
    mk_tail_output_free(out);
    mk_pipeline_free(p);
    // placement: one device per range, given where its count says
    const int one_device[1] = {0};
    po = pipeline_options(&cut, 1, nullptr, nullptr, one_device, 1);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &po, &p), MK_ERR_INVALID_ARGUMENT,
                 "mk_pipeline_create: 1 devices for 2 ranges (one per range)");
    po = pipeline_options(&cut, 1, nullptr, nullptr, nullptr, 2);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &po, &p), MK_ERR_INVALID_ARGUMENT,
                 "mk_pipeline_create: n_devices set but devices is NULL");
    EXPECT_EQ(p, nullptr);
    // NULL options: every default (one FULL range, LOCAL seams)
    MK_ASSERT_OK(mk_pipeline_create(model.get(), nullptr, &p));
    EXPECT_EQ(mk_pipeline_range_count(p), 1u);
    mk_pipeline_free(p);
}

TEST(StructSize, SchedAndStageOptionsTooLargeOrTooSmallAreRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_sched *s = nullptr;
    mk_sched_options so = mk_sched_options_default();
    so.struct_size = sizeof so + 8;
    EXPECT_ERROR(mk_sched_create(model.get(), &so, &s), MK_ERR_INVALID_ARGUMENT,
                 unknown_size("mk_sched_options", sizeof so + 8).c_str());
    EXPECT_EQ(s, nullptr);
    const int64_t cut = 2;
    for (const size_t size : {size_t{0}, MK_STAGE_OPTIONS_V1_SIZE - 1, sizeof(mk_stage_options) + 8}) {
        mk_stage_options o = mk_stage_options_default();
        o.cuts = &cut;
        o.n_cuts = 1;
        o.rendezvous = "127.0.0.1:1";
        o.struct_size = size;
        mk_stage *st = nullptr;
        EXPECT_ERROR(mk_stage_join(model.get(), &o, &st), MK_ERR_INVALID_ARGUMENT,
                     unknown_size("mk_stage_options", size).c_str());
        EXPECT_EQ(st, nullptr);
        char rendezvous[64];
        mk_stage_nccl_ids *ids = nullptr;
        const mk_status setup = mk_stage_mpi_setup(model.get(), &o, rendezvous, sizeof rendezvous, &ids);
        EXPECT_NE(setup, MK_OK);
        EXPECT_EQ(ids, nullptr);
    }
}

// ============================================================ the message kept ==

// Calls that cannot fail, made after a failure: each must leave its message as it was.
TEST(LastError, CallsThatCannotFailLeaveTheMessageAlone) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *head = nullptr, *tail = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, nullptr, &head));
    MK_ASSERT_OK(mk_range_create(model.get(), 3, 5, nullptr, &tail));
    mk_sequence *seq = nullptr;
    MK_ASSERT_OK(mk_sequence_open(tail, &seq));
    mk_boundary *bd = nullptr;
    MK_ASSERT_OK(mk_boundary_create(head, &bd));
    mk_bundle *bundle = nullptr;
    MK_ASSERT_OK(mk_bundle_create(1, 2, 32, &bundle));
    const int64_t cut = 2;
    const mk_pipeline_options po = pipeline_options(&cut, 1, nullptr);
    mk_pipeline *pipe = nullptr;
    MK_ASSERT_OK(mk_pipeline_create(model.get(), &po, &pipe));
    const mk_seam_options local = mk_seam_options_default(MK_SEAM_LOCAL);
    mk_seam *tx = nullptr, *rx = nullptr;
    MK_ASSERT_OK(mk_seam_pair(&local, head, tail, &tx, &rx));
    mk_seam_options tcp = mk_seam_options_default(MK_SEAM_TCP);
    tcp.address = "127.0.0.1:0";
    mk_seam_listener *listener = nullptr;
    MK_ASSERT_OK(mk_seam_listen(&tcp, &listener));
    mk_sched_options so = mk_sched_options_default();
    so.cuts = &cut;
    so.n_cuts = 1;
    so.max_sequences = 1;
    mk_sched *sched = nullptr;
    MK_ASSERT_OK(mk_sched_create(model.get(), &so, &sched));
    mk_tokenizer *tok = nullptr;
    MK_ASSERT_OK(mk_tokenizer_open_file((std::string(MK_FIXTURE_DIR) + "/tokenizer/llama3_tiny.gguf").c_str(), &tok));
    mk_detokenizer *detok = nullptr;
    MK_ASSERT_OK(mk_detokenizer_create(tok, 0, &detok));

    // the failure whose message must survive
    mk_range *none = nullptr;
    ASSERT_EQ(mk_range_create(model.get(), 4, 2, nullptr, &none), MK_ERR_INVALID_RANGE);
    const std::string message = mk_last_error();
    ASSERT_FALSE(message.empty());
    int calls = 0;
#define KEEPS(call)                                                                                  \
    do {                                                                                             \
        (void)(call);                                                                                \
        calls++;                                                                                     \
        EXPECT_EQ(std::string(mk_last_error()), message) << #call " changed the thread's message"; \
    } while (0)

    KEEPS(mk_status_name(MK_ERR_INVALID_RANGE));
    KEEPS(mk_last_error());
    KEEPS(mk_is_certified_architecture("llama"));
    KEEPS(mk_is_certified_architecture("no-such-architecture")); // false, and no message of its own
    KEEPS(mk_protocol_required_tensors(MK_PROTOCOL_ARCH_MOE));
    KEEPS(mk_role_owns_embedding(MK_ROLE_HEAD));
    KEEPS(mk_role_owns_final_head(MK_ROLE_TAIL));
    KEEPS(mk_role_name(MK_ROLE_MIDDLE));
    KEEPS(mk_sampling_mode_name(MK_SAMPLING_TOP_K));
    KEEPS(mk_dtype_size(MK_DTYPE_F16));
    KEEPS(mk_dtype_name(MK_DTYPE_BF16));
    KEEPS(mk_bundle_header_of(bundle));
    KEEPS(mk_bundle_residual(bundle));
    KEEPS(mk_bundle_positions(bundle));
    KEEPS(mk_bundle_residual_const(bundle));
    KEEPS(mk_bundle_positions_const(bundle));
    KEEPS(mk_hparams_seed_default());
    KEEPS(mk_model_hparams(model.get()));
    KEEPS(mk_model_architecture(model.get()));
    KEEPS(mk_model_digest(model.get()));
    KEEPS(mk_tokenizer_vocab_size(tok));
    KEEPS(mk_tokenizer_bos(tok));
    KEEPS(mk_tokenizer_eos(tok));
    KEEPS(mk_tokenizer_is_eog(tok, 0));
    KEEPS(mk_tokenizer_token_text(tok, 0));
    KEEPS(mk_tokenizer_token_text(tok, -1)); // outside the vocabulary: NULL, not a failure
    KEEPS(mk_chat_template_name(MK_CHAT_TEMPLATE_CHATML));
    KEEPS(mk_backend_config_default(MK_BACKEND_CPU));
    KEEPS(mk_range_options_default());
    KEEPS(mk_range_role(head));
    KEEPS(mk_range_start(tail));
    KEEPS(mk_range_end(tail));
    KEEPS(mk_range_weight_bytes(head));
    KEEPS(mk_range_recipe_digest(head));
    KEEPS(mk_range_graph_failure(head));
    KEEPS(mk_sequence_length(seq));
    KEEPS(mk_boundary_header_of(bd));
    KEEPS(mk_boundary_range(bd));
    KEEPS(mk_seam_kind_name(MK_SEAM_NCCL));
    KEEPS(mk_seam_options_default(MK_SEAM_UNIX));
    KEEPS(mk_seam_listener_address(listener));
    KEEPS(mk_seam_bytes(rx));
    KEEPS(mk_seam_seconds(tx));
    KEEPS(mk_pipeline_options_default());
    KEEPS(mk_pipeline_range_count(pipe));
    KEEPS(mk_pipeline_range(pipe, 1));
    KEEPS(mk_pipeline_range(pipe, 9)); // past the end: NULL, not a failure
    KEEPS(mk_pipeline_seam_bytes(pipe));
    KEEPS(mk_pipeline_seam_seconds(pipe));
    KEEPS(mk_pipeline_range_seconds(pipe, 0));
    KEEPS(mk_sched_options_default());
    KEEPS(mk_sched_worker_count(sched));
    KEEPS(mk_sched_worker_range(sched, 1));
    KEEPS(mk_sched_worker_share(sched, 0));
    KEEPS(mk_sched_seam_kind(sched, 0));
    KEEPS(mk_sched_seam_bytes(sched, 0));
    KEEPS(mk_stage_options_default());
    KEEPS(mk_stage_rank(nullptr));
    KEEPS(mk_stage_range(nullptr));
    KEEPS(mk_stage_mpi_launched());
    // the free functions, last
    mk_detokenizer_free(detok);
    KEEPS(0);
    mk_tokenizer_free(tok);
    KEEPS(0);
    mk_sched_free(sched);
    KEEPS(0);
    mk_seam_listener_free(listener);
    KEEPS(0);
    mk_seam_free(tx);
    mk_seam_free(rx);
    KEEPS(0);
    mk_pipeline_free(pipe);
    KEEPS(0);
    mk_bundle_free(bundle);
    KEEPS(0);
    mk_boundary_free(bd);
    KEEPS(0);
    mk_sequence_close(seq);
    KEEPS(0);
    mk_range_free(head);
    mk_range_free(tail);
    KEEPS(0);
    mk_stage_free(nullptr);
    mk_stage_nccl_ids_free(nullptr);
    mk_tail_output_free(nullptr);
    mk_buffer_free(nullptr);
    mk_model_free(nullptr);
    KEEPS(0);
#undef KEEPS
    EXPECT_GT(calls, 60);
}

// =============================================================== bad pointers ==

// A NULL range from a getter past the end reads as no range in every range getter (as in the
// other getters); the range getters read through it: a segfault.
// ============================================================= status names ==

// Every status the header declares has its own name, spelled as declared (a status missing
// from mk_status_name's table prints as MK_ERR_UNKNOWN in every message that names it).
// The header is read as text: the test does not repeat the list it checks.
TEST(StatusNames, EveryDeclaredStatusIsNamedAsDeclared) {
    const std::string path = mk_test_source_dir() + "/include/meshkern.h";
    FILE *f = fopen(path.c_str(), "r");
    ASSERT_NE(f, nullptr) << path;
    std::string text;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    fclose(f);
    const size_t begin = text.find("typedef enum mk_status {"), end = text.find("} mk_status;");
    ASSERT_NE(begin, std::string::npos);
    ASSERT_NE(end, std::string::npos);
    std::vector<std::string> seen;
    for (size_t at = text.find("MK_", begin); at < end; at = text.find("MK_", at + 1)) {
        if (at > 0 && (isalnum((unsigned char)text[at - 1]) || text[at - 1] == '_')) continue;
        size_t stop = at;
        while (isalnum((unsigned char)text[stop]) || text[stop] == '_') stop++;
        const std::string name = text.substr(at, stop - at);
        int value = -1;
        if (sscanf(text.c_str() + stop, " = %d", &value) != 1) continue; /* a mention in a comment */
        EXPECT_STREQ(mk_status_name((mk_status)value), name.c_str()) << "status " << value;
        seen.push_back(name);
    }
    EXPECT_GE(seen.size(), 60u) << "the header's statuses were not found";
    EXPECT_STREQ(mk_status_name((mk_status)9999), "MK_ERR_UNKNOWN");
}

TEST(NullArguments, RangeGettersReadANullRangeAsNoRange) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const int64_t cut = 2;
    const mk_pipeline_options po = pipeline_options(&cut, 1, nullptr);
    mk_pipeline *pipe = nullptr;
    MK_ASSERT_OK(mk_pipeline_create(model.get(), &po, &pipe));
    const mk_range *none = mk_pipeline_range(pipe, 9);
    ASSERT_EQ(none, nullptr);
    EXPECT_EQ(mk_range_role(none), (mk_role)0);
    EXPECT_STREQ(mk_role_name(mk_range_role(none)), "unknown");
    EXPECT_EQ(mk_range_start(none), -1);
    EXPECT_EQ(mk_range_end(none), -1);
    EXPECT_EQ(mk_range_weight_bytes(none), 0u);
    EXPECT_EQ(mk_range_recipe_digest(none), nullptr);
    EXPECT_EQ(mk_range_graph_failure(none), nullptr);
    const mk_range *first = mk_pipeline_range(pipe, 0);
    EXPECT_EQ(mk_range_role(first), MK_ROLE_HEAD);
    EXPECT_EQ(mk_range_end(first), 2);
    mk_pipeline_free(pipe);
}

// Out-pointers and lists that are NULL are refused with a status, never written or read.
TEST(NullArguments, RoleAndTensorChecksRefuseNullPointers) {
    EXPECT_ERROR(mk_role_for_range(0, 1, 6, nullptr), MK_ERR_INVALID_ARGUMENT, "NULL out");
    mk_role role = (mk_role)0;
    EXPECT_EQ(mk_role_for_range(0, 1, 6, &role), MK_OK);
    EXPECT_EQ(role, MK_ROLE_HEAD);
    EXPECT_ERROR(mk_protocol_check_tensors(MK_PROTOCOL_ARCH_DENSE, nullptr, 3), MK_ERR_INVALID_ARGUMENT,
                 "3 names given but the list is NULL");
    EXPECT_ERROR(mk_protocol_check_tensors(MK_PROTOCOL_ARCH_DENSE, nullptr, 0), MK_ERR_REQUIRED_TENSORS,
                 "requires tensor 'residual_stream'");
    const char *const names[] = {"residual_stream"};
    EXPECT_EQ(mk_protocol_check_tensors(MK_PROTOCOL_ARCH_DENSE, names, 1), MK_OK) << mk_last_error();
}

// A header string filling its whole array (strncpy of a name as long as the field) has no
// NUL: set_header took it, and pack then sent it run on into the next field.
TEST(NullArguments, SetHeaderRefusesAStringWithoutItsNul) {
    mk_bundle *bundle = nullptr;
    MK_ASSERT_OK(mk_bundle_create(1, 1, 4, &bundle));
    const mk_boundary_header before = *mk_bundle_header_of(bundle);
    const struct {
        const char *name;
        size_t offset, size;
    } fields[] = {{"adapter", offsetof(mk_boundary_header, adapter), sizeof before.adapter},
                  {"tensor_name", offsetof(mk_boundary_header, tensor_name), sizeof before.tensor_name},
                  {"boundary_point", offsetof(mk_boundary_header, boundary_point), sizeof before.boundary_point},
                  {"recipe_digest", offsetof(mk_boundary_header, recipe_digest), sizeof before.recipe_digest},
                  {"request_id", offsetof(mk_boundary_header, request_id), sizeof before.request_id}};
    for (const auto &f : fields) {
        SCOPED_TRACE(f.name);
        mk_boundary_header h = before;
        char *field = reinterpret_cast<char *>(&h) + f.offset;
        const char *now = reinterpret_cast<const char *>(mk_bundle_header_of(bundle)) + f.offset;
        std::memset(field, 'a', f.size);
        EXPECT_ERROR(mk_bundle_set_header(bundle, &h), MK_ERR_INVALID_ARGUMENT,
                     (std::string("mk_boundary_header.") + f.name + " has no terminating NUL").c_str());
        EXPECT_STREQ(now, reinterpret_cast<const char *>(&before) + f.offset) << "the header changed";
        field[f.size - 1] = '\0'; // the longest string the field holds
        EXPECT_EQ(mk_bundle_set_header(bundle, &h), MK_OK) << mk_last_error();
        EXPECT_EQ(std::strlen(now), f.size - 1);
        MK_ASSERT_OK(mk_bundle_set_header(bundle, &before));
    }
    mk_bundle_free(bundle);
}

} // namespace
