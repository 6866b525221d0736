// Batches across seams: the boundaries of several sequences as one message (TensorBundle
// schema 2, an entry per sequence) over every host transport (local, wire, unix, tcp, TLS).
// Each entry arrives as its own sequence's boundary, bit-identical; an entry that lies
// (its position, its request id, NaN in its rows) fails alone while the others arrive; a
// malformed batch is refused whole with the stream left in step; a single sequence still
// travels as the schema 1 bundle it always was; the codec writes protobuf-c's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "meshkern.pb-c.h"
#include "mk_error.h"
#include "mk_test_util.h"
#include "protocol/boundary.h"
extern "C" {
#include "protocol/bundle_codec.h"
#include "seam/frame.h"
#include "seam/seam.h"
}

namespace {

struct SeamDeleter { void operator()(mk_seam *s) const { mk_seam_free(s); } };
struct BoundaryDeleter { void operator()(mk_boundary *b) const { mk_boundary_free(b); } };
using SeamPtr = std::unique_ptr<mk_seam, SeamDeleter>;
using BoundaryPtr = std::unique_ptr<mk_boundary, BoundaryDeleter>;

const char kPsk[] = "5c1e0f9a2b7d4c3e8f6a1b0c9d2e7f4a3b6c5d8e1f0a9b2c7d4e3f6a5b8c1d0e";

// Three sequences of 3, 1 and 5 prompt rows through a head range [0, 2]; the tail range
// [3, 5] holds the same three sequences, each boundary received into its own buffer.
struct ThreeSequences {
    static constexpr size_t kN = 3;
    const size_t rows[kN] = {3, 1, 5};
    const char *ids[kN] = {"req-a", "req-b", "req-c"};
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr head, tail;
    SequencePtr head_seq[kN], tail_seq[kN];
    BoundaryPtr out[kN], in[kN];
    ThreeSequences() {
        mk_range *h = nullptr, *t = nullptr;
        EXPECT_EQ(mk_range_create(model.get(), 0, 2, nullptr, &h), MK_OK);
        EXPECT_EQ(mk_range_create(model.get(), 3, 5, nullptr, &t), MK_OK);
        head.reset(h);
        tail.reset(t);
        for (size_t k = 0; k < kN; k++) {
            mk_sequence *s = nullptr;
            EXPECT_EQ(mk_sequence_open(h, &s), MK_OK);
            head_seq[k].reset(s);
            EXPECT_EQ(mk_sequence_open(t, &s), MK_OK);
            tail_seq[k].reset(s);
            mk_boundary *b = nullptr;
            EXPECT_EQ(mk_boundary_create(h, &b), MK_OK);
            out[k].reset(b);
            EXPECT_EQ(mk_boundary_create(t, &b), MK_OK);
            in[k].reset(b);
        }
    }
    // Each sequence's next rows through the head (distinct tokens per sequence), its
    // request id and step stamped as the stage runtime does.
    mk_status forward(uint64_t step) {
        for (size_t k = 0; k < kN; k++) {
            const size_t n = step == 0 ? rows[k] : 1;
            std::vector<int32_t> ids_(n);
            for (size_t i = 0; i < n; i++) ids_[i] = (int32_t)((i * 7 + k * 11 + step * 5) % 48);
            MK_TRY(mk_range_forward_boundary(head.get(), head_seq[k].get(), ids_.data(), n, nullptr, nullptr,
                                             out[k].get(), nullptr));
            snprintf(out[k]->h.request_id, sizeof out[k]->h.request_id, "%s", ids[k]);
            out[k]->h.step = step;
        }
        return MK_OK;
    }
    std::vector<const mk_boundary *> outs() const {
        std::vector<const mk_boundary *> v;
        for (size_t k = 0; k < kN; k++) v.push_back(out[k].get());
        return v;
    }
    std::vector<mk_boundary *> ins() const {
        std::vector<mk_boundary *> v;
        for (size_t k = 0; k < kN; k++) v.push_back(in[k].get());
        return v;
    }
};

// The route a receiver gives: request id -> its tail sequence.
struct Routes {
    std::map<std::string, const mk_sequence *> by_id;
    static const mk_sequence *route(void *user, const mk_boundary_header *h) {
        auto *r = static_cast<Routes *>(user);
        auto it = r->by_id.find(h->request_id);
        return it == r->by_id.end() ? nullptr : it->second;
    }
};

Routes routes_of(const ThreeSequences &t) {
    Routes r;
    for (size_t k = 0; k < ThreeSequences::kN; k++) r.by_id[t.ids[k]] = t.tail_seq[k].get();
    return r;
}

struct Kind {
    mk_seam_kind kind;
    bool tls;
    const char *name;
};
const Kind kKinds[] = {{MK_SEAM_LOCAL, false, "local"},
                       {MK_SEAM_WIRE, false, "wire"},
                       {MK_SEAM_UNIX, false, "unix"},
                       {MK_SEAM_TCP, false, "tcp"},
                       {MK_SEAM_TCP, true, "tcp+tls"}};
const Kind kHostStaged[] = {{MK_SEAM_WIRE, false, "wire"}, {MK_SEAM_UNIX, false, "unix"}, {MK_SEAM_TCP, true, "tcp+tls"}};

mk_status pair(const ThreeSequences &t, const Kind &k, SeamPtr *tx, SeamPtr *rx) {
    mk_seam_options o = mk_seam_options_default(k.kind);
    o.io_timeout_ms = 5000;
    if (k.tls) {
        o.tls.enabled = true;
        o.tls.psk_hex = kPsk;
    }
    mk_seam *a = nullptr, *b = nullptr;
    MK_TRY(mk_seam_pair(&o, t.head.get(), t.tail.get(), &a, &b));
    tx->reset(a);
    rx->reset(b);
    return MK_OK;
}

// After the forward at `step`, every sequence's boundary crosses in one message and
// arrives as that sequence's own: its rows bit-identical, its header the sender's.
void expect_batch_arrives(ThreeSequences &t, mk_seam *tx, mk_seam *rx, const char *name) {
    auto outs = t.outs();
    auto ins = t.ins();
    Routes r = routes_of(t);
    MK_ASSERT_OK(mk_seam_send_batch(tx, outs.data(), outs.size()));
    MK_ASSERT_OK(mk_seam_send_wait(tx));
    size_t n = 0;
    mk_status status[ThreeSequences::kN + 1] = {};
    MK_ASSERT_OK(mk_seam_recv_batch(rx, &Routes::route, &r, ins.data(), ThreeSequences::kN, &n, status));
    ASSERT_EQ(n, ThreeSequences::kN) << name;
    for (size_t k = 0; k < n; k++) {
        EXPECT_EQ(status[k], MK_OK) << name << " entry " << k;
        const mk_boundary_header *got = mk_boundary_header_of(t.in[k].get()), *sent = &t.out[k]->h;
        EXPECT_STREQ(got->request_id, sent->request_id) << name;
        EXPECT_EQ(got->rows, sent->rows) << name;
        EXPECT_EQ(got->position, sent->position) << name;
        EXPECT_EQ(got->step, sent->step) << name;
        EXPECT_EQ(got->next_layer, 3) << name;
        std::vector<float> a(sent->rows * 32), b(sent->rows * 32);
        MK_ASSERT_OK(mk_boundary_read(t.out[k].get(), a.data(), a.size()));
        MK_ASSERT_OK(mk_boundary_read(t.in[k].get(), b.data(), b.size()));
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name << " entry " << k;
    }
}

// The three boundaries as one message, received with room for three: each entry's status.
void send_and_receive_three(ThreeSequences &t, mk_seam *tx, mk_seam *rx, mk_status st[3]) {
    auto outs = t.outs();
    auto ins = t.ins();
    Routes r = routes_of(t);
    MK_ASSERT_OK(mk_seam_send_batch(tx, outs.data(), 3));
    MK_ASSERT_OK(mk_seam_send_wait(tx));
    size_t n = 0;
    MK_ASSERT_OK(mk_seam_recv_batch(rx, &Routes::route, &r, ins.data(), 3, &n, st));
    ASSERT_EQ(n, 3u);
}

TEST(SeamBatch, EverySequenceArrivesAsItsOwnBoundaryOverEveryTransport) {
    for (const Kind &k : kKinds) {
        ThreeSequences t;
        SeamPtr tx, rx;
        MK_ASSERT_OK(pair(t, k, &tx, &rx));
        for (uint64_t step = 0; step < 3; step++) { // prefill rows of 3, 1, 5, then two decode steps
            MK_ASSERT_OK(t.forward(step));
            expect_batch_arrives(t, tx.get(), rx.get(), k.name);
            // The tail runs each received boundary: its sequences advance as they were sent.
            for (size_t s = 0; s < ThreeSequences::kN; s++) {
                mk_tail_output *o = nullptr;
                MK_ASSERT_OK(mk_range_forward_boundary(t.tail.get(), t.tail_seq[s].get(), nullptr, 0, t.in[s].get(),
                                                       nullptr, nullptr, &o));
                mk_tail_output_free(o);
                EXPECT_EQ(mk_sequence_length(t.tail_seq[s].get()), mk_sequence_length(t.head_seq[s].get())) << k.name;
            }
        }
    }
}

TEST(SeamBatch, ABatchIsOneMessageOfSchemaTwoAndOneSequenceStaysSchemaOne) {
    ThreeSequences t;
    MK_ASSERT_OK(t.forward(0));
    // Schema 2: one message with an entry per sequence, rows in order, request ids in the entries.
    std::vector<float> res(9 * 32);
    std::vector<int32_t> pos(9);
    size_t row = 0;
    std::vector<const mk_boundary_header *> h;
    for (size_t k = 0; k < 3; k++) {
        MK_ASSERT_OK(mk_boundary_read(t.out[k].get(), res.data() + row * 32, (9 - row) * 32));
        for (size_t i = 0; i < t.rows[k]; i++) pos[row + i] = (int32_t)i;
        row += t.rows[k];
        h.push_back(&t.out[k]->h);
    }
    // Each entry's rows packed from where they lie (the boundaries' own buffers on the cpu
    // backend); protobuf-c packs the same message from the rows gathered in one array.
    const void *parts[3] = {t.out[0]->payload, t.out[1]->payload, t.out[2]->payload};
    mk_bundle_message m;
    MK_ASSERT_OK(mk_bundle_message_describe_batch(h.data(), 3, parts, pos.data(), &m));
    std::vector<uint8_t> ours(mk_bundle_message_size(&m));
    ASSERT_EQ(mk_bundle_message_pack(&m, ours.data()), ours.size());
    EXPECT_EQ(std::memcmp(ours.data() + mk_bundle_message_payload_offset(&m), res.data(), res.size() * sizeof(float)), 0)
        << "the payload offset is where the rows begin";
    m.residual.data.data = reinterpret_cast<uint8_t *>(res.data());
    m.residual.data.len = res.size() * sizeof(float);
    std::vector<uint8_t> theirs(meshkern__v1__tensor_bundle__get_packed_size(&m.msg));
    meshkern__v1__tensor_bundle__pack(&m.msg, theirs.data());
    EXPECT_EQ(ours, theirs); // the hand codec writes protobuf-c's bytes, entries and scattered rows included
    Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(nullptr, ours.size(), ours.data());
    ASSERT_NE(msg, nullptr);
    EXPECT_EQ(msg->schema_version, MK_BOUNDARY_BATCH_SCHEMA_VERSION);
    EXPECT_STREQ(msg->request_id, "");
    ASSERT_EQ(msg->n_entries, 3u);
    EXPECT_STREQ(msg->entries[1]->request_id, "req-b");
    EXPECT_EQ(msg->entries[2]->rows, 5u);
    EXPECT_EQ(msg->tensors[0]->shape[0], 1u);
    EXPECT_EQ(msg->tensors[0]->shape[1], 9u);
    meshkern__v1__tensor_bundle__free_unpacked(msg, nullptr);
    // Decoded: the entries' headers, each with its own rows at its own offset.
    mk_boundary_header got[4];
    size_t n = 0;
    const uint8_t *rows[4] = {};
    MK_ASSERT_OK(mk_bundle_decode_batch(ours.data(), ours.size(), got, 4, &n, rows));
    ASSERT_EQ(n, 3u);
    EXPECT_EQ(got[2].rows, 5u);
    EXPECT_EQ(got[2].schema_version, MK_BOUNDARY_BATCH_SCHEMA_VERSION);
    // Each entry's rows where the rows before it end: 3, 1 and 5 rows from rows 0, 3 and 4.
    EXPECT_EQ(rows[1] - rows[0], (ptrdiff_t)(3 * 32 * sizeof(float)));
    EXPECT_EQ(rows[2] - rows[0], (ptrdiff_t)(4 * 32 * sizeof(float)));
    EXPECT_EQ(std::memcmp(rows[0], res.data(), 3 * 32 * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(rows[1], res.data() + 3 * 32, 1 * 32 * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(rows[2], res.data() + 4 * 32, 5 * 32 * sizeof(float)), 0);
    // A receiver with room for two refuses the three whole; a one-sequence decode refuses a batch.
    EXPECT_ERROR(mk_bundle_decode_batch(ours.data(), ours.size(), got, 2, &n, rows), MK_ERR_SHAPE,
                 "a batch of 3 entries is more than the 2 this receiver takes");
    EXPECT_EQ(n, 0u);
    const uint8_t *residual = nullptr;
    EXPECT_ERROR(mk_bundle_decode_body(ours.data(), ours.size(), got, &residual), MK_ERR_SHAPE, "more than the 1");
    // mk_bundle_unpack holds one sequence: a batch is refused by name.
    mk_bundle *b = nullptr;
    EXPECT_ERROR(mk_bundle_unpack(ours.data(), ours.size(), &b), MK_ERR_SCHEMA_VERSION, "is a batch");
    // One sequence: the batch call writes the schema 1 bytes mk_bundle_message_describe writes.
    mk_bundle_message one, batch_of_one;
    MK_ASSERT_OK(mk_bundle_message_describe(h[0], res.data(), pos.data(), &one));
    const void *first_rows = res.data();
    MK_ASSERT_OK(mk_bundle_message_describe_batch(h.data(), 1, &first_rows, pos.data(), &batch_of_one));
    std::vector<uint8_t> a(mk_bundle_message_size(&one)), c(mk_bundle_message_size(&batch_of_one));
    mk_bundle_message_pack(&one, a.data());
    mk_bundle_message_pack(&batch_of_one, c.data());
    EXPECT_EQ(a, c);
    MK_ASSERT_OK(mk_bundle_decode_batch(a.data(), a.size(), got, 4, &n, rows));
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(std::memcmp(rows[0], res.data(), 3 * 32 * sizeof(float)), 0);
    EXPECT_EQ(got[0].schema_version, MK_BOUNDARY_SCHEMA_VERSION);
    EXPECT_STREQ(got[0].request_id, "req-a");
}

TEST(SeamBatch, OneSequenceSentByEitherCallIsTheSameFrame) {
    for (const Kind &k : kHostStaged) {
        ThreeSequences t;
        SeamPtr tx, rx;
        MK_ASSERT_OK(pair(t, k, &tx, &rx));
        MK_ASSERT_OK(t.forward(0));
        const mk_boundary *one = t.out[2].get();
        MK_ASSERT_OK(mk_seam_send(tx.get(), one));
        MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
        const size_t single = mk_seam_bytes(tx.get());
        MK_ASSERT_OK(mk_seam_recv(rx.get(), t.tail_seq[2].get(), t.in[2].get()));
        EXPECT_EQ(mk_boundary_header_of(t.in[2].get())->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
        // The same boundary as a batch of one: the same frame, and the single receive takes it.
        MK_ASSERT_OK(mk_seam_send_batch(tx.get(), &one, 1));
        MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
        EXPECT_EQ(mk_seam_bytes(tx.get()), 2 * single) << k.name;
        MK_ASSERT_OK(mk_seam_recv(rx.get(), t.tail_seq[2].get(), t.in[2].get()));
        EXPECT_EQ(mk_boundary_header_of(t.in[2].get())->schema_version, MK_BOUNDARY_SCHEMA_VERSION);
        EXPECT_EQ(mk_boundary_header_of(t.in[2].get())->rows, 5u);
        // A batch cannot be taken by the single receive: refused whole, the seam still in step.
        MK_ASSERT_OK(t.forward(1));
        auto outs = t.outs();
        MK_ASSERT_OK(mk_seam_send_batch(tx.get(), outs.data(), 3));
        MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
        EXPECT_ERROR(mk_seam_recv(rx.get(), t.tail_seq[0].get(), t.in[0].get()), MK_ERR_SHAPE, "more than the 1") << k.name;
        MK_ASSERT_OK(mk_seam_send(tx.get(), t.out[0].get()));
        MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
        Routes r = routes_of(t);
        mk_boundary *into = t.in[0].get();
        size_t n = 0;
        mk_status st = MK_ERR_INTERNAL;
        // The frame after the refused one is read: req-a at position 3, which its tail
        // sequence (never run here) has not reached: the entry, not the seam, is refused.
        MK_ASSERT_OK(mk_seam_recv_batch(rx.get(), &Routes::route, &r, &into, 1, &n, &st));
        EXPECT_EQ(n, 1u);
        EXPECT_EQ(st, MK_ERR_POSITIONS_SHAPE);
        EXPECT_NE(std::string(mk_last_error()).find("position 3 at row 0"), std::string::npos) << mk_last_error();
    }
}

TEST(SeamBatch, ALyingEntryFailsAloneAndTheOthersArrive) {
    for (const Kind &k : kKinds) {
        ThreeSequences t;
        SeamPtr tx, rx;
        MK_ASSERT_OK(pair(t, k, &tx, &rx));
        MK_ASSERT_OK(t.forward(0));
        expect_batch_arrives(t, tx.get(), rx.get(), k.name);
        for (size_t s = 0; s < 3; s++) {
            mk_tail_output *o = nullptr;
            MK_ASSERT_OK(mk_range_forward_boundary(t.tail.get(), t.tail_seq[s].get(), nullptr, 0, t.in[s].get(), nullptr,
                                                   nullptr, &o));
            mk_tail_output_free(o);
        }
        // Entry 0 claims a position its sequence has not reached; entry 2 names a request
        // the receiver does not hold. Entry 1 tells the truth and arrives.
        MK_ASSERT_OK(t.forward(1));
        t.out[0]->h.position += 1;
        snprintf(t.out[2]->h.request_id, sizeof t.out[2]->h.request_id, "req-unknown");
        mk_status st[3] = {};
        ASSERT_NO_FATAL_FAILURE(send_and_receive_three(t, tx.get(), rx.get(), st));
        EXPECT_EQ(st[0], MK_ERR_POSITIONS_SHAPE) << k.name;
        EXPECT_NE(std::string(mk_last_error()).find("does not continue the sequence (expected 3)"), std::string::npos)
            << mk_last_error();
        EXPECT_EQ(st[1], MK_OK) << k.name;
        EXPECT_EQ(st[2], MK_ERR_INVALID_ARGUMENT) << k.name;
        EXPECT_EQ(mk_boundary_header_of(t.in[0].get())->rows, 0u);
        EXPECT_EQ(mk_boundary_header_of(t.in[2].get())->rows, 0u);
        ASSERT_EQ(mk_boundary_header_of(t.in[1].get())->rows, 1u);
        std::vector<float> a(32), b(32);
        MK_ASSERT_OK(mk_boundary_read(t.out[1].get(), a.data(), 32));
        MK_ASSERT_OK(mk_boundary_read(t.in[1].get(), b.data(), 32));
        EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 32), 0) << k.name;
        // The seam goes on: the next message (entry 1 alone) arrives.
        mk_tail_output *o = nullptr;
        MK_ASSERT_OK(mk_range_forward_boundary(t.tail.get(), t.tail_seq[1].get(), nullptr, 0, t.in[1].get(), nullptr,
                                               nullptr, &o));
        mk_tail_output_free(o);
        MK_ASSERT_OK(mk_range_forward_boundary(t.head.get(), t.head_seq[1].get(), std::vector<int32_t>{4}.data(), 1,
                                               nullptr, nullptr, t.out[1].get(), nullptr));
        MK_ASSERT_OK(mk_seam_send(tx.get(), t.out[1].get()));
        MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
        MK_ASSERT_OK(mk_seam_recv(rx.get(), t.tail_seq[1].get(), t.in[1].get()));
    }
}

TEST(SeamBatch, AnEntryWithNaNFailsAloneOnHostStagedTransports) {
    for (const Kind &k : kHostStaged) {
        ThreeSequences t;
        SeamPtr tx, rx;
        MK_ASSERT_OK(pair(t, k, &tx, &rx));
        MK_ASSERT_OK(t.forward(0));
        t.out[1]->payload[17] = NAN; // cpu backend: the payload is host memory
        mk_status st[3] = {};
        ASSERT_NO_FATAL_FAILURE(send_and_receive_three(t, tx.get(), rx.get(), st));
        EXPECT_EQ(st[0], MK_OK) << k.name;
        EXPECT_EQ(st[1], MK_ERR_NONFINITE) << k.name;
        EXPECT_NE(std::string(mk_last_error()).find("value 17 (row 0)"), std::string::npos) << mk_last_error();
        EXPECT_EQ(st[2], MK_OK) << k.name;
        EXPECT_EQ(mk_boundary_header_of(t.in[2].get())->rows, 5u);
        std::vector<float> a(5 * 32), b(5 * 32);
        MK_ASSERT_OK(mk_boundary_read(t.out[2].get(), a.data(), a.size()));
        MK_ASSERT_OK(mk_boundary_read(t.in[2].get(), b.data(), b.size()));
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << k.name;
    }
}

TEST(SeamBatch, ASendThatCannotBeOneBatchIsRefusedBeforeAnyByte) {
    ThreeSequences t;
    SeamPtr tx, rx;
    MK_ASSERT_OK(pair(t, kKinds[2], &tx, &rx));
    MK_ASSERT_OK(t.forward(0));
    auto outs = t.outs();
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), outs.data(), 0), MK_ERR_INVALID_ARGUMENT, "1 to 64 boundaries, not 0");
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), outs.data(), 65), MK_ERR_INVALID_ARGUMENT, "not 65");
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), nullptr, 2), MK_ERR_INVALID_ARGUMENT, "NULL argument");
    snprintf(t.out[2]->h.request_id, sizeof t.out[2]->h.request_id, "req-a");
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), outs.data(), 3), MK_ERR_INVALID_ARGUMENT,
                 "request id 'req-a' names batch entries 0 and 2");
    t.out[2]->h.request_id[0] = '\0';
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), outs.data(), 3), MK_ERR_INVALID_ARGUMENT, "batch entry 2 has no request id");
    snprintf(t.out[2]->h.request_id, sizeof t.out[2]->h.request_id, "req-c");
    t.out[1]->h.next_layer = 4;
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), outs.data(), 3), MK_ERR_INVALID_ARGUMENT, "batch entry 1 (req-b) differs");
    t.out[1]->h.next_layer = 3;
    const mk_boundary *twice[2] = {t.out[0].get(), t.in[0].get()};
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), twice, 2), MK_ERR_INVALID_ARGUMENT, "not this range's");
    EXPECT_ERROR(mk_seam_send_batch(rx.get(), outs.data(), 3), MK_ERR_INVALID_ARGUMENT, "a receiving end");
    EXPECT_EQ(mk_seam_bytes(tx.get()), 0u); // nothing went out
    MK_ASSERT_OK(mk_seam_send_batch(tx.get(), outs.data(), 3));
}

