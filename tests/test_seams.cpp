// Seams and their transports on the cpu backend: whole vs split bit-identical over every
// transport (local, wire, unix, tcp, TLS with a pre-shared key and with certificates),
// across two processes, and every faulty peer ending in its own status within the
// deadline: closes mid-frame, never sends, frame over the limit, truncated frame header,
// another recipe digest / next_layer / hidden width, non-finite values, wrong key or
// certificate, plaintext peer when TLS is required. Then the parts one by one, each rule on
// the smallest input that shows it: the frame header, wire walker and body checks
// (frame.c), the stream in step after a refused body and out of step after a bad header
// (stream.c), socket I/O and addresses (io.c), TLS key and certificate rules (tls.c), the
// seam API's refusals (seam.c, local.c, wire.c, nccl_absent.c).
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "protocol/boundary.h"
#include "meshkern.pb-c.h"
#include "mk_error.h"
#include "mk_test_util.h"
extern "C" {
#include "protocol/bundle_codec.h"
#include "seam/frame.h"
#include "net/io.h"
#include "seam/seam.h"
}
#include <openssl/ssl.h>

namespace {

const std::string kSmolLM2 = std::string(MK_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct SeamDeleter { void operator()(mk_seam *s) const { mk_seam_free(s); } };
struct ListenerDeleter { void operator()(mk_seam_listener *l) const { mk_seam_listener_free(l); } };
struct BoundaryDeleter { void operator()(mk_boundary *b) const { mk_boundary_free(b); } };
using SeamPtr = std::unique_ptr<mk_seam, SeamDeleter>;
using ListenerPtr = std::unique_ptr<mk_seam_listener, ListenerDeleter>;
using BoundaryPtr = std::unique_ptr<mk_boundary, BoundaryDeleter>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A temporary directory for socket paths and PEM files, removed with its files.
class TempDir {
  public:
    TempDir() {
        char tmpl[] = "/tmp/mk_seams_XXXXXX";
        path_ = mkdtemp(tmpl) ? tmpl : "/tmp";
    }
    ~TempDir() {
        for (const std::string &f : files_) unlink(f.c_str());
        rmdir(path_.c_str());
    }
    std::string file(const std::string &name) {
        files_.push_back(path_ + "/" + name);
        return files_.back();
    }

  private:
    std::string path_;
    std::vector<std::string> files_;
};

// ----------------------------------------------------------- certificates ---

// A CA and a leaf certificate it signs, generated with OpenSSL at test time (P-256).
struct Pki {
    std::string ca, cert, key;
};

EVP_PKEY *new_key() { return EVP_EC_gen("P-256"); }

X509 *new_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key, long serial) {
    X509 *c = X509_new();
    X509_set_version(c, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(c), serial);
    X509_gmtime_adj(X509_getm_notBefore(c), -3600);
    X509_gmtime_adj(X509_getm_notAfter(c), 3600);
    X509_set_pubkey(c, key);
    X509_NAME *name = X509_get_subject_name(c);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(c, issuer ? X509_get_subject_name(issuer) : name);
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer ? issuer : c, c, nullptr, nullptr, 0);
    X509_EXTENSION *bc = X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, issuer ? "CA:FALSE" : "critical,CA:TRUE");
    X509_add_ext(c, bc, -1);
    X509_EXTENSION_free(bc);
    X509_sign(c, issuer_key ? issuer_key : key, EVP_sha256());
    return c;
}

void write_pem(const std::string &path, X509 *cert, EVP_PKEY *key) {
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    if (cert) PEM_write_X509(f, cert);
    if (key) PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    fclose(f);
}

Pki make_pki(TempDir &dir, const std::string &tag) {
    Pki p{dir.file(tag + "_ca.pem"), dir.file(tag + "_cert.pem"), dir.file(tag + "_key.pem")};
    EVP_PKEY *ca_key = new_key(), *leaf_key = new_key();
    X509 *ca = new_cert(ca_key, ("meshkern test CA " + tag).c_str(), nullptr, nullptr, 1);
    X509 *leaf = new_cert(leaf_key, "meshkern peer", ca, ca_key, 2);
    write_pem(p.ca, ca, nullptr);
    write_pem(p.cert, leaf, nullptr);
    write_pem(p.key, nullptr, leaf_key);
    X509_free(ca);
    X509_free(leaf);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(leaf_key);
    return p;
}

const char kPsk[] = "8f2a61c0de55aa0193b7e4f6021c9d3b5e7a8c0f1d2e3f405162738495a6b7c8";
const char kOtherPsk[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

// ------------------------------------------------------- transports parity ---

struct Transport {
    const char *name;
    mk_seam_kind kind;
    enum { PLAIN, PSK, CERT } tls;
};

const Transport kTransports[] = {
    {"local", MK_SEAM_LOCAL, Transport::PLAIN}, {"wire", MK_SEAM_WIRE, Transport::PLAIN},
    {"unix", MK_SEAM_UNIX, Transport::PLAIN},   {"tcp", MK_SEAM_TCP, Transport::PLAIN},
    {"unix_tls_psk", MK_SEAM_UNIX, Transport::PSK}, {"tcp_tls_cert", MK_SEAM_TCP, Transport::CERT},
};

// Options for a transport; the PKI (certificates) lives in `dir`.
mk_seam_options seam_options(const Transport &t, TempDir &dir, Pki *pki) {
    mk_seam_options o = mk_seam_options_default(t.kind);
    o.io_timeout_ms = 10000;
    if (t.tls == Transport::PSK) {
        o.tls.enabled = true;
        o.tls.psk_hex = kPsk;
    } else if (t.tls == Transport::CERT) {
        *pki = make_pki(dir, "parity");
        o.tls.enabled = true;
        o.tls.cert_file = pki->cert.c_str();
        o.tls.key_file = pki->key.c_str();
        o.tls.ca_file = pki->ca.c_str();
    }
    return o;
}

void expect_same(const Decode &whole, const Decode &split, const std::string &what) {
    ASSERT_EQ(whole.logits.size(), split.logits.size()) << what;
    for (size_t i = 0; i < whole.logits.size(); i++)
        EXPECT_TRUE(bit_identical(whole.logits[i], split.logits[i])) << what << " step " << i;
    EXPECT_EQ(whole.tokens, split.tokens) << what;
}

class SeamParity : public ::testing::TestWithParam<Transport> {};

TEST_P(SeamParity, RandomModelsSplitBitIdenticalOverTheTransport) {
    const Transport t = GetParam();
    TempDir dir;
    Pki pki;
    const mk_seam_options seam = seam_options(t, dir, &pki);
    for (const ModelCase &c : model_cases()) {
        SCOPED_TRACE(c.name);
        ModelPtr model = make_random_model(c.hp);
        const int64_t L = (int64_t)c.hp.n_layers;
        const Decode whole = decode_greedy(model.get(), {}, mk_range_options_default(), c.prompt, 10);
        ASSERT_EQ(whole.tokens.size(), 10u);
        for (const std::vector<int64_t> &cuts : std::vector<std::vector<int64_t>>{{L / 2}, {0, L - 2}}) {
            Pipeline p(model.get(), cuts, mk_range_options_default(), seam);
            const Decode split = decode_greedy_on(p, c.prompt, 10);
            expect_same(whole, split, std::string(t.name) + " cut " + std::to_string(cuts[0]));
            // Every step moved the whole residual: bytes grow with the rows carried.
            const size_t rows = c.prompt.size() + 9, floats = rows * c.hp.hidden * cuts.size();
            EXPECT_GE(mk_pipeline_seam_bytes(p.get()), floats * sizeof(float));
            EXPECT_GT(mk_pipeline_seam_seconds(p.get()), 0.0);
        }
    }
}

TEST_P(SeamParity, SmolLM2SplitBitIdenticalOverTheTransport) {
    const Transport t = GetParam();
    mk_model *m = nullptr;
    ASSERT_EQ(mk_model_open_gguf(kSmolLM2.c_str(), &m), MK_OK)
        << "SmolLM2 is part of the test setup (scripts/fetch_model.sh): " << mk_last_error();
    ModelPtr model(m);
    TempDir dir;
    Pki pki;
    const mk_seam_options seam = seam_options(t, dir, &pki);
    mk_range_options o = mk_range_options_default();
    o.max_context = 32;
    const std::vector<int32_t> prompt = {1, 9690, 28, 198, 504, 3458, 282, 4649, 314};
    static const Decode whole = decode_greedy(model.get(), {}, o, prompt, 4); // once for every transport
    ASSERT_EQ(whole.tokens.size(), 4u);
    expect_same(whole, decode_greedy_seam(model.get(), {14}, o, seam, prompt, 4), t.name);
}

INSTANTIATE_TEST_SUITE_P(Transports, SeamParity, ::testing::ValuesIn(kTransports),
                         [](const ::testing::TestParamInfo<Transport> &i) { return std::string(i.param.name); });

// ---------------------------------------------------------- across processes ---

// The head range runs in a forked child and sends over the stream transport; the tail
// range runs here. The child feeds the whole model's greedy tokens (computed before the
// fork), so the tail's logits must equal the whole model's at every step.
void cross_process(mk_seam_kind kind) {
    const ModelCase c = model_cases()[1];
    ModelPtr model = make_random_model(c.hp);
    const size_t n_steps = 8;
    const Decode whole = decode_greedy(model.get(), {}, mk_range_options_default(), c.prompt, n_steps);
    ASSERT_EQ(whole.tokens.size(), n_steps);
    TempDir dir;
    const std::string path = dir.file("seam.sock");
    mk_seam_options o = mk_seam_options_default(kind);
    o.address = kind == MK_SEAM_UNIX ? path.c_str() : "127.0.0.1:0";
    o.io_timeout_ms = 10000;
    mk_seam_listener *l = nullptr;
    MK_ASSERT_OK(mk_seam_listen(&o, &l));
    ListenerPtr listener(l);
    const std::string address = mk_seam_listener_address(l);
    const int64_t cut = 2;
    fflush(nullptr);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Head process: no gtest here; the exit code says what failed.
        mk_range *head = nullptr;
        mk_sequence *seq = nullptr;
        mk_boundary *out = nullptr;
        mk_seam *tx = nullptr;
        mk_seam_options co = o;
        co.address = address.c_str();
        if (mk_range_create(model.get(), 0, cut, nullptr, &head) != MK_OK || mk_sequence_open(head, &seq) != MK_OK ||
            mk_boundary_create(head, &out) != MK_OK || mk_seam_connect(&co, head, &tx) != MK_OK)
            _exit(10);
        std::vector<int32_t> next = c.prompt;
        for (size_t i = 0; i < n_steps; i++) {
            if (mk_range_forward_boundary(head, seq, next.data(), next.size(), nullptr, nullptr, out, nullptr) != MK_OK)
                _exit(11);
            if (mk_seam_send(tx, out) != MK_OK || mk_seam_send_wait(tx) != MK_OK) _exit(12);
            next = {whole.tokens[i]};
        }
        mk_seam_free(tx);
        mk_boundary_free(out);
        mk_sequence_close(seq);
        mk_range_free(head);
        _exit(0);
    }
    mk_range *t = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), cut + 1, (int64_t)c.hp.n_layers - 1, nullptr, &t));
    RangePtr tail(t);
    mk_seam *rx = nullptr;
    MK_ASSERT_OK(mk_seam_accept(l, tail.get(), &rx));
    SeamPtr recv_end(rx);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(tail.get(), &s));
    SequencePtr seq(s);
    mk_boundary *in = nullptr;
    MK_ASSERT_OK(mk_boundary_create(tail.get(), &in));
    BoundaryPtr input(in);
    Decode split;
    for (size_t i = 0; i < n_steps; i++) {
        MK_ASSERT_OK(mk_seam_recv(rx, s, in));
        EXPECT_EQ(mk_boundary_header_of(in)->step, i);
        mk_tail_output *o_t = nullptr;
        MK_ASSERT_OK(mk_range_forward_boundary(tail.get(), s, nullptr, 0, in, nullptr, nullptr, &o_t));
        TailPtr out(o_t);
        split.logits.push_back(logits_of(out));
        split.tokens.push_back(out->token_ids[0]);
    }
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "head process exit " << WEXITSTATUS(wstatus);
    expect_same(whole, split, kind == MK_SEAM_UNIX ? "unix across processes" : "tcp across processes");
}

TEST(SeamProcesses, HeadInAChildProcessOverUnixSocket) { cross_process(MK_SEAM_UNIX); }
TEST(SeamProcesses, HeadInAChildProcessOverTcp) { cross_process(MK_SEAM_TCP); }

// ------------------------------------------------------------- faulty peers ---

// A receiving seam end on the tail range [3, 5] of the seed model, its peer a raw socket
// the test writes bytes into as a faulty sender would.
constexpr uint64_t kTailLimit = uint64_t(64) * 32 * 4 + 64 * 4 + 1024 + 64 * 128; // FaultyPeer's tail: 64 rows x 32

class FaultyPeer : public ::testing::Test {
  protected:
    static constexpr int kDeadlineMs = 200;

    void SetUp() override {
        model_ = make_random_model(mk_hparams_seed_default());
        mk_range_options ro = mk_range_options_default();
        ro.max_context = 64;
        mk_range *h = nullptr, *t = nullptr;
        MK_ASSERT_OK(mk_range_create(model_.get(), 0, 2, &ro, &h));
        MK_ASSERT_OK(mk_range_create(model_.get(), 3, 5, &ro, &t));
        head_.reset(h);
        tail_.reset(t);
        mk_sequence *s = nullptr;
        MK_ASSERT_OK(mk_sequence_open(tail_.get(), &s));
        seq_.reset(s);
        mk_boundary *b = nullptr;
        MK_ASSERT_OK(mk_boundary_create(tail_.get(), &b));
        into_.reset(b);
        valid_ = head_bundle(head_.get());
    }

