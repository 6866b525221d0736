// Seams and their transports on the cpu backend: whole vs split bit-identical over every
// transport (local, wire, unix, tcp, TLS with a pre-shared key and with certificates),
// across two processes, and every faulty peer ending in its own status within the
// deadline: closes mid-frame, never sends, frame over the limit, truncated frame header,
// another recipe digest / next_layer / hidden width, non-finite values, wrong key or
// certificate, plaintext peer when TLS is required.
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
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
#include <vector>

#include "boundary.h"
#include "meshkern.pb-c.h"
#include "mk_test_util.h"

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
    void connect_raw(mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX), bool expect_accept = true) {
        path_ = dir_.file("peer.sock");
        o.address = path_.c_str();
        o.io_timeout_ms = kDeadlineMs;
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

TEST_F(FaultyPeer, PeerStallsMidFrame) {
    connect_raw();
    std::vector<uint8_t> f = framed(valid_);
    f.resize(40);
    write_raw(f);
    EXPECT_EQ(receive(), MK_ERR_PEER_TIMEOUT);
}

TEST_F(FaultyPeer, FrameOverTheReceiversLimitIsRefusedBeforeItsBody) {
    connect_raw();
    // The tail allows 64 rows of 32 floats; a sender claiming more is refused whatever it says.
    write_raw(frame_header(uint64_t(64) * 32 * 4 + 64 * 4 + 4096));
    std::string msg;
    EXPECT_EQ(receive(&msg), MK_ERR_FRAME);
    EXPECT_NE(msg.find("exceeds this range's limit"), std::string::npos) << msg;
    write_raw(frame_header(std::numeric_limits<uint64_t>::max()));
    EXPECT_EQ(receive(), MK_ERR_FRAME);
}

TEST_F(FaultyPeer, RowsOverTheReceiversLimitFromALargerSender) {
    // A head allowing 128 rows sends 100: the 64-row tail refuses the frame by its length.
    mk_range_options big = mk_range_options_default();
    big.max_context = 128;
    mk_range *h = nullptr;
    MK_ASSERT_OK(mk_range_create(model_.get(), 0, 2, &big, &h));
    RangePtr head(h);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(h, &s));
    SequencePtr seq(s);
    std::vector<int32_t> ids(100);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 7) % 48);
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(h, s, ids.data(), ids.size(), nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    uint8_t *bytes = nullptr;
    size_t len = 0;
    MK_ASSERT_OK(mk_bundle_pack(b, &bytes, &len));
    BufferPtr hold(bytes);
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
            mk_boundary_header h = *mk_bundle_header(b);
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

class TlsPeer : public FaultyPeer {};

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
    for (const char *name : {"local", "wire", "unix", "tcp"}) {
        MK_ASSERT_OK(mk_seam_kind_from_name(name, &k));
        EXPECT_STREQ(mk_seam_kind_name(k), name);
    }
    EXPECT_EQ(mk_seam_kind_from_name("nccl", &k), MK_ERR_INVALID_ARGUMENT);
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
    // Only stream transports cross processes.
    mk_seam_listener *l = nullptr;
    const mk_seam_options local = mk_seam_options_default(MK_SEAM_LOCAL);
    EXPECT_EQ(mk_seam_listen(&local, &l), MK_ERR_INVALID_ARGUMENT);
}

}  // namespace