// The public way to name a boundary's sequence: checked, and what the entries carry.
TEST(SeamBatch, ABoundaryIsNamedThroughThePublicApi) {
    ThreeSequences t;
    MK_ASSERT_OK(t.forward(0));
    EXPECT_ERROR(mk_boundary_set_request(nullptr, "x", 0), MK_ERR_INVALID_ARGUMENT, "NULL argument");
    EXPECT_ERROR(mk_boundary_set_request(t.out[0].get(), nullptr, 0), MK_ERR_INVALID_ARGUMENT, "NULL argument");
    const std::string longest(63, 'q');
    MK_ASSERT_OK(mk_boundary_set_request(t.out[0].get(), longest.c_str(), 7));
    EXPECT_EQ(mk_boundary_header_of(t.out[0].get())->request_id, longest);
    EXPECT_EQ(mk_boundary_header_of(t.out[0].get())->step, 7u);
    EXPECT_ERROR(mk_boundary_set_request(t.out[0].get(), (longest + "q").c_str(), 8), MK_ERR_INVALID_ARGUMENT,
                 "request id of 64 bytes: a boundary holds at most 63");
    EXPECT_EQ(mk_boundary_header_of(t.out[0].get())->step, 7u) << "a refusal changes nothing";
    MK_ASSERT_OK(mk_boundary_set_request(t.out[1].get(), "other", 0));
    const mk_boundary *two[2] = {t.out[0].get(), t.out[1].get()};
    SeamPtr tx, rx;
    MK_ASSERT_OK(pair(t, kKinds[1], &tx, &rx));
    MK_ASSERT_OK(mk_seam_send_batch(tx.get(), two, 2));
    Routes r;
    r.by_id[longest] = t.tail_seq[0].get();
    r.by_id["other"] = t.tail_seq[1].get();
    auto ins = t.ins();
    size_t n = 0;
    mk_status st[2] = {MK_ERR_INTERNAL, MK_ERR_INTERNAL};
    MK_ASSERT_OK(mk_seam_recv_batch(rx.get(), &Routes::route, &r, ins.data(), 2, &n, st));
    ASSERT_EQ(n, 2u);
    EXPECT_EQ(st[0], MK_OK);
    EXPECT_EQ(st[1], MK_OK);
    EXPECT_EQ(mk_boundary_header_of(t.in[0].get())->step, 7u);
    EXPECT_STREQ(mk_boundary_header_of(t.in[1].get())->request_id, "other");
}