    // A packed bundle the head emits for {3, 1, 4} (positions 0..2).
    std::vector<uint8_t> head_bundle(mk_range *head, const std::function<void(mk_bundle *)> &edit = nullptr) {
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(head, &s), MK_OK);
        SequencePtr seq(s);
        const int32_t ids[] = {3, 1, 4};
        mk_bundle *b = nullptr;
        EXPECT_EQ(mk_range_forward(head, s, ids, 3, nullptr, nullptr, &b, nullptr), MK_OK) << mk_last_error();
        BundlePtr bundle(b);
        if (edit) edit(b);
        uint8_t *bytes = nullptr;
        size_t len = 0;
        EXPECT_EQ(mk_bundle_pack(b, &bytes, &len), MK_OK);
        std::vector<uint8_t> out(bytes, bytes + len);
        mk_buffer_free(bytes);
        return out;
    }

    static std::vector<uint8_t> frame_header(uint64_t length, uint32_t magic = 0x46534b4du, uint16_t version = 1) {
        std::vector<uint8_t> h(16, 0);
        for (int i = 0; i < 4; i++) h[i] = (uint8_t)(magic >> (8 * i));
        h[4] = (uint8_t)version;
        h[5] = (uint8_t)(version >> 8);
        for (int i = 0; i < 8; i++) h[8 + i] = (uint8_t)(length >> (8 * i));
        return h;
    }

    static std::vector<uint8_t> framed(const std::vector<uint8_t> &body) {
        std::vector<uint8_t> f = frame_header(body.size());
        f.insert(f.end(), body.begin(), body.end());
        return f;
    }

    // Listen, connect a raw socket (completes through the backlog), accept the seam end.
    void connect_raw(mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX), bool expect_accept = true,
                     int io_ms = kDeadlineMs) {
        path_ = dir_.file("peer.sock");
        o.address = path_.c_str();
        o.io_timeout_ms = io_ms;
        o.connect_timeout_ms = 2000;
        mk_seam_listener *l = nullptr;
        MK_ASSERT_OK(mk_seam_listen(&o, &l));
        listener_.reset(l);
        raw_ = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un sun{};
        sun.sun_family = AF_UNIX;
        std::snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path_.c_str());
        ASSERT_EQ(connect(raw_, (sockaddr *)&sun, sizeof sun), 0);
        if (!expect_accept) return;
        mk_seam *rx = nullptr;
        MK_ASSERT_OK(mk_seam_accept(l, tail_.get(), &rx));
        rx_.reset(rx);
    }

    void write_raw(const std::vector<uint8_t> &bytes) {
        ASSERT_EQ(send(raw_, bytes.data(), bytes.size(), MSG_NOSIGNAL), (ssize_t)bytes.size());
    }

    void close_raw() {
        if (raw_ >= 0) close(raw_);
        raw_ = -1;
    }

    // Receive once; the status, with the elapsed time checked against the deadline.
    mk_status receive(std::string *message = nullptr) {
        const auto t0 = std::chrono::steady_clock::now();
        const mk_status s = mk_seam_recv(rx_.get(), seq_.get(), into_.get());
        const double dt = seconds_since(t0);
        if (message) *message = mk_last_error();
        EXPECT_LT(dt, kDeadlineMs / 1000.0 + 1.0) << "took " << dt << " s";
        if (s != MK_OK) {
            EXPECT_STRNE(mk_last_error(), "") << "a refusal says why";
            EXPECT_EQ(mk_boundary_header_of(into_.get())->rows, 0u) << "a refused boundary is not accepted";
        }
        return s;
    }

    void TearDown() override { close_raw(); }

    TempDir dir_;
    std::string path_;
    ModelPtr model_;
    RangePtr head_, tail_;
    SequencePtr seq_;
    BoundaryPtr into_;
    ListenerPtr listener_;
    SeamPtr rx_;
    int raw_ = -1;
    std::vector<uint8_t> valid_;
};

TEST_F(FaultyPeer, ValidFrameIsAcceptedAndRunsTheTail) {
    connect_raw();
    write_raw(framed(valid_));
    MK_ASSERT_OK(receive());
    EXPECT_EQ(mk_boundary_header_of(into_.get())->rows, 3u);
    mk_tail_output *t = nullptr;
    MK_ASSERT_OK(mk_range_forward_boundary(tail_.get(), seq_.get(), nullptr, 0, into_.get(), nullptr, nullptr, &t));
    mk_tail_output_free(t);
}

// A frame trickling in 16-byte pieces while signals interrupt every wait (EINTR from
// poll and recv) is still read whole.
void on_alarm(int) {}

TEST_F(FaultyPeer, PartialWritesAndInterruptedWaitsAreRiddenOut) {
    connect_raw();
    struct sigaction sa {}, old_sa {};
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; // no SA_RESTART: blocked calls return EINTR
    ASSERT_EQ(sigaction(SIGALRM, &sa, &old_sa), 0);
    itimerval every{{0, 500}, {0, 500}}, off{};
    ASSERT_EQ(setitimer(ITIMER_REAL, &every, nullptr), 0);
    const std::vector<uint8_t> frame = framed(valid_);
    std::thread writer([&]() {
        for (size_t at = 0; at < frame.size(); at += 16) {
            const size_t n = std::min<size_t>(16, frame.size() - at);
            ssize_t w;
            do w = send(raw_, frame.data() + at, n, MSG_NOSIGNAL);
            while (w < 0 && errno == EINTR);
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    });
    const mk_status st = receive();
    writer.join();
    setitimer(ITIMER_REAL, &off, nullptr);
    sigaction(SIGALRM, &old_sa, nullptr);
    EXPECT_EQ(st, MK_OK) << mk_last_error();
    EXPECT_EQ(mk_boundary_header_of(into_.get())->rows, 3u);
}

TEST_F(FaultyPeer, PeerClosesMidFrame) {
    connect_raw();
    std::vector<uint8_t> f = framed(valid_);
    f.resize(f.size() / 2);
    write_raw(f);
    close_raw();
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_PEER_CLOSED);
    EXPECT_NE(msg.find("frame body"), std::string::npos) << msg;
    // The stream is out of step: later calls report the same failure, never a hang.
    EXPECT_EQ(receive(), MK_ERR_PEER_CLOSED);
}

TEST_F(FaultyPeer, PeerNeverSends) {
    connect_raw();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(receive(), MK_ERR_PEER_TIMEOUT);
    EXPECT_GE(seconds_since(t0), kDeadlineMs / 1000.0 * 0.9);
}

// A peer that stalls inside a frame is found once nothing came for a quarter of the wait
// (50 of 200 ms), not at the wait's end: a stage's rank 0 would blame this receiver first.
TEST_F(FaultyPeer, PeerStallsMidFrame) {
    connect_raw();
    std::vector<uint8_t> f = framed(valid_);
    f.resize(40);
    write_raw(f);
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_PEER_TIMEOUT);
    EXPECT_LT(seconds_since(t0), kDeadlineMs / 1000.0 * 0.75) << msg;
    EXPECT_NE(msg.find("stalled in the frame body: nothing for 50 ms after 24 of"), std::string::npos) << msg;
}

// A body that keeps coming, each piece within the stall limit (200 ms gaps; limit 500 of a
// 2000 ms wait) but the whole longer than it (800 ms), is read whole: the limit is on
// stalls, not on the body's time.
TEST_F(FaultyPeer, ABodyThatKeepsMovingIsNotCutByTheStallLimit) {
    connect_raw(mk_seam_options_default(MK_SEAM_UNIX), true, 2000);
    const std::vector<uint8_t> frame = framed(valid_);
    const size_t piece = (frame.size() + 4) / 5;
    std::thread writer([&]() {
        for (size_t at = 0; at < frame.size(); at += piece) {
            if (at) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            const size_t n = std::min(piece, frame.size() - at);
            EXPECT_EQ(send(raw_, frame.data() + at, n, MSG_NOSIGNAL), (ssize_t)n);
        }
    });
    const mk_status st = mk_seam_recv(rx_.get(), seq_.get(), into_.get());
    writer.join();
    EXPECT_EQ(st, MK_OK) << mk_last_error();
    EXPECT_EQ(mk_boundary_header_of(into_.get())->rows, 3u);
}

TEST_F(FaultyPeer, FrameOverTheReceiversLimitIsRefusedBeforeItsBody) {
    connect_raw();
    // The tail allows 64 rows of 32 floats; a sender claiming more is refused whatever it says.
    write_raw(frame_header(kTailLimit + 1));
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_FRAME);
    EXPECT_NE(msg.find("exceeds this range's limit"), std::string::npos) << msg;
    write_raw(frame_header(std::numeric_limits<uint64_t>::max()));
    EXPECT_EQ(receive(), MK_ERR_FRAME);
}

TEST_F(FaultyPeer, RowsOverTheReceiversLimitFromALargerSender) {
    // A head allowing 256 rows sends 200: the 64-row tail refuses the frame by its length
    // (its limit keeps room for a batch's 64 entries, a little over 2 rows of this width).
    mk_range_options big = mk_range_options_default();
    big.max_context = 256;
    mk_range *h = nullptr;
    MK_ASSERT_OK(mk_range_create(model_.get(), 0, 2, &big, &h));
    RangePtr head(h);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(h, &s));
    SequencePtr seq(s);
    std::vector<int32_t> ids(200);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 7) % 48);
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(h, s, ids.data(), ids.size(), nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    uint8_t *bytes = nullptr;
    size_t len = 0;
    MK_ASSERT_OK(mk_bundle_pack(b, &bytes, &len));
    BufferPtr hold(bytes);
    ASSERT_GT(len, kTailLimit);
    connect_raw();
    write_raw(framed(std::vector<uint8_t>(bytes, bytes + len)));
    EXPECT_EQ(receive(), MK_ERR_FRAME);
}

TEST_F(FaultyPeer, TruncatedFrameHeader) {
    connect_raw();
    const std::vector<uint8_t> header = frame_header(valid_.size());
    write_raw(std::vector<uint8_t>(header.begin(), header.begin() + 7));
    close_raw();
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_PEER_CLOSED);
    EXPECT_NE(msg.find("7 of 16 bytes of the frame header"), std::string::npos) << msg;
}

TEST_F(FaultyPeer, BadMagicOrVersionIsNotAFrame) {
    connect_raw();
    write_raw(frame_header(valid_.size(), 0x50545448u)); // "HTTP"
    EXPECT_EQ(receive(), MK_ERR_FRAME);
    // (the stream is out of step after a bad header; a fresh connection for the version)
    rx_.reset();
    listener_.reset();
    close_raw();
    connect_raw();
    write_raw(frame_header(valid_.size(), 0x46534b4du, 2));
    EXPECT_EQ(receive(), MK_ERR_FRAME);
}

TEST_F(FaultyPeer, UndecodableBody) {
    connect_raw();
    write_raw(framed(std::vector<uint8_t>{0xff, 0xff, 0xff, 0xff, 0x0f, 0x12}));
    EXPECT_EQ(receive(), MK_ERR_WIRE_DECODE);
}

TEST_F(FaultyPeer, AnotherRecipeDigestNextLayerOrWidthIsRefusedAndTheStreamStaysInStep) {
    connect_raw();
    // Another model (other seed): its digest.
    ModelPtr other = make_random_model(mk_hparams_seed_default(), 7);
    mk_range *oh = nullptr;
    MK_ASSERT_OK(mk_range_create(other.get(), 0, 2, nullptr, &oh));
    RangePtr other_head(oh);
    write_raw(framed(head_bundle(oh)));
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_RECIPE_DIGEST);
    EXPECT_NE(msg.find("recipe digest"), std::string::npos) << msg;
    // Another layer: a head that stops after layer 1 feeds a range starting at 3.
    mk_range *h1 = nullptr;
    MK_ASSERT_OK(mk_range_create(model_.get(), 0, 1, nullptr, &h1));
    RangePtr short_head(h1);
    write_raw(framed(head_bundle(h1)));
    EXPECT_EQ(receive(&msg), MK_ERR_SEAM_MISMATCH);
    EXPECT_NE(msg.find("starts at layer 3"), std::string::npos) << msg;
    // Another hidden width, with this model's digest and layer.
    Meshkern__V1__TensorBundle *m = meshkern__v1__tensor_bundle__unpack(nullptr, valid_.size(), valid_.data());
    ASSERT_NE(m, nullptr);
    m->tensors[0]->shape[2] = 16;
    m->tensors[0]->data.len /= 2;
    std::vector<uint8_t> narrow(meshkern__v1__tensor_bundle__get_packed_size(m));
    meshkern__v1__tensor_bundle__pack(m, narrow.data());
    m->tensors[0]->data.len *= 2;
    meshkern__v1__tensor_bundle__free_unpacked(m, nullptr);
    write_raw(framed(narrow));
    EXPECT_EQ(receive(&msg), MK_ERR_HIDDEN_WIDTH);
    EXPECT_NE(msg.find("hidden width 16"), std::string::npos) << msg;
    // Each refused frame was read whole: the next valid one is accepted.
    write_raw(framed(valid_));
    MK_ASSERT_OK(receive());
    EXPECT_EQ(mk_sequence_length(seq_.get()), 0u) << "a received boundary does not advance the sequence";
}

TEST_F(FaultyPeer, NonFiniteResidualIsRefused) {
    connect_raw();
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
        write_raw(framed(head_bundle(head_.get(), [bad](mk_bundle *b) { mk_bundle_residual(b)[37] = bad; })));
        std::string msg;
        EXPECT_EQ(receive(&msg), MK_ERR_NONFINITE);
        EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
    }
}

// The branch-free scan finds a NaN or infinity at every index, odd lengths and block
// edges included, and flags nothing finite (largest finite, denormals, -0).
TEST(NonFiniteScan, FindsEveryBadValueAndNothingElse) {
    const float finite[] = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(), -0.0f, 1.0f, -3.5e-20f};
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
    for (size_t n : {size_t(1), size_t(2), size_t(3), size_t(7), size_t(2047), size_t(2048), size_t(2049), size_t(4099)}) {
        std::vector<float> v(n + 1);
        for (size_t i = 0; i < n; i++) v[i] = finite[i % 6];
        v[n] = bad[0]; // just past the end: never read
        size_t at = 99;
        ASSERT_FALSE(mk_floats_nonfinite(v.data(), n, &at)) << n;
        for (size_t i = 0; i < n; i += (n > 16 ? 509 : 1)) {
            for (float b : bad) {
                std::vector<float> w(v.begin(), v.begin() + (long)n);
                w[i] = b;
                if (i + 1 < n) w[n - 1] = b; // the first one is reported
                ASSERT_TRUE(mk_floats_nonfinite(w.data(), n, &at)) << n << " " << i;
                EXPECT_EQ(at, i) << n;
            }
        }
        // Unaligned, as in a received frame.
        std::vector<uint8_t> raw(n * 4 + 1);
        std::memcpy(raw.data() + 1, v.data(), n * 4);
        EXPECT_FALSE(mk_floats_nonfinite(raw.data() + 1, n, &at));
        std::memcpy(raw.data() + 1 + (n - 1) * 4, &bad[1], 4);
        EXPECT_TRUE(mk_floats_nonfinite(raw.data() + 1, n, &at));
        EXPECT_EQ(at, n - 1);
    }
}

