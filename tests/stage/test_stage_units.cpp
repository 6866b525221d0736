// The stage runtime's small parts on their own (host/stage/control.c, slots.c): framed
// control messages over a socket pair, each refusal with its status and message, the
// size limit exactly at and one past, an abort's status carried across; and the
// request-id -> sequence table: free slots only (a full table refuses a prefill and evicts
// nothing), a reused slot's cache reset, ids bounded by their field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mk_error.h"
#include "mk_test_util.h"
extern "C" {
#include "stage/stage.h"
}

namespace {

// Two connected ends (a Unix socket pair), closed on destruction.
struct CtlPair {
    mk_io a{-1, nullptr}, b{-1, nullptr};
    CtlPair() {
        int fds[2];
        EXPECT_EQ(mk_socket_pair(fds), MK_OK) << mk_last_error();
        a.fd = fds[0];
        b.fd = fds[1];
    }
    ~CtlPair() {
        mk_io_close(&a);
        mk_io_close(&b);
    }
    void raw(const std::vector<uint8_t> &bytes) {
        ASSERT_EQ(mk_io_write(&a, bytes.data(), bytes.size(), mk_deadline_ms(1000, 1000), "raw"), MK_OK);
    }
    mk_status recv(mk_ctl_type *type, std::string *body, int timeout_ms = 500) {
        std::vector<char> buf(MK_CTL_MAX_BODY + 1, 'Z');
        size_t len = 12345;
        const mk_status s = mk_ctl_recv(&b, type, buf.data(), &len, mk_deadline_ms(timeout_ms, timeout_ms), "rank 2");
        if (s == MK_OK) {
            EXPECT_EQ(buf[len], '\0') << "the body is NUL-terminated after its bytes";
            body->assign(buf.data(), len);
        }
        return s;
    }
};

std::vector<uint8_t> ctl_header(uint32_t magic, uint32_t type, uint32_t len) {
    std::vector<uint8_t> h(MK_CTL_HEADER_BYTES);
    for (int i = 0; i < 4; i++) {
        h[size_t(i)] = (uint8_t)(magic >> (8 * i));
        h[size_t(4 + i)] = (uint8_t)(type >> (8 * i));
        h[size_t(8 + i)] = (uint8_t)(len >> (8 * i));
    }
    return h;
}

TEST(StageControl, MessagesRoundTripUpToTheLimit) {
    CtlPair p;
    mk_ctl_type type = MK_CTL_HELLO;
    std::string body;
    // Every type from the first to the last, an empty body, and a body of exactly the limit.
    for (mk_ctl_type t : {MK_CTL_HELLO, MK_CTL_ABORT, MK_CTL_STATS}) {
        const std::string text = "type " + std::to_string((int)t);
        MK_ASSERT_OK(mk_ctl_send(&p.a, t, text.data(), text.size(), mk_deadline_ms(500, 500)));
        MK_ASSERT_OK(p.recv(&type, &body));
        EXPECT_EQ(type, t);
        EXPECT_EQ(body, text);
    }
    MK_ASSERT_OK(mk_ctl_send(&p.a, MK_CTL_BYE, nullptr, 0, mk_deadline_ms(500, 500)));
    MK_ASSERT_OK(p.recv(&type, &body));
    EXPECT_EQ(type, MK_CTL_BYE);
    EXPECT_EQ(body, "");
    const std::string full(MK_CTL_MAX_BODY, 'f');
    MK_ASSERT_OK(mk_ctl_send(&p.a, MK_CTL_RESULT, full.data(), full.size(), mk_deadline_ms(500, 500)));
    MK_ASSERT_OK(p.recv(&type, &body));
    EXPECT_EQ(body, full);
    // The wire layout: "MKCT", type, length, little-endian.
    MK_ASSERT_OK(mk_ctl_send(&p.a, MK_CTL_PING, "hi", 2, mk_deadline_ms(500, 500)));
    uint8_t wire[MK_CTL_HEADER_BYTES + 2];
    MK_ASSERT_OK(mk_io_read(&p.b, wire, sizeof wire, mk_deadline_ms(500, 500), "wire"));
    const std::vector<uint8_t> want = ctl_header(MK_CTL_MAGIC, MK_CTL_PING, 2);
    EXPECT_EQ(std::memcmp(wire, want.data(), MK_CTL_HEADER_BYTES), 0);
    EXPECT_EQ(std::memcmp(wire, "MKCT", 4), 0);
    EXPECT_EQ(std::memcmp(wire + MK_CTL_HEADER_BYTES, "hi", 2), 0);
}

TEST(StageControl, SenderRefusesABodyOverTheLimit) {
    CtlPair p;
    const std::string over(MK_CTL_MAX_BODY + 1, 'o');
    EXPECT_ERROR(mk_ctl_send(&p.a, MK_CTL_RESULT, over.data(), over.size(), mk_deadline_ms(500, 500)), MK_ERR_INTERNAL,
                 "control message of 4097 bytes is over the limit");
    // Nothing was written: the next message is the first the peer sees.
    MK_ASSERT_OK(mk_ctl_send(&p.a, MK_CTL_PONG, "ok", 2, mk_deadline_ms(500, 500)));
    mk_ctl_type type = MK_CTL_HELLO;
    std::string body;
    MK_ASSERT_OK(p.recv(&type, &body));
    EXPECT_EQ(type, MK_CTL_PONG);
}

TEST(StageControl, ReceiverRefusesBadMagicTypeOrLength) {
    struct Case {
        uint32_t magic, type, len;
        const char *text;
    };
    for (const Case &c : {Case{MK_CTL_MAGIC ^ 0x80000000u, MK_CTL_HELLO, 0, "rank 2 sent a control message with bad magic 0xd4434b4d"},
                          Case{MK_CTL_MAGIC, 0, 0, "or type 0"},
                          Case{MK_CTL_MAGIC, MK_CTL_LAST + 1, 0, "or type 15"}, // REFUSED (14) is the last
                          Case{MK_CTL_MAGIC, MK_CTL_RESULT, MK_CTL_MAX_BODY + 1,
                               "rank 2 sent a control message of 4097 bytes (limit 4096)"},
                          Case{MK_CTL_MAGIC, MK_CTL_RESULT, 0xffffffffu, "of 4294967295 bytes"}}) {
        CtlPair p;
        p.raw(ctl_header(c.magic, c.type, c.len));
        mk_ctl_type type = MK_CTL_HELLO;
        std::string body;
        EXPECT_ERROR(p.recv(&type, &body), MK_ERR_FRAME, c.text);
    }
    // Exactly the limit, sent raw, is read whole.
    CtlPair p;
    p.raw(ctl_header(MK_CTL_MAGIC, MK_CTL_RESULT, MK_CTL_MAX_BODY));
    p.raw(std::vector<uint8_t>(MK_CTL_MAX_BODY, 'x'));
    mk_ctl_type type = MK_CTL_HELLO;
    std::string body;
    MK_ASSERT_OK(p.recv(&type, &body));
    EXPECT_EQ(body.size(), size_t(MK_CTL_MAX_BODY));
}

TEST(StageControl, APeerThatGoesAwayOrStaysSilentIsNamed) {
    mk_ctl_type type = MK_CTL_HELLO;
    std::string body;
    {
        CtlPair p;
        mk_io_close(&p.a);
        EXPECT_ERROR(p.recv(&type, &body), MK_ERR_PEER_LOST, "rank 2 closed its connection: ");
        EXPECT_NE(std::string(mk_last_error()).find("0 of 12 bytes of the control message"), std::string::npos)
            << mk_last_error();
    }
    {
        CtlPair p;
        p.raw(ctl_header(MK_CTL_MAGIC, MK_CTL_RESULT, 10));
        p.raw({'a', 'b', 'c'});
        mk_io_close(&p.a);
        EXPECT_ERROR(p.recv(&type, &body), MK_ERR_PEER_LOST, "rank 2 closed its connection");
        EXPECT_NE(std::string(mk_last_error()).find("3 of 10 bytes of the control message body"), std::string::npos)
            << mk_last_error();
    }
    {
        CtlPair p;
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_ERROR(p.recv(&type, &body, 100), MK_ERR_PEER_TIMEOUT, "rank 2 sent nothing before the deadline");
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
        p.raw(ctl_header(MK_CTL_MAGIC, MK_CTL_RESULT, 10));
        EXPECT_ERROR(p.recv(&type, &body, 100), MK_ERR_PEER_TIMEOUT, "did not send the control message body");
    }
}

TEST(StageControl, AbortCarriesItsStatusAndMessage) {
    CtlPair p;
    mk_ctl_abort(&p.a, MK_ERR_PEER_TIMEOUT, "rank 1 went quiet");
    mk_ctl_type type = MK_CTL_HELLO;
    std::string body;
    MK_ASSERT_OK(p.recv(&type, &body));
    EXPECT_EQ(type, MK_CTL_ABORT);
    EXPECT_EQ(body, std::to_string((int)MK_ERR_PEER_TIMEOUT) + " rank 1 went quiet");
    EXPECT_ERROR(mk_ctl_abort_status(body.c_str()), MK_ERR_PEER_TIMEOUT, "rank 1 went quiet");
    EXPECT_STREQ(mk_last_error(), "rank 1 went quiet") << "the status number is not part of the message";
    // A message longer than a body: cut to the limit, still sent.
    mk_ctl_abort(&p.a, MK_ERR_FRAME, std::string(2 * MK_CTL_MAX_BODY, 'm').c_str());
    MK_ASSERT_OK(p.recv(&type, &body));
    EXPECT_EQ(body.size(), size_t(MK_CTL_MAX_BODY - 1));
    // A closed connection: nothing to send to, nothing happens.
    mk_io gone{-1, nullptr};
    mk_ctl_abort(&gone, MK_ERR_FRAME, "x");
}

// Only statuses this library names: the lowest and the highest, not a gap between them.
TEST(StageControl, AbortBodiesWithoutAStatusAreRefused) {
    EXPECT_EQ(mk_ctl_abort_status("1 first"), MK_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(mk_last_error(), "first");
    EXPECT_EQ(mk_ctl_abort_status("102 last"), MK_ERR_CHAT_TEMPLATE);
    // a status this build does not know is no status (and out of the enum's range in C++):
    // a gap, one past the last, the bound
    for (const char *body : {"6 a gap", "97 a gap", "103 past the last", "1000 last"})
        EXPECT_ERROR(mk_ctl_abort_status(body), MK_ERR_FRAME, "which this build does not know") << body;
    EXPECT_ERROR(mk_ctl_abort_status("1000 last"), MK_ERR_FRAME, "status 1000, which this build does not know: last");
    // a named status without a reason still carries a message (found by tests/fuzz/fuzz_control.c)
    EXPECT_ERROR(mk_ctl_abort_status("93"), MK_ERR_FRAME, "aborted with MK_ERR_FRAME and no reason given");
    for (const char *body : {"", "abc", "0 zero", "-5 negative", "1001 too big", " "})
        EXPECT_ERROR(mk_ctl_abort_status(body), MK_ERR_FRAME, "an abort message without a status") << body;
    EXPECT_ERROR(mk_ctl_abort_status("x"), MK_ERR_FRAME, "'x'");
}

TEST(StageControl, WrapPutsThePrefixBeforeTheCause) {
    mk_fail(MK_ERR_PEER_CLOSED, "the cause");
    EXPECT_EQ(mk_stage_wrap(MK_ERR_PEER_LOST, "rank %d", 3), MK_ERR_PEER_LOST);
    EXPECT_STREQ(mk_last_error(), "rank 3: the cause");
}

// ============================================================ hop figures ==

// A hop's latency from the two ranks' own clocks: each rank sums its times from its own base
// (its clock at its join), so the receiver's sum less the sender's is corrected by the
// bases' difference once per boundary. Two boundaries sent at 100 and 300 ns after the
// sender's base (1000) and received 50 and 260 ns after the receiver's (1200): 150 and
// 160 ns, 155 on average; the seam's time is the two sides' together.
TEST(StageHops, LatencyCorrectsEachRanksClockBase) {
    mk_stage st{};
    mk_stage_counts counts[2] = {};
    counts[0] = {true, 1000, 2, 0, 100 + 300, 0, 0, 0.25, 0.0};
    counts[1] = {true, 1200, 0, 2, 0, 50 + 260, 4096, 0.0, 0.5};
    st.rank = 0;
    st.world = 2;
    st.peer_counts = counts;
    mk_stage_hop hop{};
    MK_ASSERT_OK(mk_stage_hop_stats(&st, 0, &hop));
    EXPECT_EQ(hop.boundaries, 2u);
    EXPECT_EQ(hop.bytes, 4096u);
    EXPECT_DOUBLE_EQ(hop.seam_seconds, 0.75);
    EXPECT_NEAR(hop.latency_s, 155e-9, 1e-15);
    counts[1].received = 3; // the two sides disagree: no figure made of them
    EXPECT_ERROR(mk_stage_hop_stats(&st, 0, &hop), MK_ERR_INTERNAL, "rank 0 sent 2 boundaries, rank 1 received 3");
    EXPECT_ERROR(mk_stage_hop_stats(&st, 1, &hop), MK_ERR_INVALID_ARGUMENT, "seam 1");
}

// ================================================================== slots ==

struct SlotsOn {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr range;
    mk_slots t{};
    explicit SlotsOn(size_t n) {
        mk_range *r = nullptr;
        EXPECT_EQ(mk_range_create(model.get(), 0, 5, nullptr, &r), MK_OK) << mk_last_error();
        range.reset(r);
        EXPECT_EQ(mk_slots_init(&t, r, n), MK_OK);
    }
    ~SlotsOn() { mk_slots_free(&t); }
    mk_sequence *get(const char *id, bool fresh) {
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_slots_get(&t, id, fresh, &s), MK_OK) << id << ": " << mk_last_error();
        return s;
    }
    bool has(const char *id) {
        mk_sequence *s = nullptr;
        return mk_slots_get(&t, id, false, &s) == MK_OK;
    }
    void advance(mk_sequence *s) {
        const int32_t ids[] = {1, 2};
        mk_tail_output *out = nullptr;
        ASSERT_EQ(mk_range_forward(range.get(), s, ids, 2, nullptr, nullptr, nullptr, &out), MK_OK) << mk_last_error();
        mk_tail_output_free(out);
    }
};

// A table of no slots is refused when it is made: it could never take a prefill.
TEST(StageSlots, ATableOfNoSlotsIsRefused) {
    mk_slots t;
    EXPECT_ERROR(mk_slots_init(&t, nullptr, 0), MK_ERR_INVALID_ARGUMENT, "needs at least one slot");
    EXPECT_EQ(t.slot, nullptr);
    mk_slots_free(&t); // harmless after the refusal
    SlotsOn one(1);
    mk_sequence *a = one.get("a", true), *q = nullptr;
    EXPECT_ERROR(mk_slots_get(&one.t, "b", true, &q), MK_ERR_KV_POOL_FULL,
                 "request 'b': every one of the 1 sequence slots holds a request");
    EXPECT_TRUE(one.has("a")) << "a refused prefill takes nothing over";
    mk_slots_release(&one.t, "a");
    EXPECT_EQ(one.get("b", true), a) << "the released slot";
}

TEST(StageSlots, RequestIdsMustFitTheirField) {
    SlotsOn s(2);
    mk_sequence *q = nullptr;
    EXPECT_ERROR(mk_slots_get(&s.t, "", true, &q), MK_ERR_MISSING_FIELD, "a boundary without a usable request id ('')");
    const std::string longest(63, 'i'), over(64, 'o');
    EXPECT_NE(s.get(longest.c_str(), true), nullptr);
    EXPECT_TRUE(s.has(longest.c_str()));
    EXPECT_ERROR(mk_slots_get(&s.t, over.c_str(), true, &q), MK_ERR_MISSING_FIELD, "without a usable request id");
    EXPECT_ERROR(mk_slots_get(&s.t, over.c_str(), false, &q), MK_ERR_MISSING_FIELD, "without a usable request id");
}

TEST(StageSlots, PrefillOpensDecodeFindsAndNeitherTwice) {
    SlotsOn s(2);
    mk_sequence *q = nullptr;
    EXPECT_ERROR(mk_slots_get(&s.t, "a", false, &q), MK_ERR_POSITIONS_SHAPE,
                 "no sequence of request 'a' on this rank (no prefill seen)");
    mk_sequence *a = s.get("a", true);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(s.get("a", false), a);
    EXPECT_ERROR(mk_slots_get(&s.t, "a", true, &q), MK_ERR_POSITIONS_SHAPE, "a second prefill of request 'a'");
    mk_sequence *b = s.get("b", true);
    EXPECT_NE(b, a) << "a free slot before any reuse";
    EXPECT_EQ(s.get("a", false), a);
    EXPECT_EQ(s.get("b", false), b);
}

// Full table: a prefill is refused with a named status and every request keeps its
// sequence, whichever was used last (a step may carry a later request's prefill before an
// earlier one's decode row: the slot left longest is not a finished request's); after a
// release the prefill takes that slot, its cache reset.
TEST(StageSlots, FullTableRefusesAPrefillAndEvictsNothing) {
    SlotsOn s(3);
    mk_sequence *a = s.get("a", true), *b = s.get("b", true), *c = s.get("c", true), *q = nullptr;
    s.get("a", false);
    s.advance(b);
    ASSERT_GT(mk_sequence_length(b), 0u);
    EXPECT_ERROR(mk_slots_get(&s.t, "d", true, &q), MK_ERR_KV_POOL_FULL, "every one of the 3 sequence slots holds a request");
    EXPECT_EQ(s.get("a", false), a);
    EXPECT_EQ(s.get("b", false), b);
    EXPECT_EQ(s.get("c", false), c);
    EXPECT_GT(mk_sequence_length(b), 0u) << "a refused prefill resets nobody's cache";
    mk_slots_release(&s.t, "b");
    mk_sequence *d = s.get("d", true);
    EXPECT_EQ(d, b) << "the released slot is reused";
    EXPECT_EQ(mk_sequence_length(d), 0u) << "a reused slot's cache is reset";
    EXPECT_FALSE(s.has("b"));
    EXPECT_TRUE(s.has("a"));
    EXPECT_TRUE(s.has("c"));
}

TEST(StageSlots, ReleasedSlotIsTakenBeforeAnyOther) {
    SlotsOn s(2);
    mk_sequence *a = s.get("a", true), *b = s.get("b", true);
    s.advance(b);
    mk_slots_release(&s.t, "b");
    mk_slots_release(&s.t, "never-seen"); // harmless
    EXPECT_FALSE(s.has("b"));
    mk_sequence *c = s.get("c", true);
    EXPECT_EQ(c, b) << "the freed slot, not the older a";
    EXPECT_EQ(mk_sequence_length(c), 0u);
    EXPECT_TRUE(s.has("a"));
    EXPECT_EQ(s.get("a", false), a);
    // A released id can be prefilled again.
    mk_slots_release(&s.t, "a");
    EXPECT_EQ(s.get("a", true), a);
}

}  // namespace