// A boundary is read only into a buffer that holds all its rows: one float or one row
// short is refused (naming both counts) and writes nothing; a larger buffer gets exactly
// rows * hidden floats and the rest is left alone.
TEST(SeamBatch, ABoundaryIsReadOnlyIntoABufferThatHoldsIt) {
    ThreeSequences t;
    MK_ASSERT_OK(t.forward(0));
    const mk_boundary *b = t.out[2].get();
    const mk_boundary_header *h = mk_boundary_header_of(b);
    ASSERT_EQ(h->rows, 5u);
    const size_t n = h->rows * h->hidden;
    std::vector<float> buf(n + 7, -123.0f);
    for (const size_t short_by : {size_t(1), h->hidden, n - 1}) {
        const std::string want = std::to_string(n) + " floats needed, buffer holds " + std::to_string(n - short_by);
        EXPECT_ERROR(mk_boundary_read(b, buf.data(), n - short_by), MK_ERR_INVALID_ARGUMENT, want.c_str());
    }
    EXPECT_EQ(buf, std::vector<float>(n + 7, -123.0f)) << "a refused read wrote";
    MK_ASSERT_OK(mk_boundary_read(b, buf.data(), buf.size()));
    for (size_t i = 0; i < n; i++) ASSERT_TRUE(std::isfinite(buf[i]) && buf[i] != -123.0f) << "float " << i;
    for (size_t i = n; i < buf.size(); i++) EXPECT_EQ(buf[i], -123.0f) << "float " << i;
    std::vector<float> exact(n);
    MK_ASSERT_OK(mk_boundary_read(b, exact.data(), n));
    EXPECT_TRUE(std::equal(exact.begin(), exact.end(), buf.begin()));
}