// The payload offset the transports align on is where protobuf-c puts the residual.
TEST(SeamHostBundle, PayloadOffsetIsWhereTheResidualIsPacked) {
    for (size_t rows : {1, 3, 200}) {
        for (size_t hidden : {8, 576, 4096}) {
            mk_bundle *b = nullptr;
            MK_ASSERT_OK(mk_bundle_create(1, rows, hidden, &b));
            BundlePtr bundle(b);
            float *r = mk_bundle_residual(b);
            for (size_t i = 0; i < rows * hidden; i++) r[i] = (float)i * 0.5f + 1.0f;
            mk_boundary_header h = *mk_bundle_header_of(b);
            std::memset(h.recipe_digest, 'c', MK_DIGEST_HEX_LEN);
            std::snprintf(h.request_id, sizeof h.request_id, "request-%zu", rows);
            h.step = rows * 1000;
            MK_ASSERT_OK(mk_bundle_set_header(b, &h));
            uint8_t *bytes = nullptr;
            size_t len = 0;
            MK_ASSERT_OK(mk_bundle_pack(b, &bytes, &len));
            BufferPtr hold(bytes);
            const size_t off = mk_bundle_payload_offset(b);
            ASSERT_LE(off + rows * hidden * 4, len);
            EXPECT_EQ(std::memcmp(bytes + off, r, rows * hidden * 4), 0) << rows << " x " << hidden;
            EXPECT_NE(std::memcmp(bytes + off - 1, r, 4), 0);
            // The single-copy packer writes exactly the bytes protobuf-c writes.
            for (int variant = 0; variant < 3; variant++) {
                mk_boundary_header v = h;
                v.next_layer = variant == 0 ? 0 : variant == 1 ? 300 : (int64_t)1 << 40;
                v.normalized = variant == 1;
                v.step = variant == 2 ? 0 : v.step;
                if (variant == 2) v.request_id[0] = '\0';
                MK_ASSERT_OK(mk_bundle_set_header(b, &v));
                uint8_t *mine = nullptr;
                size_t mine_len = 0;
                MK_ASSERT_OK(mk_bundle_pack(b, &mine, &mine_len));
                BufferPtr hold_mine(mine);
                ASSERT_EQ(mine_len, mk_bundle_packed_size(b));
                Meshkern__V1__TensorBundle *msg = meshkern__v1__tensor_bundle__unpack(nullptr, mine_len, mine);
                ASSERT_NE(msg, nullptr);
                std::vector<uint8_t> theirs(meshkern__v1__tensor_bundle__get_packed_size(msg));
                meshkern__v1__tensor_bundle__pack(msg, theirs.data());
                meshkern__v1__tensor_bundle__free_unpacked(msg, nullptr);
                ASSERT_EQ(theirs.size(), mine_len) << "variant " << variant;
                EXPECT_EQ(std::memcmp(theirs.data(), mine, mine_len), 0) << "variant " << variant;
            }
        }
    }
}

TEST(SeamHostBundle, NonFiniteBundleIsRefusedByTheRange) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    Pipeline p(model.get(), {2});
    mk_sequence *hs = nullptr, *ts = nullptr;
    MK_ASSERT_OK(mk_sequence_open(p.range(0), &hs));
    MK_ASSERT_OK(mk_sequence_open(p.range(1), &ts));
    SequencePtr head_seq(hs), tail_seq(ts);
    const int32_t ids[] = {4, 5, 6};
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(p.range(0), hs, ids, 3, nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    mk_bundle_residual(b)[70] = std::numeric_limits<float>::quiet_NaN();
    mk_tail_output *t = nullptr;
    EXPECT_EQ(mk_range_forward(p.range(1), ts, nullptr, 0, b, nullptr, nullptr, &t), MK_ERR_NONFINITE);
    EXPECT_EQ(t, nullptr);
}

TEST(SeamConnect, NobodyListeningIsRefusedWithinTheDeadline) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *h = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, nullptr, &h));
    RangePtr head(h);
    TempDir dir;
    const std::string path = dir.file("nobody.sock");
    mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX);
    o.address = path.c_str();
    o.connect_timeout_ms = 200;
    mk_seam *tx = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(mk_seam_connect(&o, h, &tx), MK_ERR_CONNECT);
    EXPECT_LT(seconds_since(t0), 1.5);
    EXPECT_EQ(tx, nullptr);
    // A listener that never accepts: the accepting side times out within its deadline.
    o.kind = MK_SEAM_TCP;
    o.address = "127.0.0.1:0";
    mk_seam_listener *l = nullptr;
    MK_ASSERT_OK(mk_seam_listen(&o, &l));
    ListenerPtr listener(l);
    EXPECT_EQ(std::string(mk_seam_listener_address(l)).rfind("127.0.0.1:", 0), 0u) << "binds loopback by default";
    mk_seam *rx = nullptr;
    EXPECT_EQ(mk_seam_accept(l, h, &rx), MK_ERR_PEER_TIMEOUT);
}

TEST(SeamSender, ReceiverThatHangsUpIsReportedToTheSender) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *h = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, nullptr, &h));
    RangePtr head(h);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(h, &s));
    SequencePtr seq(s);
    mk_boundary *b = nullptr;
    MK_ASSERT_OK(mk_boundary_create(h, &b));
    BoundaryPtr out(b);
    TempDir dir;
    const std::string path = dir.file("hangup.sock");
    // A raw listener: the seam connects, the peer accepts and hangs up at once.
    const int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    std::snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path.c_str());
    ASSERT_EQ(bind(lfd, (sockaddr *)&sun, sizeof sun), 0);
    ASSERT_EQ(listen(lfd, 1), 0);
    mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX);
    o.address = path.c_str();
    o.io_timeout_ms = 200;
    mk_seam *tx = nullptr;
    MK_ASSERT_OK(mk_seam_connect(&o, h, &tx));
    SeamPtr send_end(tx);
    const int peer = accept(lfd, nullptr, nullptr);
    ASSERT_GE(peer, 0);
    close(peer);
    close(lfd);
    unlink(path.c_str());
    std::vector<int32_t> ids(200, 5);
    MK_ASSERT_OK(mk_range_forward_boundary(h, s, ids.data(), ids.size(), nullptr, nullptr, b, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    mk_status st = mk_seam_send(tx, b);
    if (st == MK_OK) st = mk_seam_send_wait(tx);
    EXPECT_EQ(st, MK_ERR_PEER_CLOSED) << mk_status_name(st) << ": " << mk_last_error();
    EXPECT_LT(seconds_since(t0), 1.5);
    // The end stays failed: the next send says so at once.
    EXPECT_EQ(mk_seam_send(tx, b), MK_ERR_PEER_CLOSED);
}

// --------------------------------------------------------------------- TLS ---

class TlsPeer : public FaultyPeer {
  public:
    TempDir &dir() { return dir_; }
    mk_range *tail() { return tail_.get(); }
};

// The sending end connects from another thread (the handshake needs both ends at once).
mk_status connect_in_thread(const mk_seam_options &o, mk_range *head, const std::string &path, std::thread *t,
                            mk_status *out) {
    *t = std::thread([o, head, path, out]() {
        mk_seam_options co = o;
        co.address = path.c_str();
        mk_seam *tx = nullptr;
        *out = mk_seam_connect(&co, head, &tx);
        mk_seam_free(tx);
    });
    return MK_OK;
}

mk_status tls_accept(const mk_seam_options &server, const mk_seam_options &client, mk_range *head, mk_range *tail,
                     TempDir &dir, std::string *message) {
    const std::string path = dir.file("tls.sock");
    mk_seam_options so = server;
    so.address = path.c_str();
    mk_seam_listener *l = nullptr;
    EXPECT_EQ(mk_seam_listen(&so, &l), MK_OK) << mk_last_error();
    ListenerPtr listener(l);
    std::thread t;
    mk_status client_status = MK_OK;
    connect_in_thread(client, head, path, &t, &client_status);
    mk_seam *rx = nullptr;
    const mk_status s = mk_seam_accept(l, tail, &rx);
    *message = mk_last_error();
    mk_seam_free(rx);
    t.join();
    return s;
}

mk_seam_options tls_psk(const char *key) {
    mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX);
    o.connect_timeout_ms = 2000;
    o.io_timeout_ms = 500;
    o.tls.enabled = true;
    o.tls.psk_hex = key;
    return o;
}

mk_seam_options tls_cert(const Pki &p, const Pki &trust) {
    mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX);
    o.connect_timeout_ms = 2000;
    o.io_timeout_ms = 500;
    o.tls.enabled = true;
    o.tls.cert_file = p.cert.c_str();
    o.tls.key_file = p.key.c_str();
    o.tls.ca_file = trust.ca.c_str();
    return o;
}

TEST_F(TlsPeer, MatchingKeyOrCertificateIsAccepted) {
    std::string msg;
    EXPECT_EQ(tls_accept(tls_psk(kPsk), tls_psk(kPsk), head_.get(), tail_.get(), dir_, &msg), MK_OK) << msg;
    const Pki a = make_pki(dir_, "a");
    EXPECT_EQ(tls_accept(tls_cert(a, a), tls_cert(a, a), head_.get(), tail_.get(), dir_, &msg), MK_OK) << msg;
}

TEST_F(TlsPeer, WrongPreSharedKeyIsRefusedAtTheHandshake) {
    std::string msg;
    EXPECT_EQ(tls_accept(tls_psk(kPsk), tls_psk(kOtherPsk), head_.get(), tail_.get(), dir_, &msg), MK_ERR_AUTH) << msg;
    mk_seam_options other_identity = tls_psk(kPsk);
    other_identity.tls.psk_identity = "intruder";
    EXPECT_EQ(tls_accept(tls_psk(kPsk), other_identity, head_.get(), tail_.get(), dir_, &msg), MK_ERR_AUTH) << msg;
    // An empty identity is the default one ("meshkern"), on either end.
    mk_seam_options empty_identity = tls_psk(kPsk), named_default = tls_psk(kPsk);
    empty_identity.tls.psk_identity = "";
    named_default.tls.psk_identity = "meshkern";
    EXPECT_EQ(tls_accept(named_default, empty_identity, head_.get(), tail_.get(), dir_, &msg), MK_OK) << msg;
}

TEST_F(TlsPeer, CertificateFromAnotherCaIsRefusedAtTheHandshake) {
    const Pki a = make_pki(dir_, "a"), rogue = make_pki(dir_, "rogue");
    std::string msg;
    // The sender's certificate is signed by a CA the receiver does not trust.
    EXPECT_EQ(tls_accept(tls_cert(a, a), tls_cert(rogue, a), head_.get(), tail_.get(), dir_, &msg), MK_ERR_AUTH) << msg;
}

TEST_F(TlsPeer, PlaintextPeerIsRefusedAndNothingIsRead) {
    connect_raw(tls_psk(kPsk), false);
    write_raw(framed(valid_)); // a perfectly valid frame, but not inside TLS
    mk_seam *rx = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(mk_seam_accept(listener_.get(), tail_.get(), &rx), MK_ERR_AUTH) << mk_last_error();
    EXPECT_LT(seconds_since(t0), 2.5);
    EXPECT_EQ(rx, nullptr);
}

TEST_F(TlsPeer, SilentPeerTimesOutInTheHandshake) {
    connect_raw(tls_psk(kPsk), false);
    mk_seam *rx = nullptr;
    EXPECT_EQ(mk_seam_accept(listener_.get(), tail_.get(), &rx), MK_ERR_PEER_TIMEOUT) << mk_last_error();
}

// ---------------------------------------------------------- local transport ---

TEST(SeamLocal, BoundaryStaysInBackendMemoryAndMovesByCopy) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    mk_range *h = nullptr, *t = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 1, nullptr, &h));
    MK_ASSERT_OK(mk_range_create(model.get(), 2, 4, nullptr, &t));
    RangePtr head(h), tail(t);
    mk_sequence *hs = nullptr;
    MK_ASSERT_OK(mk_sequence_open(h, &hs));
    SequencePtr head_seq(hs);
    mk_boundary *out = nullptr, *in = nullptr;
    MK_ASSERT_OK(mk_boundary_create(h, &out));
    MK_ASSERT_OK(mk_boundary_create(t, &in));
    BoundaryPtr o(out), i(in);
    // A boundary of another range is refused.
    const int32_t ids[] = {5, 9, 11};
    EXPECT_EQ(mk_range_forward_boundary(h, hs, ids, 3, nullptr, nullptr, in, nullptr), MK_ERR_INVALID_ARGUMENT);
    MK_ASSERT_OK(mk_range_forward_boundary(h, hs, ids, 3, nullptr, nullptr, out, nullptr));
    const mk_boundary_header *hd = mk_boundary_header_of(out);
    EXPECT_EQ(hd->rows, 3u);
    EXPECT_EQ(hd->next_layer, 2);
    EXPECT_EQ(hd->step, 0u);
    EXPECT_EQ(hd->position, 0);
    // The same residual as the host-bundle path.
    mk_sequence *hs2 = nullptr;
    MK_ASSERT_OK(mk_sequence_open(h, &hs2));
    SequencePtr head_seq2(hs2);
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(h, hs2, ids, 3, nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    std::vector<float> device(3 * 36);
    MK_ASSERT_OK(mk_boundary_read(out, device.data(), device.size()));
    EXPECT_EQ(std::memcmp(device.data(), mk_bundle_residual(b), device.size() * sizeof(float)), 0);
    // The contract checks the header alone.
    mk_sequence *ts = nullptr;
    MK_ASSERT_OK(mk_sequence_open(t, &ts));
    SequencePtr tail_seq(ts);
    MK_ASSERT_OK(mk_range_check_boundary(t, ts, hd));
    mk_boundary_header later = *hd;
    later.position = 4;
    EXPECT_EQ(mk_range_check_boundary(t, ts, &later), MK_ERR_POSITIONS_SHAPE);
    EXPECT_EQ(mk_range_check_boundary(h, hs, hd), MK_ERR_HEAD_OWNS_EMBEDDING);
    later = *hd;
    later.dtype = MK_DTYPE_F16;
    EXPECT_EQ(mk_range_check_boundary(t, ts, &later), MK_ERR_DTYPE);
}

TEST(SeamOptions, NamesAndDefaults) {
    mk_seam_kind k;
    for (const char *name : {"local", "wire", "unix", "tcp", "nccl"}) {
        MK_ASSERT_OK(mk_seam_kind_from_name(name, &k));
        EXPECT_STREQ(mk_seam_kind_name(k), name);
    }
    EXPECT_EQ(mk_seam_kind_from_name("pigeon", &k), MK_ERR_INVALID_ARGUMENT);
    for (mk_status s : {MK_ERR_PEER_CLOSED, MK_ERR_PEER_TIMEOUT, MK_ERR_AUTH, MK_ERR_FRAME, MK_ERR_NONFINITE, MK_ERR_CONNECT})
        EXPECT_EQ(std::string(mk_status_name(s)).rfind("MK_ERR_", 0), 0u) << (int)s;
    const mk_seam_options o = mk_seam_options_default(MK_SEAM_TCP);
    EXPECT_GT(o.connect_timeout_ms, 0);
    EXPECT_GT(o.io_timeout_ms, 0);
    EXPECT_FALSE(o.tls.enabled);
    // A failed pair says why (its failure path frees both ends without losing the message).
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *h = nullptr, *t = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, nullptr, &h));
    MK_ASSERT_OK(mk_range_create(model.get(), 3, 5, nullptr, &t));
    RangePtr head(h), tail(t);
    mk_seam_options bad_key = mk_seam_options_default(MK_SEAM_UNIX);
    bad_key.tls.enabled = true;
    bad_key.tls.psk_hex = "not-hex-and-far-too-short";
    mk_seam *tx = nullptr, *rx = nullptr;
    EXPECT_EQ(mk_seam_pair(&bad_key, h, t, &tx, &rx), MK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mk_last_error()).find("pre-shared key"), std::string::npos) << mk_last_error();
    EXPECT_EQ(tx, nullptr);
    EXPECT_EQ(rx, nullptr);
    // This binary links no NCCL seam: choosing it says so (tests/nccl_seam covers the real one).
    const mk_seam_options nccl = mk_seam_options_default(MK_SEAM_NCCL);
    EXPECT_EQ(mk_seam_pair(&nccl, h, t, &tx, &rx), MK_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(mk_last_error()).find("no NCCL seam"), std::string::npos) << mk_last_error();
    EXPECT_EQ(tx, nullptr);
    EXPECT_EQ(rx, nullptr);
    // Only stream transports and NCCL (through an id file) cross processes.
    mk_seam_listener *l = nullptr;
    const mk_seam_options local = mk_seam_options_default(MK_SEAM_LOCAL);
    EXPECT_EQ(mk_seam_listen(&local, &l), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(mk_seam_listen(&nccl, &l), MK_ERR_INVALID_ARGUMENT); // no id file named
    EXPECT_NE(std::string(mk_last_error()).find("id file"), std::string::npos) << mk_last_error();
}

// ------------------------------------------------------------ frame header ---
// host/seam/frame.c on its own: the 16-byte header, the wire-format walker, the body
// checks. Each refusal on the smallest input that shows it, with its own message.


std::vector<uint8_t> header_bytes(uint64_t length, unsigned align) {
    std::vector<uint8_t> h(MK_FRAME_HEADER_BYTES);
    mk_frame_header_encode(h.data(), length, align);
    return h;
}

TEST(FrameHeader, LayoutAndLimitAreTheDocumentedOnes) {
    EXPECT_EQ(mk_frame_limit(64, 32), kTailLimit);
    EXPECT_EQ(mk_frame_limit(1, 1), uint64_t(4 + 4 + 1024 + 64 * 128)); // a batch of 64 entries fits the overhead
    const std::vector<uint8_t> h = header_bytes(0x0102030405060708ull, 63 + 64); // align is taken modulo 64
    const uint8_t want[16] = {'M', 'K', 'S', 'F', 1, 0, 63, 0, 8, 7, 6, 5, 4, 3, 2, 1};
    EXPECT_EQ(std::memcmp(h.data(), want, 16), 0);
    for (size_t off : {0, 1, 63, 64, 65, 127}) EXPECT_EQ((off + mk_frame_shift(off)) % 64, 0u) << off;
    EXPECT_EQ(mk_frame_shift(0), 0u);
    EXPECT_EQ(mk_frame_shift(1), 63u);
    EXPECT_EQ(mk_frame_shift(64), 0u);
}

TEST(FrameHeader, LengthAndAlignmentAcceptedUpToTheirLimits) {
    for (uint64_t len : {uint64_t(1), kTailLimit - 1, kTailLimit}) {
        for (unsigned align : {0u, 1u, 63u}) {
            uint64_t got = 0;
            unsigned got_align = 99;
            MK_ASSERT_OK(mk_frame_header_decode(header_bytes(len, align).data(), kTailLimit, &got, &got_align));
            EXPECT_EQ(got, len);
            EXPECT_EQ(got_align, align);
        }
    }
}

TEST(FrameHeader, EachFieldIsRefusedWithItsOwnMessage) {
    uint64_t len = 0;
    unsigned align = 0;
    std::vector<uint8_t> h = header_bytes(100, 0);
    h[3] = 'G'; // the magic's last byte: every byte of it counts
    EXPECT_ERROR(mk_frame_header_decode(h.data(), kTailLimit, &len, &align), MK_ERR_FRAME, "bad magic 0x47534b4d");
    h = header_bytes(100, 0);
    h[0] = 'm';
    EXPECT_ERROR(mk_frame_header_decode(h.data(), kTailLimit, &len, &align), MK_ERR_FRAME, "bad magic 0x46534b6d");
    struct Version {
        uint8_t lo, hi;
        const char *text;
    };
    for (const Version &ver : {Version{0, 0, "version 0 is not"}, Version{2, 0, "version 2 is not the supported version 1"},
                               Version{1, 1, "version 257 is not"}}) {
        h = header_bytes(100, 0);
        h[4] = ver.lo;
        h[5] = ver.hi;
        EXPECT_ERROR(mk_frame_header_decode(h.data(), kTailLimit, &len, &align), MK_ERR_FRAME, ver.text);
    }
    h = header_bytes(100, 0);
    h[6] = 64; // one past the last hint
    EXPECT_ERROR(mk_frame_header_decode(h.data(), kTailLimit, &len, &align), MK_ERR_FRAME,
                 "alignment hint 64 is not below 64");
    h[6] = 0;
    h[7] = 1;
    EXPECT_ERROR(mk_frame_header_decode(h.data(), kTailLimit, &len, &align), MK_ERR_FRAME, "alignment hint 256");
    EXPECT_ERROR(mk_frame_header_decode(header_bytes(0, 0).data(), kTailLimit, &len, &align), MK_ERR_FRAME,
                 "empty body");
    EXPECT_ERROR(mk_frame_header_decode(header_bytes(kTailLimit + 1, 0).data(), kTailLimit, &len, &align), MK_ERR_FRAME,
                 "seam frame of 17665 bytes exceeds this range's limit of 17664 bytes");
    // The length's top byte is read too: 2^56 + 1 is not 1.
    EXPECT_ERROR(mk_frame_header_decode(header_bytes((uint64_t(1) << 56) + 1, 0).data(), kTailLimit, &len, &align),
                 MK_ERR_FRAME, "exceeds this range's limit");
}

// --------------------------------------------------------- frame wire walker ---

// Protobuf wire bytes written by hand: a malformed message is easiest to say this way.
struct Pb {
    std::vector<uint8_t> b;
    Pb &varint(uint64_t v) {
        while (v >= 0x80) {
            b.push_back(uint8_t(v | 0x80));
            v >>= 7;
        }
        b.push_back(uint8_t(v));
        return *this;
    }
    Pb &key(unsigned field, unsigned wire_type) { return varint((uint64_t(field) << 3) | wire_type); }
    Pb &u(unsigned field, uint64_t v) { return key(field, 0).varint(v); }
    Pb &bytes(unsigned field, const std::vector<uint8_t> &v) {
        key(field, 2).varint(v.size());
        b.insert(b.end(), v.begin(), v.end());
        return *this;
    }
    Pb &str(unsigned field, const std::string &s) { return bytes(field, std::vector<uint8_t>(s.begin(), s.end())); }
    Pb &raw(std::initializer_list<uint8_t> v) {
        b.insert(b.end(), v.begin(), v.end());
        return *this;
    }
};

mk_status parse(const Pb &pb, mk_bundle_view *view) { return mk_bundle_view_parse(pb.b.data(), pb.b.size(), view); }

// The codec is the one place that writes field numbers; the .proto is where they are
// defined. protobuf-c's descriptors are generated from the .proto, so they are the judge:
// every field of both messages, by name, with the codec's number, and nothing unknown.
TEST(BundleCodec, FieldNumbersAreTheProtosEveryOne) {
    const ProtobufCMessageDescriptor *bundle = &meshkern__v1__tensor_bundle__descriptor;
    const ProtobufCMessageDescriptor *tensor = &meshkern__v1__tensor__descriptor;
    const ProtobufCMessageDescriptor *entry = &meshkern__v1__bundle_entry__descriptor;
    ASSERT_EQ(bundle->n_fields, 13u);
    ASSERT_EQ(tensor->n_fields, 5u);
    ASSERT_EQ(entry->n_fields, 4u);
    for (unsigned i = 0; i < entry->n_fields; i++) {
        const std::string name = std::string("BundleEntry.") + entry->fields[i].name;
        EXPECT_EQ(mk_bundle_field_number(name.c_str()), entry->fields[i].id) << name;
    }
    for (unsigned i = 0; i < bundle->n_fields; i++)
        EXPECT_EQ(mk_bundle_field_number(bundle->fields[i].name), bundle->fields[i].id) << bundle->fields[i].name;
    for (unsigned i = 0; i < tensor->n_fields; i++) {
        const std::string name = std::string("Tensor.") + tensor->fields[i].name;
        EXPECT_EQ(mk_bundle_field_number(name.c_str()), tensor->fields[i].id) << name;
    }
    EXPECT_EQ(mk_bundle_field_number("no_such_field"), 0u);
    EXPECT_EQ(mk_bundle_field_number(nullptr), 0u);
}