TEST(SeamBatch, MoreRowsThanTheRangeTakesInOneForwardAreRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options o = mk_range_options_default();
    o.max_batch_tokens = 4;
    mk_range *h = nullptr, *t = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, &o, &h));
    RangePtr head(h);
    MK_ASSERT_OK(mk_range_create(model.get(), 3, 5, &o, &t));
    RangePtr tail(t);
    const mk_seam_options so = mk_seam_options_default(MK_SEAM_WIRE);
    mk_seam *a = nullptr, *b = nullptr;
    MK_ASSERT_OK(mk_seam_pair(&so, h, t, &a, &b));
    SeamPtr tx(a), rx(b);
    std::vector<SequencePtr> seqs;
    std::vector<BoundaryPtr> outs;
    std::vector<const mk_boundary *> ptrs;
    for (int k = 0; k < 2; k++) {
        mk_sequence *s = nullptr;
        MK_ASSERT_OK(mk_sequence_open(h, &s));
        seqs.emplace_back(s);
        mk_boundary *bd = nullptr;
        MK_ASSERT_OK(mk_boundary_create(h, &bd));
        outs.emplace_back(bd);
        const int32_t ids[3] = {1, 2, 3};
        MK_ASSERT_OK(mk_range_forward_boundary(h, s, ids, 3, nullptr, nullptr, bd, nullptr));
        snprintf(bd->h.request_id, sizeof bd->h.request_id, "r%d", k);
        ptrs.push_back(bd);
    }
    EXPECT_ERROR(mk_seam_send_batch(tx.get(), ptrs.data(), 2), MK_ERR_INVALID_ARGUMENT,
                 "a batch of 6 rows exceeds max_batch_tokens 4");
}

// ------------------------------------------------------ malformed batches ---

// A valid batch message of three entries (rows 2, 1, 3 at positions 5.., 0, 7..), as
// protobuf-c's struct, to break one field at a time.
struct BatchMessage {
    std::vector<float> res = std::vector<float>(6 * 4, 0.5f);
    std::vector<int32_t> pos = {5, 6, 0, 7, 8, 9};
    std::vector<uint8_t> bytes;
    BatchMessage() {
        mk_boundary_header a, b, c;
        mk_boundary_header_defaults(&a);
        a.hidden = 4;
        a.next_layer = 3;
        memset(a.recipe_digest, 'a', MK_DIGEST_HEX_LEN);
        a.recipe_digest[MK_DIGEST_HEX_LEN] = '\0';
        b = c = a;
        snprintf(a.request_id, sizeof a.request_id, "x");
        a.rows = 2;
        a.position = 5;
        snprintf(b.request_id, sizeof b.request_id, "y");
        b.rows = 1;
        b.position = 0;
        b.step = 4;
        snprintf(c.request_id, sizeof c.request_id, "z");
        c.rows = 3;
        c.position = 7;
        const mk_boundary_header *h[3] = {&a, &b, &c};
        const void *rows[3] = {res.data(), res.data() + 2 * 4, res.data() + 3 * 4};
        mk_bundle_message m;
        EXPECT_EQ(mk_bundle_message_describe_batch(h, 3, rows, pos.data(), &m), MK_OK);
        bytes.resize(mk_bundle_message_size(&m));
        mk_bundle_message_pack(&m, bytes.data());
    }
    // The message with one change made through protobuf-c.
    template <class F> std::vector<uint8_t> with(F change) const {
        Meshkern__V1__TensorBundle *m = meshkern__v1__tensor_bundle__unpack(nullptr, bytes.size(), bytes.data());
        EXPECT_NE(m, nullptr);
        // The changes point at strings and arrays of their own: put protobuf-c's back before it frees them.
        char *request_id = m->request_id;
        const size_t n_entries = m->n_entries;
        Meshkern__V1__BundleEntry **entries = m->entries;
        std::vector<char *> entry_ids;
        for (size_t k = 0; k < n_entries; k++) entry_ids.push_back(entries[k]->request_id);
        change(m);
        std::vector<uint8_t> out(meshkern__v1__tensor_bundle__get_packed_size(m));
        meshkern__v1__tensor_bundle__pack(m, out.data());
        m->request_id = request_id;
        m->n_entries = n_entries;
        m->entries = entries;
        for (size_t k = 0; k < n_entries; k++) entries[k]->request_id = entry_ids[k];
        meshkern__v1__tensor_bundle__free_unpacked(m, nullptr);
        return out;
    }
};