TEST(FrameView, MalformedWireBytesAreRefusedEachByName) {
    mk_bundle_view v;
    EXPECT_ERROR(parse(Pb().key(1, 0), &v), MK_ERR_WIRE_DECODE, "truncated varint");
    EXPECT_ERROR(parse(Pb().key(1, 0).raw({0x80}), &v), MK_ERR_WIRE_DECODE, "truncated varint");
    // A varint of ten bytes: the last may only carry bit 63.
    EXPECT_ERROR(parse(Pb().key(12, 0).raw({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}), &v),
                 MK_ERR_WIRE_DECODE, "varint overflows 64 bits");
    MK_ASSERT_OK(parse(Pb().key(12, 0).raw({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), &v));
    EXPECT_EQ(v.msg.step, UINT64_MAX);
    // A length one past what remains; exactly what remains is fine.
    EXPECT_ERROR(parse(Pb().key(3, 2).raw({3, 'a', 'b'}), &v), MK_ERR_WIRE_DECODE, "length past the end");
    MK_ASSERT_OK(parse(Pb().key(3, 2).raw({2, 'a', 'b'}), &v));
    EXPECT_STREQ(v.msg.adapter, "ab");
    // Unknown fields of every supported wire type are skipped, truncated ones refused.
    EXPECT_ERROR(parse(Pb().key(17, 1).raw({1, 2, 3, 4, 5, 6, 7}), &v), MK_ERR_WIRE_DECODE, "truncated fixed64");
    EXPECT_ERROR(parse(Pb().key(17, 5).raw({1, 2, 3}), &v), MK_ERR_WIRE_DECODE, "truncated fixed32");
    EXPECT_ERROR(parse(Pb().key(17, 2).raw({4, 1, 2, 3}), &v), MK_ERR_WIRE_DECODE, "length past the end");
    MK_ASSERT_OK(parse(Pb().key(17, 1).raw({1, 2, 3, 4, 5, 6, 7, 8}).key(18, 5).raw({1, 2, 3, 4}).u(19, 300)
                           .str(20, "x").u(1, 7),
                       &v));
    EXPECT_EQ(v.msg.schema_version, 7u) << "a field after skipped ones is still read";
    for (unsigned wt : {3u, 4u, 6u, 7u})
        EXPECT_ERROR(parse(Pb().key(17, wt), &v), MK_ERR_WIRE_DECODE, "unsupported wire type") << wt;
    // Inside a BundleEntry likewise: unknown fields skipped, the known ones read.
    MK_ASSERT_OK(parse(Pb().bytes(13, Pb().u(9, 1).str(1, "q").u(4, 2).u(3, 5).u(2, 8).b), &v));
    ASSERT_EQ(v.msg.n_entries, 1u);
    EXPECT_STREQ(v.msg.entries[0]->request_id, "q");
    EXPECT_EQ(v.msg.entries[0]->rows, 2u);
    EXPECT_EQ(v.msg.entries[0]->position, 5);
    EXPECT_EQ(v.msg.entries[0]->step, 8u);
    EXPECT_ERROR(parse(Pb().key(0, 0).varint(1), &v), MK_ERR_WIRE_DECODE, "field number 0");
    // Field numbers end at 2^29 - 1 (protobuf-c refuses more): 2^32 + 12 narrowed to 32 bits
    // would read as field 12 (step), 2^32 + 4 in an entry as its rows, 2^32 + 2 in a tensor
    // as its dtype. The largest legal number is an unknown field, skipped.
    const uint64_t past = uint64_t(1) << 32;
    EXPECT_ERROR(parse(Pb().varint((past + 12) << 3).varint(5), &v), MK_ERR_WIRE_DECODE, "field number past 2^29 - 1");
    EXPECT_ERROR(parse(Pb().varint(uint64_t(536870912) << 3).varint(5), &v), MK_ERR_WIRE_DECODE, "field number past");
    MK_ASSERT_OK(parse(Pb().varint(uint64_t(536870911) << 3).varint(5).u(12, 3), &v));
    EXPECT_EQ(v.msg.step, 3u);
    EXPECT_ERROR(parse(Pb().bytes(13, Pb().varint((past + 4) << 3).varint(2).b), &v), MK_ERR_WIRE_DECODE,
                 "field number past");
    EXPECT_ERROR(parse(Pb().bytes(7, Pb().varint((past + 2) << 3).varint(1).b), &v), MK_ERR_WIRE_DECODE,
                 "field number past");
    EXPECT_ERROR(mk_bundle_view_parse(nullptr, 1, &v), MK_ERR_WIRE_DECODE, "no bytes");
    MK_ASSERT_OK(mk_bundle_view_parse(nullptr, 0, &v));
    EXPECT_EQ(v.msg.n_tensors, 0u);
    EXPECT_EQ(v.msg.tensors, nullptr);
    EXPECT_EQ(v.msg.positions, nullptr);
}

TEST(FrameView, EveryKnownFieldInsistsOnItsWireType) {
    mk_bundle_view v;
    for (unsigned field : {1u, 2u, 5u, 6u, 11u, 12u}) // varints given as length-delimited
        EXPECT_ERROR(parse(Pb().str(field, "x"), &v), MK_ERR_WIRE_DECODE, "wrong wire type") << field;
    for (unsigned field : {3u, 4u, 7u, 8u, 9u, 10u, 13u}) // length-delimited given as varints
        EXPECT_ERROR(parse(Pb().u(field, 1), &v), MK_ERR_WIRE_DECODE, "wrong wire type") << field;
    // Inside a BundleEntry: the request id length-delimited, step, position and rows varints.
    for (const Pb &e : {Pb().u(1, 1), Pb().str(2, "x"), Pb().str(3, "x"), Pb().str(4, "x")})
        EXPECT_ERROR(parse(Pb().bytes(13, e.b), &v), MK_ERR_WIRE_DECODE, "wrong wire type");
    // Inside a Tensor: name, data length-delimited; dtype, byte order varints; shape either.
    for (const Pb &t : {Pb().u(1, 1), Pb().str(2, "x"), Pb().str(4, "x"), Pb().u(5, 1), Pb().key(3, 5).raw({0, 0, 0, 0})})
        for (unsigned field : {7u, 8u})
            EXPECT_ERROR(parse(Pb().bytes(field, t.b), &v), MK_ERR_WIRE_DECODE, "wrong wire type") << field;
    EXPECT_ERROR(parse(Pb().bytes(7, Pb().key(2, 0).b), &v), MK_ERR_WIRE_DECODE, "truncated varint");
}

TEST(FrameView, TensorsShapesAndStringsAsTheCheckerNeedsThem) {
    mk_bundle_view v;
    const std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6, 7, 8};
    Pb body;
    body.bytes(7, Pb().str(1, "residual_stream").u(2, 1).bytes(3, Pb().varint(1).varint(2).varint(300).b).u(4, 1)
                      .u(6, 99).bytes(5, data).key(7, 5).raw({1, 2, 3, 4}).b); // unknown Tensor fields are skipped
    // A second tensor is parsed (it must be well-formed) and counted, never kept.
    body.bytes(7, Pb().str(1, "second").u(3, 9).b);
    // Unpacked shape entries append.
    body.bytes(8, Pb().str(1, "positions").u(3, 1).u(3, 2).u(2, 5).b);
    MK_ASSERT_OK(parse(body, &v));
    ASSERT_EQ(v.msg.n_tensors, 2u);
    ASSERT_EQ(v.msg.tensors[0], &v.residual);
    EXPECT_STREQ(v.residual.name, "residual_stream");
    EXPECT_EQ(v.residual.dtype, 1);
    EXPECT_EQ(v.residual.byte_order, 1);
    ASSERT_EQ(v.residual.n_shape, 3u);
    EXPECT_EQ(v.residual.shape[0], 1u);
    EXPECT_EQ(v.residual.shape[2], 300u);
    ASSERT_EQ(v.residual.data.len, data.size());
    // Zero copy: the data points into the caller's bytes.
    EXPECT_GE(v.residual.data.data, body.b.data());
    EXPECT_LT(v.residual.data.data, body.b.data() + body.b.size());
    EXPECT_EQ(std::memcmp(v.residual.data.data, data.data(), data.size()), 0);
    ASSERT_EQ(v.msg.positions, &v.positions);
    ASSERT_EQ(v.positions.n_shape, 2u);
    EXPECT_EQ(v.positions.shape[1], 2u);
    EXPECT_EQ(v.positions.dtype, 5);
    // A malformed second tensor is refused though it is not kept.
    body.bytes(7, Pb().str(1, "third").u(5, 1).b);
    EXPECT_ERROR(parse(body, &v), MK_ERR_WIRE_DECODE, "wrong wire type");
    // A ninth dimension is counted, not stored: the view's arrays hold eight.
    Pb deep;
    deep.bytes(8, Pb().u(3, 77).b);
    Pb dims;
    for (int i = 0; i < 9; i++) dims.varint(10 + i);
    deep.bytes(7, Pb().bytes(3, dims.b).b);
    MK_ASSERT_OK(parse(deep, &v));
    EXPECT_EQ(v.residual.n_shape, 9u);
    EXPECT_EQ(v.residual.shape[7], 17u);
    EXPECT_EQ(v.positions_shape[0], 77u) << "the ninth dimension was written past the residual's shape";
    // Strings longer than the view keeps are cut (the checker refuses them anyway).
    for (size_t n : {size_t(254), size_t(255), size_t(256), size_t(400)}) {
        MK_ASSERT_OK(parse(Pb().str(3, std::string(n, 'a')).str(10, std::string(n, 'r')), &v));
        EXPECT_EQ(std::strlen(v.msg.adapter), std::min<size_t>(n, MK_VIEW_STRING - 1)) << n;
        EXPECT_EQ(std::strlen(v.msg.request_id), std::min<size_t>(n, MK_VIEW_STRING - 1)) << n;
    }
    MK_ASSERT_OK(parse(Pb().str(4, "bp").str(9, "dg").u(2, 1).u(5, 9).u(6, 1).u(11, 1), &v));
    EXPECT_STREQ(v.msg.boundary_point, "bp");
    EXPECT_STREQ(v.msg.runtime_recipe_digest, "dg");
    EXPECT_EQ(v.msg.architecture, 1);
    EXPECT_EQ(v.msg.next_layer, 9);
    EXPECT_TRUE(v.msg.normalized);
    EXPECT_TRUE(v.msg.has_next_layer);
}

// A packed boundary body of rows x hidden at `position` (positions continuing it), for
// the body checks; `edit` changes the bundle before it is packed.
std::vector<uint8_t> body_of(size_t rows, size_t hidden, int64_t position,
                             const std::function<void(mk_bundle *)> &edit = nullptr) {
    mk_bundle *b = nullptr;
    EXPECT_EQ(mk_bundle_create(1, rows, hidden, &b), MK_OK);
    BundlePtr bundle(b);
    mk_boundary_header h = *mk_bundle_header_of(b);
    std::memset(h.recipe_digest, 'c', MK_DIGEST_HEX_LEN);
    h.recipe_digest[MK_DIGEST_HEX_LEN] = '\0';
    h.next_layer = 3;
    h.position = position;
    h.step = 4;
    std::snprintf(h.request_id, sizeof h.request_id, "req-7");
    EXPECT_EQ(mk_bundle_set_header(b, &h), MK_OK) << mk_last_error();
    for (size_t i = 0; i < rows * hidden; i++) mk_bundle_residual(b)[i] = (float)i + 0.25f;
    for (size_t i = 0; i < rows; i++) mk_bundle_positions(b)[i] = (int32_t)(position + (int64_t)i);
    if (edit) edit(b);
    uint8_t *bytes = nullptr;
    size_t len = 0;
    EXPECT_EQ(mk_bundle_pack(b, &bytes, &len), MK_OK) << mk_last_error();
    std::vector<uint8_t> out(bytes, bytes + len);
    mk_buffer_free(bytes);
    return out;
}

TEST(FrameBody, ValidBodyGivesTheHeaderAndPointsAtTheResidualInPlace) {
    const std::vector<uint8_t> body = body_of(3, 8, 7);
    mk_boundary_header h;
    const uint8_t *residual = nullptr;
    MK_ASSERT_OK(mk_bundle_decode_body(body.data(), body.size(), &h, &residual));
    EXPECT_EQ(h.rows, 3u);
    EXPECT_EQ(h.hidden, 8u);
    EXPECT_EQ(h.batch, 1u);
    EXPECT_EQ(h.position, 7);
    EXPECT_EQ(h.next_layer, 3);
    EXPECT_EQ(h.step, 4u);
    EXPECT_STREQ(h.request_id, "req-7");
    ASSERT_GE(residual, body.data());
    ASSERT_LE(residual + 24 * 4, body.data() + body.size());
    float last;
    std::memcpy(&last, residual + 23 * 4, 4);
    EXPECT_EQ(last, 23.25f);
}

TEST(FrameBody, PositionsMustContinueRowZerosToTheLastRow) {
    mk_boundary_header h;
    const uint8_t *residual = nullptr;
    // The last row one off (the smallest break), a middle row, and a row repeated.
    std::vector<uint8_t> body = body_of(3, 8, 7, [](mk_bundle *b) { mk_bundle_positions(b)[2] = 10; });
    EXPECT_ERROR(mk_bundle_decode_body(body.data(), body.size(), &h, &residual), MK_ERR_POSITIONS_SHAPE,
                 "bundle position 10 at row 2 does not continue row 0's 7");
    body = body_of(3, 8, 7, [](mk_bundle *b) { mk_bundle_positions(b)[1] = 7; });
    EXPECT_ERROR(mk_bundle_decode_body(body.data(), body.size(), &h, &residual), MK_ERR_POSITIONS_SHAPE,
                 "bundle position 7 at row 1");
    // One row: nothing to continue.
    body = body_of(1, 8, 41);
    MK_ASSERT_OK(mk_bundle_decode_body(body.data(), body.size(), &h, &residual));
    EXPECT_EQ(h.position, 41);
    // The message checks run on the view: a body without a digest is refused by them.
    body = body_of(2, 8, 0);
    Meshkern__V1__TensorBundle *m = meshkern__v1__tensor_bundle__unpack(nullptr, body.size(), body.data());
    ASSERT_NE(m, nullptr);
    char *digest = m->runtime_recipe_digest;
    m->runtime_recipe_digest = (char *)"";
    std::vector<uint8_t> no_digest(meshkern__v1__tensor_bundle__get_packed_size(m));
    meshkern__v1__tensor_bundle__pack(m, no_digest.data());
    m->runtime_recipe_digest = digest;
    meshkern__v1__tensor_bundle__free_unpacked(m, nullptr);
    EXPECT_ERROR(mk_bundle_decode_body(no_digest.data(), no_digest.size(), &h, &residual), MK_ERR_MISSING_FIELD,
                 "runtime_recipe_digest");
}

// ---------------------------------------------------------- stream in step ---

// The residual a packed bundle carries, as floats.
std::vector<float> residual_of(const std::vector<uint8_t> &bundle_bytes) {
    Meshkern__V1__TensorBundle *m = meshkern__v1__tensor_bundle__unpack(nullptr, bundle_bytes.size(), bundle_bytes.data());
    EXPECT_NE(m, nullptr);
    if (!m) return {};
    std::vector<float> r(m->tensors[0]->data.len / sizeof(float));
    std::memcpy(r.data(), m->tensors[0]->data.data, r.size() * sizeof(float));
    meshkern__v1__tensor_bundle__free_unpacked(m, nullptr);
    return r;
}

// A frame read whole but refused (body undecodable, positions broken, a value not finite,
// a body exactly at the limit that is not a bundle) leaves the stream in step: the next
// frame is accepted and carries its own residual.
TEST_F(FaultyPeer, RefusedBodiesLeaveTheStreamInStep) {
    connect_raw();
    std::string msg;
    size_t bytes = 0;
    write_raw(framed(std::vector<uint8_t>{0x08}));
    EXPECT_EQ(receive(&msg), MK_ERR_WIRE_DECODE);
    EXPECT_NE(msg.find("truncated varint"), std::string::npos) << msg;
    EXPECT_EQ(mk_seam_bytes(rx_.get()), bytes += 16 + 1);
    const std::vector<uint8_t> gap = head_bundle(head_.get(), [](mk_bundle *b) { mk_bundle_positions(b)[2] = 9; });
    write_raw(framed(gap));
    EXPECT_EQ(receive(&msg), MK_ERR_POSITIONS_SHAPE);
    EXPECT_NE(msg.find("position 9 at row 2"), std::string::npos) << msg;
    EXPECT_EQ(mk_seam_bytes(rx_.get()), bytes += 16 + gap.size());
    write_raw(framed(head_bundle(head_.get(), [](mk_bundle *b) { mk_bundle_residual(b)[95] = NAN; })));
    EXPECT_EQ(receive(&msg), MK_ERR_NONFINITE);
    write_raw(framed(std::vector<uint8_t>(kTailLimit, 0))); // exactly the limit: read, then refused as a bundle
    EXPECT_EQ(receive(&msg), MK_ERR_WIRE_DECODE) << msg;
    EXPECT_NE(msg.find("field number 0"), std::string::npos) << msg;
    const std::vector<uint8_t> other = head_bundle(head_.get(), [](mk_bundle *b) { mk_bundle_residual(b)[5] = 42.0f; });
    write_raw(framed(other));
    MK_ASSERT_OK(receive());
    std::vector<float> got(3 * 32);
    MK_ASSERT_OK(mk_boundary_read(into_.get(), got.data(), got.size()));
    EXPECT_EQ(got, residual_of(other));
    EXPECT_EQ(got[5], 42.0f);
}

// The scan covers every value of every row: the first and the very last.
TEST_F(FaultyPeer, NonFiniteFirstOrLastValueIsRefused) {
    connect_raw();
    for (size_t at : {size_t(0), size_t(3 * 32 - 1)}) {
        write_raw(framed(head_bundle(head_.get(), [at](mk_bundle *b) { mk_bundle_residual(b)[at] = INFINITY; })));
        std::string msg;
        EXPECT_EQ(receive(&msg), MK_ERR_NONFINITE);
        const std::string want = "value " + std::to_string(at) + " (row " + std::to_string(at / 32) + ")";
        EXPECT_NE(msg.find(want), std::string::npos) << msg;
    }
    write_raw(framed(valid_));
    MK_ASSERT_OK(receive());
}

// The alignment hint places the body; nothing trusts it.
TEST_F(FaultyPeer, AWrongAlignmentHintIsOnlyAHint) {
    connect_raw();
    for (unsigned hint : {13u, 63u}) {
        std::vector<uint8_t> f = header_bytes(valid_.size(), hint);
        f.insert(f.end(), valid_.begin(), valid_.end());
        write_raw(f);
        MK_ASSERT_OK(receive());
        std::vector<float> got(3 * 32);
        MK_ASSERT_OK(mk_boundary_read(into_.get(), got.data(), got.size()));
        EXPECT_EQ(got, residual_of(valid_)) << hint;
    }
}