mk_status decode(const std::vector<uint8_t> &b, size_t cap = 8) {
    mk_boundary_header h[8];
    size_t n = 0;
    const uint8_t *r[8] = {};
    const mk_status s = mk_bundle_decode_batch(b.data(), b.size(), h, cap, &n, r);
    if (s != MK_OK && n != 0) return MK_ERR_INTERNAL; // a refusal accepts nothing
    return s;
}

TEST(SeamBatchMalformed, EachBrokenRuleIsRefusedWholeByName) {
    BatchMessage bm;
    mk_boundary_header h[8];
    size_t n = 0;
    const uint8_t *r[8] = {};
    MK_ASSERT_OK(mk_bundle_decode_batch(bm.bytes.data(), bm.bytes.size(), h, 8, &n, r));
    ASSERT_EQ(n, 3u);
    EXPECT_EQ(h[1].step, 4u);
    EXPECT_EQ(h[2].position, 7);
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[2]->rows = 4; })), MK_ERR_SHAPE, "entry 2 (z) carries 4 rows");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[1]->rows = 2; })), MK_ERR_POSITIONS_SHAPE,
                 "position 7 at row 3 does not continue row 2's 0");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[2]->rows = 2; })), MK_ERR_SHAPE, "entries carry 5 rows, the residual 6");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[0]->rows = 0; })), MK_ERR_SHAPE, "entry 0 (x) carries 0 rows");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[0]->rows = UINT64_MAX; })), MK_ERR_SHAPE, "carries 18446744073709551615 rows");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[2]->request_id = (char *)"x"; })), MK_ERR_SHAPE,
                 "request id 'x' names batch entries 0 and 2");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[1]->request_id = (char *)""; })), MK_ERR_MISSING_FIELD,
                 "batch entry 1 is missing field request_id");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[2]->position = 8; })), MK_ERR_POSITIONS_SHAPE,
                 "position 7 at row 3 does not continue row 3's 8");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->n_entries = 0; })), MK_ERR_MISSING_FIELD, "missing field entries");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->schema_version = 1; })), MK_ERR_SCHEMA_VERSION,
                 "schema version 1 carries 3 entries");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->schema_version = 3; })), MK_ERR_SCHEMA_VERSION, "schema version 3 is not");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->request_id = (char *)"whole"; })), MK_ERR_SCHEMA_VERSION,
                 "names its sequences in its entries");
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->step = 9; })), MK_ERR_SCHEMA_VERSION, "step 9");
    EXPECT_ERROR(decode(bm.with([](auto *m) {
                     m->tensors[0]->shape[0] = 2, m->tensors[0]->shape[1] = 3;
                     m->positions->shape[0] = 2, m->positions->shape[1] = 3;
                 })),
                 MK_ERR_SHAPE, "[1, rows, hidden], not batch 2");
    EXPECT_ERROR(decode(bm.bytes, 2), MK_ERR_SHAPE, "a batch of 3 entries is more than the 2");
    // A request id longer than a header holds: refused, not cut short (two ids would merge).
    EXPECT_ERROR(decode(bm.with([](auto *m) { m->entries[0]->request_id = (char *)"0123456789012345678901234567890123456789012345678901234567890123456789"; })),
                 MK_ERR_INVALID_ARGUMENT, "request_id is too long");
}