// A frame header that is not one leaves the stream out of step: every later call reports
// the first failure at once, even with a valid frame waiting.
TEST_F(FaultyPeer, OutOfStepStreamReportsTheFirstFailureEveryTime) {
    connect_raw();
    std::vector<uint8_t> bad = header_bytes(valid_.size(), 0);
    bad[6] = 64;
    write_raw(bad);
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_FRAME);
    EXPECT_NE(msg.find("alignment hint 64"), std::string::npos) << msg;
    write_raw(framed(valid_));
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(receive(&msg), MK_ERR_FRAME);
        EXPECT_NE(msg.find("alignment hint 64"), std::string::npos) << msg;
        EXPECT_NE(msg.find("seam unusable since"), std::string::npos) << msg;
    }
}

// A frame the socket does not take at once: the rest goes to the I/O thread while this
// thread receives it; the receiver gets every byte, and send_wait reports the write.
TEST(SeamStream, FrameLargerThanTheSocketBufferArrivesWhole) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options ro = mk_range_options_default();
    ro.max_context = 256;
    mk_range *h = nullptr, *t = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, &ro, &h));
    MK_ASSERT_OK(mk_range_create(model.get(), 3, 5, &ro, &t));
    RangePtr head(h), tail(t);
    mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX);
    o.io_timeout_ms = 5000;
    mk_seam *tx = nullptr, *rx = nullptr;
    MK_ASSERT_OK(mk_seam_pair(&o, h, t, &tx, &rx));
    SeamPtr send_end(tx), recv_end(rx);
    const int small = 4096;
    ASSERT_EQ(setsockopt(mk_seam_stream_fd(tx), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    mk_boundary *out = nullptr, *in = nullptr;
    MK_ASSERT_OK(mk_boundary_create(h, &out));
    MK_ASSERT_OK(mk_boundary_create(t, &in));
    BoundaryPtr o_(out), i_(in);
    const size_t rows = 256, hidden = 32;
    mk_boundary_header_defaults(&out->h);
    std::snprintf(out->h.recipe_digest, sizeof out->h.recipe_digest, "%s", mk_range_recipe_digest(h));
    out->h.next_layer = 3;
    out->h.rows = rows;
    out->h.hidden = hidden;
    for (size_t i = 0; i < rows * hidden; i++) out->payload[i] = (float)(i % 1021) * 0.5f - 7.0f;
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(t, &s));
    SequencePtr seq(s);
    for (int round = 0; round < 2; round++) {
        MK_ASSERT_OK(mk_seam_send(tx, out));
        MK_ASSERT_OK(mk_seam_recv(rx, s, in));
        MK_ASSERT_OK(mk_seam_send_wait(tx));
        ASSERT_EQ(in->h.rows, rows);
        EXPECT_EQ(std::memcmp(in->payload, out->payload, rows * hidden * sizeof(float)), 0) << "round " << round;
        out->payload[0] += 1.0f;
    }
    EXPECT_EQ(mk_seam_bytes(tx), mk_seam_bytes(rx));
    EXPECT_GT(mk_seam_bytes(rx), 2 * rows * hidden * sizeof(float));
}

// -------------------------------------------------------------- socket I/O ---

// Two connected non-blocking ends (a Unix socketpair), closed on destruction.
struct IoPair {
    mk_io a{-1, nullptr}, b{-1, nullptr};
    IoPair() {
        int fds[2];
        EXPECT_EQ(mk_socket_pair(fds), MK_OK);
        a.fd = fds[0];
        b.fd = fds[1];
    }
    ~IoPair() {
        mk_io_close(&a);
        mk_io_close(&b);
    }
};

std::vector<uint8_t> pattern(size_t n) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (uint8_t)((i * 2654435761u) >> 13);
    return v;
}

void shrink_send_buffer(int fd) {
    const int small = 4096;
    ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
}

// A write the socket takes in many pieces, read in pieces of another size: every byte in
// order (the written count advances by each piece, not to it).
void expect_large_transfer(mk_io *writer, mk_io *reader) {
    const std::vector<uint8_t> sent = pattern((size_t(1) << 20) + 13);
    mk_status ws = MK_ERR_INTERNAL;
    std::thread t([&]() { ws = mk_io_write(writer, sent.data(), sent.size(), mk_deadline_ms(5000, 5000), "blob"); });
    std::vector<uint8_t> got(sent.size());
    mk_status rs = MK_OK;
    for (size_t at = 0; at < got.size() && rs == MK_OK; at += 70001)
        rs = mk_io_read(reader, got.data() + at, std::min<size_t>(70001, got.size() - at), mk_deadline_ms(5000, 5000),
                        "blob");
    t.join();
    EXPECT_EQ(ws, MK_OK) << mk_last_error();
    EXPECT_EQ(rs, MK_OK) << mk_last_error();
    EXPECT_TRUE(got == sent) << "the bytes arrived out of order or repeated";
}

TEST(SeamIo, WriteLargerThanOneSendArrivesInOrder) {
    IoPair p;
    shrink_send_buffer(p.a.fd);
    expect_large_transfer(&p.a, &p.b);
}

// write_now takes what the socket takes and says how much; the rest can follow.
TEST(SeamIo, WriteNowStopsWhereTheSocketIsFullAndCountsWhatItTook) {
    IoPair p;
    shrink_send_buffer(p.a.fd);
    const std::vector<uint8_t> sent = pattern(size_t(1) << 20);
    size_t written = 12345;
    MK_ASSERT_OK(mk_io_write_now(&p.a, sent.data(), sent.size(), &written, "blob"));
    ASSERT_GT(written, 0u);
    ASSERT_LT(written, sent.size());
    mk_status ws = MK_ERR_INTERNAL;
    std::thread t([&]() {
        ws = mk_io_write(&p.a, sent.data() + written, sent.size() - written, mk_deadline_ms(5000, 5000), "blob");
    });
    std::vector<uint8_t> got(sent.size());
    const mk_status rs = mk_io_read(&p.b, got.data(), got.size(), mk_deadline_ms(5000, 5000), "blob");
    t.join();
    MK_ASSERT_OK(rs);
    MK_ASSERT_OK(ws);
    EXPECT_TRUE(got == sent);
}

// The no-wait read (the rendezvous's look at a stranger's first bytes): it takes what the
// socket holds and stops there at once, counting it; nothing there is 0 bytes, not a wait; a
// closed peer is named.
TEST(SeamIo, ReadNowTakesWhatIsThereAndStops) {
    IoPair p;
    const std::vector<uint8_t> sent = pattern(10);
    MK_ASSERT_OK(mk_io_write(&p.a, sent.data(), sent.size(), mk_deadline_ms(5000, 5000), "blob"));
    std::vector<uint8_t> got(100, 0);
    size_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200 && n < sent.size(); i++) { // the bytes may take a moment to land
        size_t more = 12345;
        MK_ASSERT_OK(mk_io_read_now(&p.b, got.data() + n, got.size() - n, &more, "blob"));
        ASSERT_LE(more, sent.size() - n);
        n += more;
        if (n < sent.size()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(n, sent.size());
    EXPECT_TRUE(std::equal(sent.begin(), sent.end(), got.begin()));
    size_t none = 99;
    MK_ASSERT_OK(mk_io_read_now(&p.b, got.data(), got.size(), &none, "blob"));
    EXPECT_EQ(none, 0u);
    EXPECT_LT(seconds_since(t0), 2.0);
    mk_io_close(&p.a);
    size_t after = 99;
    EXPECT_ERROR(mk_io_read_now(&p.b, got.data(), got.size(), &after, "blob"), MK_ERR_PEER_CLOSED, "closed the connection");
}

TEST(SeamIo, EachFailureNamesWhatAndHowFar) {
    {
        IoPair p;
        shrink_send_buffer(p.a.fd);
        const std::vector<uint8_t> big = pattern(size_t(1) << 20);
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_ERROR(mk_io_write(&p.a, big.data(), big.size(), mk_deadline_ms(100, 100), "blob"), MK_ERR_PEER_TIMEOUT,
                     "the peer did not accept the blob before the deadline");
        EXPECT_LT(seconds_since(t0), 1.0);
    }
    {
        IoPair p;
        uint8_t buf[10];
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_ERROR(mk_io_read(&p.b, buf, sizeof buf, mk_deadline_ms(100, 100), "blob"), MK_ERR_PEER_TIMEOUT,
                     "the peer did not send the blob before the deadline");
        EXPECT_GE(seconds_since(t0), 0.09);
        EXPECT_LT(seconds_since(t0), 1.0);
        MK_ASSERT_OK(mk_io_write(&p.a, "abc", 3, mk_deadline_ms(100, 100), "x"));
        mk_io_close(&p.a);
        EXPECT_EQ(p.a.fd, -1);
        EXPECT_ERROR(mk_io_read(&p.b, buf, sizeof buf, mk_deadline_ms(100, 100), "blob"), MK_ERR_PEER_CLOSED,
                     "closed the connection after 3 of 10 bytes of the blob");
        EXPECT_ERROR(mk_io_write(&p.b, buf, sizeof buf, mk_deadline_ms(100, 100), "blob"), MK_ERR_PEER_CLOSED,
                     "after 0 of 10 bytes of the blob");
        size_t written = 99;
        EXPECT_ERROR(mk_io_write_now(&p.b, buf, sizeof buf, &written, "blob"), MK_ERR_PEER_CLOSED, "after 0 of 10");
        EXPECT_EQ(written, 0u);
        mk_io_close(&p.a); // twice: harmless
    }
    {
        // Anything else the socket says is an I/O failure, named (here: no socket at all).
        mk_io none{-1, nullptr};
        uint8_t buf[4] = {0};
        EXPECT_ERROR(mk_io_read(&none, buf, sizeof buf, mk_deadline_ms(100, 100), "blob"), MK_ERR_IO,
                     "reading the blob failed: Bad file descriptor");
        EXPECT_ERROR(mk_io_write(&none, buf, sizeof buf, mk_deadline_ms(100, 100), "blob"), MK_ERR_IO,
                     "writing the blob failed: Bad file descriptor");
    }
}

// A TCP peer that resets the connection (close with linger 0) is a close, not an I/O error.
TEST(SeamIo, ResetByTheTcpPeerIsAClose) {
    int lfd = -1, cfd = -1, afd = -1;
    char bound[300];
    MK_ASSERT_OK(mk_socket_listen(MK_SEAM_TCP, "127.0.0.1:0", &lfd, bound, sizeof bound));
    MK_ASSERT_OK(mk_socket_connect(MK_SEAM_TCP, bound, mk_deadline_ms(2000, 2000), &cfd));
    MK_ASSERT_OK(mk_socket_accept(lfd, mk_deadline_ms(2000, 2000), &afd));
    close(lfd);
    const linger hard{1, 0};
    ASSERT_EQ(setsockopt(afd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard), 0);
    close(afd);
    mk_io io{cfd, nullptr};
    uint8_t buf[4];
    const mk_status s = mk_io_read(&io, buf, sizeof buf, mk_deadline_ms(1000, 1000), "blob");
    EXPECT_EQ(s, MK_ERR_PEER_CLOSED) << mk_last_error();
    EXPECT_NE(std::string(mk_last_error()).find("reset the connection after 0 of 4 bytes of the blob"), std::string::npos)
        << mk_last_error();
    mk_io_close(&io);
}

TEST(SeamIo, DeadlinesDefaultOnlyWhenNotGiven) {
    const int64_t now = mk_now_ms();
    EXPECT_NEAR((double)(mk_deadline_ms(0, 700) - now), 700.0, 50.0);
    EXPECT_NEAR((double)(mk_deadline_ms(-5, 700) - now), 700.0, 50.0);
    EXPECT_NEAR((double)(mk_deadline_ms(120, 700) - now), 120.0, 50.0);
}

// ------------------------------------------------------------------ sockets ---

TEST(SeamSockets, AddressesAreCheckedBeforeAnySocket) {
    int fd = -1;
    char bound[300];
    const std::string long_path(200, 'p'), long_host(256, 'h');
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_UNIX, long_path.c_str(), &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "is empty or too long");
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_UNIX, "", &fd, bound, sizeof bound), MK_ERR_CONNECT, "is empty or too long");
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_TCP, "localhost", &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "TCP address 'localhost' is not HOST:PORT");
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_TCP, (long_host + ":1").c_str(), &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "is too long");
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_TCP, "127.0.0.1:1234567890123456", &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "is too long");
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_TCP, "127.0.0.1:no-such-service", &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "cannot resolve '127.0.0.1:no-such-service'");
    EXPECT_ERROR(mk_socket_connect(MK_SEAM_TCP, "localhost", mk_deadline_ms(100, 100), &fd), MK_ERR_CONNECT,
                 "is not HOST:PORT");
    EXPECT_ERROR(mk_socket_connect(MK_SEAM_TCP, nullptr, mk_deadline_ms(100, 100), &fd), MK_ERR_CONNECT,
                 "TCP address '' is not HOST:PORT");
    // A Unix path fills sun_path with its NUL: 107 bytes fit, 108 do not.
    TempDir dir;
    const std::string fits = dir.file(std::string(107 - 21, 'f')), over_by_one = dir.file(std::string(108 - 21, 'g'));
    ASSERT_EQ(fits.size(), 107u) << "TempDir paths are /tmp/mk_seams_XXXXXX/";
    int ok_fd = -1;
    MK_ASSERT_OK(mk_socket_listen(MK_SEAM_UNIX, fits.c_str(), &ok_fd, bound, sizeof bound));
    close(ok_fd);
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_UNIX, over_by_one.c_str(), &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "is empty or too long");
    // An address taken is refused, with the reason.
    const std::string path = dir.file("taken.sock");
    int first = -1;
    MK_ASSERT_OK(mk_socket_listen(MK_SEAM_UNIX, path.c_str(), &first, bound, sizeof bound));
    EXPECT_STREQ(bound, path.c_str());
    EXPECT_ERROR(mk_socket_listen(MK_SEAM_UNIX, path.c_str(), &fd, bound, sizeof bound), MK_ERR_CONNECT,
                 "cannot listen on");
    close(first);
}