TEST(SeamBatchMalformed, MoreEntriesThanAnyBatchHoldsAreCountedAndRefused) {
    BatchMessage bm;
    // 70 entries (each one row would need 70 rows: the count is refused first anyway).
    std::vector<uint8_t> many = bm.with([](Meshkern__V1__TensorBundle *m) {
        static Meshkern__V1__BundleEntry e[70];
        static Meshkern__V1__BundleEntry *p[70];
        static char ids[70][8];
        for (int k = 0; k < 70; k++) {
            meshkern__v1__bundle_entry__init(&e[k]);
            snprintf(ids[k], sizeof ids[k], "e%d", k);
            e[k].request_id = ids[k];
            e[k].rows = 1;
            p[k] = &e[k];
        }
        m->n_entries = 70;
        m->entries = p;
    });
    mk_bundle_view v;
    MK_ASSERT_OK(mk_bundle_view_parse(many.data(), many.size(), &v));
    EXPECT_EQ(v.msg.n_entries, 70u);
    EXPECT_STREQ(v.msg.entries[63]->request_id, "e63");
    mk_boundary_header h[MK_MAX_BATCH_SEQUENCES];
    size_t n = 0;
    const uint8_t *r[MK_MAX_BATCH_SEQUENCES] = {};
    EXPECT_ERROR(mk_bundle_decode_batch(many.data(), many.size(), h, MK_MAX_BATCH_SEQUENCES, &n, r), MK_ERR_SHAPE,
                 "a batch of 70 entries is more than the 64");
    // An entry with a field of the wrong wire type is not a message.
    std::vector<uint8_t> bad = bm.bytes;
    bad.insert(bad.end(), {13 << 3 | 2, 2, 1 << 3 | 0, 1}); // entry whose request_id is a varint
    EXPECT_ERROR(decode(bad), MK_ERR_WIRE_DECODE, "wrong wire type");
}