TEST(SeamSockets, TcpBindsLoopbackByDefaultAndSpeaksIpv6InBrackets) {
    int fd = -1;
    char bound[300];
    MK_ASSERT_OK(mk_socket_listen(MK_SEAM_TCP, ":0", &fd, bound, sizeof bound));
    EXPECT_EQ(std::string(bound).rfind("127.0.0.1:", 0), 0u) << bound;
    EXPECT_NE(std::string(bound), "127.0.0.1:0") << "the port actually bound is reported";
    close(fd);
    if (mk_socket_listen(MK_SEAM_TCP, "[::1]:0", &fd, bound, sizeof bound) != MK_OK) GTEST_SKIP() << "no IPv6 loopback";
    EXPECT_EQ(std::string(bound).rfind("[::1]:", 0), 0u) << bound;
    int c = -1, a = -1;
    MK_ASSERT_OK(mk_socket_connect(MK_SEAM_TCP, bound, mk_deadline_ms(2000, 2000), &c));
    MK_ASSERT_OK(mk_socket_accept(fd, mk_deadline_ms(2000, 2000), &a));
    close(c);
    close(a);
    close(fd);
}

TEST(SeamSockets, AcceptAndConnectFailuresOtherThanWaitingAreNamed) {
    IoPair p;
    int fd = -1;
    EXPECT_ERROR(mk_socket_accept(p.a.fd, mk_deadline_ms(100, 100), &fd), MK_ERR_IO, "seam: accept failed");
    // A path under a regular file: not "nobody listens yet", so no retrying until the deadline.
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_ERROR(mk_socket_connect(MK_SEAM_UNIX, "/dev/null/peer.sock", mk_deadline_ms(2000, 2000), &fd), MK_ERR_CONNECT,
                 "cannot connect to '/dev/null/peer.sock'");
    EXPECT_LT(seconds_since(t0), 1.0);
}

// A listener that comes up after the connect started is found (refused connects retried).
TEST(SeamSockets, ConnectWaitsForALateListener) {
    TempDir dir;
    const std::string path = dir.file("late.sock");
    int lfd = -1;
    std::thread t([&]() {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        char bound[300];
        EXPECT_EQ(mk_socket_listen(MK_SEAM_UNIX, path.c_str(), &lfd, bound, sizeof bound), MK_OK);
    });
    int c = -1;
    const mk_status s = mk_socket_connect(MK_SEAM_UNIX, path.c_str(), mk_deadline_ms(3000, 3000), &c);
    t.join();
    EXPECT_EQ(s, MK_OK) << mk_last_error();
    if (c >= 0) close(c);
    if (lfd >= 0) close(lfd);
}

// ---------------------------------------------------------------- TLS rules ---

mk_seam_tls psk_tls(const char *hex) {
    mk_seam_tls t{};
    t.enabled = true;
    t.psk_hex = hex;
    return t;
}

// 32 to 64 bytes (a 256-bit key at least): 64 to 128 hex digits, each one checked.
TEST(SeamTlsContext, PreSharedKeyMustBe64To128HexDigits) {
    SSL_CTX *ctx = nullptr;
    for (bool server : {false, true}) {
        for (size_t digits : {size_t(64), size_t(66), size_t(128)}) {
            const std::string key(digits, 'a');
            const mk_seam_tls t = psk_tls(key.c_str());
            MK_ASSERT_OK(mk_tls_context(&t, server, &ctx));
            ASSERT_NE(ctx, nullptr);
            mk_tls_context_free(ctx);
        }
        for (size_t digits : {size_t(0), size_t(32), size_t(62), size_t(63), size_t(65), size_t(130)}) {
            const std::string key(digits, 'a');
            const mk_seam_tls t = psk_tls(key.c_str());
            EXPECT_ERROR(mk_tls_context(&t, server, &ctx), MK_ERR_INVALID_ARGUMENT, "must be 32 to 64 bytes (64 to 128 hex digits)")
                << digits;
            EXPECT_EQ(ctx, nullptr);
        }
        // Every digit is checked: the first, the last, and a "0x" prefix sscanf would take.
        for (const std::string &key : {"g" + std::string(63, 'a'), std::string(63, 'a') + "G",
                                       "0x" + std::string(62, 'a'), std::string(31, 'a') + " " + std::string(32, 'a')}) {
            const mk_seam_tls t = psk_tls(key.c_str());
            EXPECT_ERROR(mk_tls_context(&t, server, &ctx), MK_ERR_INVALID_ARGUMENT, "pre-shared key is not hex") << key;
        }
    }
}

TEST_F(TlsPeer, CertificateModeNeedsCertificateKeyAndCaEachLoadable) {
    const Pki a = make_pki(dir_, "a"), b = make_pki(dir_, "b");
    SSL_CTX *ctx = nullptr;
    const std::string missing = dir_.file("missing.pem");
    mk_seam_tls all = tls_cert(a, a).tls;
    MK_ASSERT_OK(mk_tls_context(&all, true, &ctx));
    mk_tls_context_free(ctx);
    for (int drop = 0; drop < 3; drop++) {
        mk_seam_tls t = all;
        (drop == 0 ? t.cert_file : drop == 1 ? t.key_file : t.ca_file) = nullptr;
        EXPECT_ERROR(mk_tls_context(&t, true, &ctx), MK_ERR_INVALID_ARGUMENT,
                     "give a pre-shared key, or a certificate, its key and a CA")
            << drop;
    }
    mk_seam_tls t = tls_cert(a, a).tls;
    t.cert_file = missing.c_str();
    EXPECT_ERROR(mk_tls_context(&t, false, &ctx), MK_ERR_AUTH, "cannot load the certificate");
    t = tls_cert(a, a).tls;
    t.key_file = missing.c_str();
    EXPECT_ERROR(mk_tls_context(&t, false, &ctx), MK_ERR_AUTH, "cannot load the private key");
    t = tls_cert(a, a).tls;
    t.key_file = b.key.c_str(); // another certificate's key (OpenSSL compares it as it loads it)
    EXPECT_ERROR(mk_tls_context(&t, false, &ctx), MK_ERR_AUTH, "key values mismatch");
    t = tls_cert(a, a).tls;
    t.ca_file = missing.c_str();
    EXPECT_ERROR(mk_tls_context(&t, true, &ctx), MK_ERR_AUTH, "cannot load the CA");
    EXPECT_EQ(ctx, nullptr);
}

// A TLS client of the test's own (plain OpenSSL): trusts `ca`, presents `cert` and `key`
// when given, speaks at most `max_version`. Waits for the receiver's verdict (an alert or
// a close) so the receiver decides on everything the client sent.
void raw_tls_client(const std::string &path, const std::string &ca, const char *cert, const char *key, int max_version) {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(ctx, max_version);
    SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (cert) {
        SSL_CTX_use_certificate_chain_file(ctx, cert);
        SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM);
    }
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    std::snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path.c_str());
    const timeval two_s{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &two_s, sizeof two_s);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &two_s, sizeof two_s);
    if (connect(fd, (sockaddr *)&sun, sizeof sun) == 0) {
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        if (SSL_connect(ssl) == 1) {
            char c;
            (void)SSL_read(ssl, &c, 1);
        }
        SSL_free(ssl);
    }
    close(fd);
    SSL_CTX_free(ctx);
}

// The receiving end in certificate mode, a raw client; the receiver's status.
mk_status accept_raw_client(TlsPeer *t, const Pki &server, const Pki &trust, const char *cert, const char *key,
                            int max_version, std::string *message) {
    mk_seam_options so = tls_cert(server, trust);
    const std::string path = t->dir().file("raw_tls.sock");
    so.address = path.c_str();
    mk_seam_listener *l = nullptr;
    EXPECT_EQ(mk_seam_listen(&so, &l), MK_OK) << mk_last_error();
    ListenerPtr listener(l);
    std::thread client(raw_tls_client, path, trust.ca, cert, key, max_version);
    mk_seam *rx = nullptr;
    const mk_status s = mk_seam_accept(l, t->tail(), &rx);
    *message = mk_last_error();
    mk_seam_free(rx);
    client.join();
    return s;
}

// Mutual authentication: a sender that presents no certificate at all is refused by a
// receiver in certificate mode (SSL_VERIFY_FAIL_IF_NO_PEER_CERT), with MK_ERR_AUTH.
TEST_F(TlsPeer, SenderWithoutACertificateIsRefusedWithAuth) {
    const Pki a = make_pki(dir_, "a");
    std::string msg;
    // The same raw client with a certificate is accepted: the refusal is about the certificate.
    EXPECT_EQ(accept_raw_client(this, a, a, a.cert.c_str(), a.key.c_str(), TLS1_3_VERSION, &msg), MK_OK) << msg;
    EXPECT_EQ(accept_raw_client(this, a, a, nullptr, nullptr, TLS1_3_VERSION, &msg), MK_ERR_AUTH) << msg;
    EXPECT_NE(msg.find("handshake refused"), std::string::npos) << msg;
}

// TLS 1.3 only: a peer that offers at most TLS 1.2 is refused, certificate or not.
TEST_F(TlsPeer, PeerLimitedToTls12IsRefused) {
    const Pki a = make_pki(dir_, "a");
    std::string msg;
    EXPECT_EQ(accept_raw_client(this, a, a, a.cert.c_str(), a.key.c_str(), TLS1_2_VERSION, &msg), MK_ERR_AUTH) << msg;
}

// The sender checks the receiver too: a receiver whose certificate the sender's CA did not
// sign is refused on the sending side.
TEST_F(TlsPeer, ReceiverCertificateFromAnotherCaIsRefusedBySender) {
    const Pki a = make_pki(dir_, "a"), rogue = make_pki(dir_, "rogue");
    const std::string path = dir_.file("rev.sock");
    mk_seam_options so = tls_cert(rogue, a); // the receiver trusts a, presents rogue's
    so.address = path.c_str();
    mk_seam_listener *l = nullptr;
    MK_ASSERT_OK(mk_seam_listen(&so, &l));
    ListenerPtr listener(l);
    std::thread t;
    mk_status client = MK_OK;
    connect_in_thread(tls_cert(a, a), head_.get(), path, &t, &client);
    mk_seam *rx = nullptr;
    const mk_status server = mk_seam_accept(l, tail_.get(), &rx);
    mk_seam_free(rx);
    t.join();
    EXPECT_EQ(client, MK_ERR_AUTH);
    EXPECT_EQ(server, MK_ERR_AUTH);
}

// Two ends of a TLS connection in this process, handshaken.
struct TlsIoPair {
    SSL_CTX *client_ctx = nullptr, *server_ctx = nullptr;
    mk_io a{-1, nullptr}, b{-1, nullptr}; /* a: the sending (client) end, b: the receiving (server) end */
    mk_status status = MK_ERR_INTERNAL;
    explicit TlsIoPair(const mk_seam_tls &tls) {
        int fds[2];
        status = mk_socket_pair(fds);
        if (status != MK_OK) return;
        a.fd = fds[0];
        b.fd = fds[1];
        status = mk_tls_context(&tls, false, &client_ctx);
        if (status == MK_OK) status = mk_tls_context(&tls, true, &server_ctx);
        if (status == MK_OK) status = mk_tls_attach(&a, client_ctx, false);
        if (status == MK_OK) status = mk_tls_attach(&b, server_ctx, true);
        if (status == MK_OK) status = mk_tls_handshake(&a, &b, mk_deadline_ms(3000, 3000));
    }
    ~TlsIoPair() {
        mk_io_close(&a);
        mk_io_close(&b);
        mk_tls_context_free(client_ctx);
        mk_tls_context_free(server_ctx);
    }
};

TEST(SeamTlsIo, WriteLargerThanOneRecordArrivesInOrder) {
    TlsIoPair p(psk_tls(kPsk));
    ASSERT_EQ(p.status, MK_OK) << mk_last_error();
    shrink_send_buffer(p.a.fd);
    expect_large_transfer(&p.a, &p.b);
    // write_now inside TLS: what the socket takes, counted, the rest after.
    const std::vector<uint8_t> sent = pattern(size_t(1) << 20);
    size_t written = 0;
    MK_ASSERT_OK(mk_io_write_now(&p.a, sent.data(), sent.size(), &written, "blob"));
    ASSERT_LT(written, sent.size());
    mk_status ws = MK_ERR_INTERNAL;
    std::thread t([&]() {
        ws = mk_io_write(&p.a, sent.data() + written, sent.size() - written, mk_deadline_ms(5000, 5000), "blob");
    });
    std::vector<uint8_t> got(sent.size());
    const mk_status rs = mk_io_read(&p.b, got.data(), got.size(), mk_deadline_ms(5000, 5000), "blob");
    t.join();
    MK_ASSERT_OK(rs);
    MK_ASSERT_OK(ws);
    EXPECT_TRUE(got == sent);
}

TEST(SeamTlsIo, PeerThatClosesOrStaysSilentIsNamed) {
    TlsIoPair p(psk_tls(kPsk));
    ASSERT_EQ(p.status, MK_OK) << mk_last_error();
    uint8_t buf[8];
    EXPECT_ERROR(mk_io_read(&p.b, buf, sizeof buf, mk_deadline_ms(100, 100), "blob"), MK_ERR_PEER_TIMEOUT,
                 "did not send the blob before the deadline");
    MK_ASSERT_OK(mk_io_write(&p.a, "xyz", 3, mk_deadline_ms(1000, 1000), "blob"));
    mk_io_close(&p.a);
    EXPECT_ERROR(mk_io_read(&p.b, buf, sizeof buf, mk_deadline_ms(1000, 1000), "blob"), MK_ERR_PEER_CLOSED,
                 "closed the TLS connection after 3 of 8 bytes of the blob");
}

// Bytes that are no TLS record (written beside the TLS layer): a failure, not a close.
TEST(SeamTlsIo, BytesOutsideTheRecordLayerAreAnIoFailure) {
    TlsIoPair p(psk_tls(kPsk));
    ASSERT_EQ(p.status, MK_OK) << mk_last_error();
    const std::vector<uint8_t> junk(64, 0x17);
    ASSERT_EQ(send(p.a.fd, junk.data(), junk.size(), MSG_NOSIGNAL), (ssize_t)junk.size());
    uint8_t buf[8];
    EXPECT_ERROR(mk_io_read(&p.b, buf, sizeof buf, mk_deadline_ms(1000, 1000), "blob"), MK_ERR_IO,
                 "seam: TLS read of the blob failed");
}

TEST(SeamTlsIo, HandshakeWithASilentPeerEndsAtTheDeadline) {
    int fds[2];
    MK_ASSERT_OK(mk_socket_pair(fds));
    SSL_CTX *ctx = nullptr;
    const mk_seam_tls tls = psk_tls(kPsk);
    MK_ASSERT_OK(mk_tls_context(&tls, true, &ctx));
    mk_io io{fds[0], nullptr};
    MK_ASSERT_OK(mk_tls_attach(&io, ctx, true));
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_ERROR(mk_tls_handshake(&io, nullptr, mk_deadline_ms(150, 150)), MK_ERR_PEER_TIMEOUT,
                 "the handshake did not finish before the deadline");
    EXPECT_GE(seconds_since(t0), 0.14);
    EXPECT_LT(seconds_since(t0), 1.0);
    mk_io_close(&io);
    close(fds[1]);
    mk_tls_context_free(ctx);
}

// ----------------------------------------------------------- the seam API ---

// Two ranges of the seed model (head [0, 2], tail [3, 5]) with a boundary each.
struct TwoRanges {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    RangePtr head, tail;
    BoundaryPtr out, in;
    SequencePtr head_seq, tail_seq;
    TwoRanges() {
        mk_range *h = nullptr, *t = nullptr;
        EXPECT_EQ(mk_range_create(model.get(), 0, 2, nullptr, &h), MK_OK);
        EXPECT_EQ(mk_range_create(model.get(), 3, 5, nullptr, &t), MK_OK);
        head.reset(h);
        tail.reset(t);
        mk_boundary *b = nullptr;
        EXPECT_EQ(mk_boundary_create(h, &b), MK_OK);
        out.reset(b);
        EXPECT_EQ(mk_boundary_create(t, &b), MK_OK);
        in.reset(b);
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(h, &s), MK_OK);
        head_seq.reset(s);
        EXPECT_EQ(mk_sequence_open(t, &s), MK_OK);
        tail_seq.reset(s);
    }
    mk_status forward(size_t n_tokens) {
        std::vector<int32_t> ids(n_tokens);
        for (size_t i = 0; i < n_tokens; i++) ids[i] = (int32_t)(i * 5 % 48);
        return mk_range_forward_boundary(head.get(), head_seq.get(), ids.data(), ids.size(), nullptr, nullptr, out.get(),
                                         nullptr);
    }
};

TEST(SeamApi, NamesAndDefaultsAreExact) {
    mk_seam_kind k = MK_SEAM_LOCAL;
    EXPECT_ERROR(mk_seam_kind_from_name(nullptr, &k), MK_ERR_INVALID_ARGUMENT, "unknown seam '(null)'");
    EXPECT_ERROR(mk_seam_kind_from_name("tcp", nullptr), MK_ERR_INVALID_ARGUMENT, "unknown seam 'tcp'");
    EXPECT_ERROR(mk_seam_kind_from_name("TCP", &k), MK_ERR_INVALID_ARGUMENT, "(local, wire, unix, tcp, nccl)");
    EXPECT_STREQ(mk_seam_kind_name((mk_seam_kind)0), "unknown");
    EXPECT_STREQ(mk_seam_kind_name((mk_seam_kind)(MK_SEAM_NCCL + 1)), "unknown");
    const mk_seam_options o = mk_seam_options_default(MK_SEAM_WIRE);
    EXPECT_EQ(o.kind, MK_SEAM_WIRE);
    EXPECT_EQ(o.connect_timeout_ms, 5000);
    EXPECT_EQ(o.io_timeout_ms, 30000);
    EXPECT_EQ(o.address, nullptr);
    EXPECT_EQ(o.tls.psk_hex, nullptr);
    EXPECT_STREQ(mk_seam_listener_address(nullptr), "");
    EXPECT_EQ(mk_seam_bytes(nullptr), 0u);
    EXPECT_EQ(mk_seam_seconds(nullptr), 0.0);
    mk_seam_free(nullptr);
    mk_seam_listener_free(nullptr);
}

TEST(SeamApi, EveryEntryRefusesWhatIsNotItsToTake) {
    TwoRanges r;
    const mk_seam_options wire = mk_seam_options_default(MK_SEAM_WIRE);
    mk_seam *tx = nullptr, *rx = nullptr;
    EXPECT_ERROR(mk_seam_pair(nullptr, r.head.get(), r.tail.get(), &tx, &rx), MK_ERR_INVALID_ARGUMENT,
                 "mk_seam_pair: NULL argument");
    EXPECT_ERROR(mk_seam_pair(&wire, r.head.get(), r.tail.get(), &tx, nullptr), MK_ERR_INVALID_ARGUMENT, "NULL argument");
    mk_seam_options odd = wire;
    odd.kind = (mk_seam_kind)42;
    EXPECT_ERROR(mk_seam_pair(&odd, r.head.get(), r.tail.get(), &tx, &rx), MK_ERR_INVALID_ARGUMENT,
                 "unknown seam kind 42");
    EXPECT_EQ(tx, nullptr);
    EXPECT_EQ(rx, nullptr);
    MK_ASSERT_OK(mk_seam_pair(&wire, r.head.get(), r.tail.get(), &tx, &rx));
    SeamPtr send_end(tx), recv_end(rx);
    // Send: a sending end, this range's boundary, something in it.
    EXPECT_ERROR(mk_seam_send(nullptr, r.out.get()), MK_ERR_INVALID_ARGUMENT, "mk_seam_send: NULL argument");
    EXPECT_ERROR(mk_seam_send(tx, r.out.get()), MK_ERR_EMPTY_INPUT, "the boundary is empty");
    MK_ASSERT_OK(r.forward(3));
    EXPECT_ERROR(mk_seam_send(rx, r.out.get()), MK_ERR_INVALID_ARGUMENT, "this is a receiving end");
    EXPECT_ERROR(mk_seam_send(tx, r.in.get()), MK_ERR_INVALID_ARGUMENT, "the boundary is not this range's");
    EXPECT_ERROR(mk_seam_send_wait(rx), MK_ERR_INVALID_ARGUMENT, "not a sending end");
    EXPECT_ERROR(mk_seam_send_wait(nullptr), MK_ERR_INVALID_ARGUMENT, "not a sending end");
    // Receive: a receiving end, this range's boundary.
    EXPECT_ERROR(mk_seam_recv(rx, nullptr, r.in.get()), MK_ERR_INVALID_ARGUMENT, "mk_seam_recv: NULL argument");
    EXPECT_ERROR(mk_seam_recv(tx, r.head_seq.get(), r.out.get()), MK_ERR_INVALID_ARGUMENT, "this is a sending end");
    EXPECT_ERROR(mk_seam_recv(rx, r.tail_seq.get(), r.out.get()), MK_ERR_INVALID_ARGUMENT,
                 "the boundary is not this range's");
    EXPECT_ERROR(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()), MK_ERR_INVALID_ARGUMENT, "wire seam: nothing was sent");
    // And the pair still works after all of that.
    MK_ASSERT_OK(mk_seam_send(tx, r.out.get()));
    MK_ASSERT_OK(mk_seam_send_wait(tx));
    MK_ASSERT_OK(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()));
    EXPECT_EQ(mk_boundary_header_of(r.in.get())->rows, 3u);
    EXPECT_EQ(mk_seam_bytes(tx), 0u) << "the wire's bytes are counted where they are read";
    EXPECT_GT(mk_seam_bytes(rx), 3u * 32 * 4);
    EXPECT_GT(mk_seam_seconds(rx), 0.0);
    // One send, one receive: a second receive finds nothing.
    EXPECT_ERROR(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()), MK_ERR_INVALID_ARGUMENT, "nothing was sent");
    EXPECT_EQ(mk_boundary_header_of(r.in.get())->rows, 0u) << "a failed receive leaves the boundary empty";
    // The stream-only entries know a stream end from any other.
    EXPECT_EQ(mk_seam_stream_fd(tx), -1);
    EXPECT_EQ(mk_seam_stream_fd(nullptr), -1);
    EXPECT_ERROR(mk_seam_stream_write_raw(tx, "x", 1), MK_ERR_INVALID_ARGUMENT, "not a stream seam end");
    EXPECT_ERROR(mk_seam_stream_write_raw(nullptr, "x", 1), MK_ERR_INVALID_ARGUMENT, "not a stream seam end");
}

TEST(SeamApi, OnlyStreamsAndNcclCrossProcesses) {
    TwoRanges r;
    mk_seam_listener *l = nullptr;
    mk_seam *s = nullptr;
    EXPECT_ERROR(mk_seam_listen(nullptr, &l), MK_ERR_INVALID_ARGUMENT, "mk_seam_listen: NULL argument");
    for (mk_seam_kind kind : {MK_SEAM_LOCAL, MK_SEAM_WIRE}) {
        mk_seam_options o = mk_seam_options_default(kind);
        o.address = "/tmp/unused";
        const std::string want = std::string("not '") + mk_seam_kind_name(kind) + "'";
        EXPECT_ERROR(mk_seam_listen(&o, &l), MK_ERR_INVALID_ARGUMENT, want.c_str());
        EXPECT_ERROR(mk_seam_connect(&o, r.head.get(), &s), MK_ERR_INVALID_ARGUMENT, want.c_str());
        EXPECT_EQ(l, nullptr);
        EXPECT_EQ(s, nullptr);
    }
    mk_seam_options nccl = mk_seam_options_default(MK_SEAM_NCCL);
    nccl.address = "";
    EXPECT_ERROR(mk_seam_listen(&nccl, &l), MK_ERR_INVALID_ARGUMENT, "needs an address (the id file)");
    EXPECT_ERROR(mk_seam_connect(&nccl, r.head.get(), &s), MK_ERR_INVALID_ARGUMENT, "needs an address (the id file)");
    const std::string long_path = "/tmp/" + std::string(300, 'n');
    nccl.address = long_path.c_str();
    EXPECT_ERROR(mk_seam_listen(&nccl, &l), MK_ERR_INVALID_ARGUMENT, "id file path too long");
    // This binary links no NCCL seam: every NCCL entry says so (nccl_absent.c).
    TempDir id_dir;
    const std::string id_path = id_dir.file("id");
    nccl.address = id_path.c_str();
    EXPECT_ERROR(mk_seam_listen(&nccl, &l), MK_ERR_UNSUPPORTED, "has no NCCL seam");
    EXPECT_EQ(l, nullptr);
    EXPECT_ERROR(mk_seam_connect(&nccl, r.head.get(), &s), MK_ERR_UNSUPPORTED, "has no NCCL seam");
    EXPECT_EQ(s, nullptr);
    unsigned char id[MK_SEAM_NCCL_ID_BYTES] = {0};
    EXPECT_ERROR(mk_seam_nccl_id_new(id, sizeof id), MK_ERR_UNSUPPORTED, "has no NCCL seam");
    EXPECT_ERROR(mk_seam_nccl_end_with_id(&nccl, id, sizeof id, r.head.get(), true, &s), MK_ERR_UNSUPPORTED,
                 "has no NCCL seam");
    EXPECT_EQ(s, nullptr);
    EXPECT_ERROR(mk_seam_accept(nullptr, r.tail.get(), &s), MK_ERR_INVALID_ARGUMENT, "mk_seam_accept: NULL argument");
    EXPECT_ERROR(mk_seam_connect(nullptr, r.head.get(), &s), MK_ERR_INVALID_ARGUMENT, "mk_seam_connect: NULL argument");
    // A Unix listener's socket file goes with the listener.
    TempDir dir;
    const std::string path = dir.file("gone.sock");
    mk_seam_options unix_o = mk_seam_options_default(MK_SEAM_UNIX);
    unix_o.address = path.c_str();
    MK_ASSERT_OK(mk_seam_listen(&unix_o, &l));
    EXPECT_STREQ(mk_seam_listener_address(l), path.c_str());
    EXPECT_EQ(access(path.c_str(), F_OK), 0);
    mk_seam_listener_free(l);
    EXPECT_NE(access(path.c_str(), F_OK), 0) << "the socket file outlived its listener";
}

// A receive refused after its header (the payload not finite) leaves the boundary empty;
// the next receive is accepted: over the wire (in process) and the stream.
TEST(SeamApi, RefusedPayloadLeavesTheBoundaryEmptyAndThePairUsable) {
    for (mk_seam_kind kind : {MK_SEAM_WIRE, MK_SEAM_UNIX}) {
        TwoRanges r;
        const mk_seam_options o = mk_seam_options_default(kind);
        mk_seam *tx = nullptr, *rx = nullptr;
        MK_ASSERT_OK(mk_seam_pair(&o, r.head.get(), r.tail.get(), &tx, &rx));
        SeamPtr send_end(tx), recv_end(rx);
        MK_ASSERT_OK(r.forward(3));
        const size_t last = 3 * 32 - 1;
        const float keep = r.out->payload[last];
        r.out->payload[last] = NAN; // the very last value of the last row
        MK_ASSERT_OK(mk_seam_send(tx, r.out.get()));
        MK_ASSERT_OK(mk_seam_send_wait(tx));
        EXPECT_ERROR(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()), MK_ERR_NONFINITE, "value 95 (row 2)")
            << mk_seam_kind_name(kind);
        EXPECT_EQ(mk_boundary_header_of(r.in.get())->rows, 0u);
        r.out->payload[last] = keep;
        MK_ASSERT_OK(mk_seam_send(tx, r.out.get()));
        MK_ASSERT_OK(mk_seam_send_wait(tx));
        MK_ASSERT_OK(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()));
        EXPECT_EQ(mk_boundary_header_of(r.in.get())->rows, 3u);
        EXPECT_EQ(std::memcmp(r.in->payload, r.out->payload, 3 * 32 * sizeof(float)), 0);
    }
}

TEST(SeamLocal, NothingSentIsRefusedAndEachSendIsReceivedOnce) {
    TwoRanges r;
    const mk_seam_options o = mk_seam_options_default(MK_SEAM_LOCAL);
    mk_seam *tx = nullptr, *rx = nullptr;
    MK_ASSERT_OK(mk_seam_pair(&o, r.head.get(), r.tail.get(), &tx, &rx));
    SeamPtr send_end(tx), recv_end(rx);
    EXPECT_ERROR(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()), MK_ERR_INVALID_ARGUMENT, "local seam: nothing was sent");
    MK_ASSERT_OK(r.forward(2));
    MK_ASSERT_OK(mk_seam_send(tx, r.out.get()));
    MK_ASSERT_OK(mk_seam_send_wait(tx));
    MK_ASSERT_OK(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()));
    EXPECT_EQ(mk_seam_bytes(rx), 2u * 32 * sizeof(float));
    EXPECT_EQ(std::memcmp(r.in->payload, r.out->payload, 2 * 32 * sizeof(float)), 0);
    EXPECT_ERROR(mk_seam_recv(rx, r.tail_seq.get(), r.in.get()), MK_ERR_INVALID_ARGUMENT, "nothing was sent");
}

}  // namespace