TEST(SeamBatchMalformed, AMalformedBatchFrameLeavesTheStreamInStep) {
    // Over a unix seam: the range's own send is always well-formed, so the bytes go raw.
    ThreeSequences t;
    SeamPtr tx, rx;
    MK_ASSERT_OK(pair(t, kKinds[2], &tx, &rx));
    MK_ASSERT_OK(t.forward(0));
    auto outs = t.outs();
    // A valid batch, packed here, then broken (entry rows that do not add up) and framed.
    MK_ASSERT_OK(mk_seam_send_batch(tx.get(), outs.data(), 3));
    MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
    auto ins = t.ins();
    Routes r = routes_of(t);
    size_t n = 0;
    mk_status st[3];
    MK_ASSERT_OK(mk_seam_recv_batch(rx.get(), &Routes::route, &r, ins.data(), 3, &n, st));
    // Now a frame whose body is a batch with a duplicated request id.
    BatchMessage bm;
    std::vector<uint8_t> body = bm.with([](auto *m) { m->entries[1]->request_id = (char *)"x"; });
    std::vector<uint8_t> frame(MK_FRAME_HEADER_BYTES);
    mk_frame_header_encode(frame.data(), body.size(), 0);
    frame.insert(frame.end(), body.begin(), body.end());
    MK_ASSERT_OK(mk_seam_stream_write_raw(tx.get(), frame.data(), frame.size()));
    EXPECT_ERROR(mk_seam_recv_batch(rx.get(), &Routes::route, &r, ins.data(), 3, &n, st), MK_ERR_SHAPE,
                 "names batch entries 0 and 1");
    EXPECT_EQ(n, 0u);
    for (size_t k = 0; k < 3; k++) EXPECT_EQ(mk_boundary_header_of(t.in[k].get())->rows, 0u);
    // In step: the next message arrives (the tail has not run the first batch, so the
    // same boundary still continues its sequence).
    MK_ASSERT_OK(mk_seam_send(tx.get(), t.out[0].get()));
    MK_ASSERT_OK(mk_seam_send_wait(tx.get()));
    mk_boundary *into = t.in[0].get();
    MK_ASSERT_OK(mk_seam_recv_batch(rx.get(), &Routes::route, &r, &into, 1, &n, st));
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(st[0], MK_OK);
}

}  // namespace
