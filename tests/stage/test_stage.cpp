// meshkern stage: one process per range, joined through a rendezvous address on loopback.
// Each case launches the command-line program once per rank (fork/exec), waits for all of
// them with a limit, kills and fails on any process still running, and reads rank 0's
// output: every sequence's tokens must equal (memcmp) the whole model run in this process;
// under an injected fault every request must be reported failed with the named status and
// every process must exit non-zero within the deadline + 5 s.
#include <arpa/inet.h>
#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "meshkern.h"
#include "mk_test_util.h"
extern "C" {
#include "net/io.h"
#include "stage/stage.h"
}

namespace {

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// A port nobody listens on right now (the kernel's choice for port 0).
int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (sockaddr *)&a, &len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

std::string slurp(const std::string &path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct Proc {
    pid_t pid = -1;
    std::string out, err; // files
    int status = -1;      // waitpid status
    double exit_s = -1;   // seconds from launch
};

// Launches every rank; wait() reaps them all within a limit and kills what is left.
class Ranks {
  public:
    explicit Ranks(const std::string &tag) : dir_(std::string("/tmp/mk_stage_") + tag + "_" + std::to_string(getpid())) {
        mkdir(dir_.c_str(), 0700);
    }
    ~Ranks() {
        kill_all();
        if (::testing::Test::HasFailure()) { // a failed case keeps every rank's output to read
            std::fprintf(stderr, "rank outputs kept in %s\n", dir_.c_str());
            return;
        }
        for (const auto &p : procs_) {
            unlink(p.out.c_str());
            unlink(p.err.c_str());
        }
        rmdir(dir_.c_str());
    }

    void launch(int rank, const std::vector<std::string> &args, const std::string &fault) {
        Proc p;
        p.out = dir_ + "/rank" + std::to_string(rank) + ".out";
        p.err = dir_ + "/rank" + std::to_string(rank) + ".err";
        if (procs_.empty()) t0_ = now_s();
        const pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            const int o = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
            const int e = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
            dup2(o, 1);
            dup2(e, 2);
            if (fault.empty()) unsetenv("MESHKERN_FAULT");
            else setenv("MESHKERN_FAULT", fault.c_str(), 1);
            setenv("OPENBLAS_NUM_THREADS", "1", 1);
            std::vector<char *> argv;
            argv.push_back(const_cast<char *>(MK_MESHKERN_BIN));
            for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
            argv.push_back(nullptr);
            execv(MK_MESHKERN_BIN, argv.data());
            _exit(127);
        }
        p.pid = pid;
        procs_.push_back(p);
    }

    // Reap every process within limit_s of the first launch; any still running is killed
    // and the case fails (a hang or a leftover process).
    void wait(double limit_s) {
        size_t left = procs_.size();
        while (left > 0 && now_s() - t0_ < limit_s) {
            for (auto &p : procs_) {
                if (p.pid < 0 || p.exit_s >= 0) continue;
                int st = 0;
                if (waitpid(p.pid, &st, WNOHANG) == p.pid) {
                    p.status = st;
                    p.exit_s = now_s() - t0_;
                    left--;
                }
            }
            usleep(10000);
        }
        for (auto &p : procs_)
            if (p.exit_s < 0) ADD_FAILURE() << "process " << p.pid << " still running after " << limit_s << " s: killed";
        kill_all();
    }

    Proc &operator[](size_t i) { return procs_[i]; }
    size_t size() const { return procs_.size(); }

  private:
    void kill_all() {
        for (auto &p : procs_) {
            if (p.pid < 0 || p.exit_s >= 0) continue;
            kill(p.pid, SIGKILL);
            int st = 0;
            waitpid(p.pid, &st, 0);
            p.status = st;
            p.exit_s = now_s() - t0_;
        }
    }
    std::string dir_;
    std::vector<Proc> procs_;
    double t0_ = 0;
};

int exit_code(const Proc &p) { return WIFEXITED(p.status) ? WEXITSTATUS(p.status) : 128 + WTERMSIG(p.status); }

// Rank 0's "seq N (...): limit, K tokens: a b c" lines, by sequence number (1-based).
struct SeqLine {
    bool failed = false;
    size_t number = 0;
    std::string status, line;
    std::vector<int32_t> tokens;
};

std::vector<SeqLine> parse_seqs(const std::string &out) {
    std::vector<SeqLine> seqs;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("seq ", 0) != 0) continue;
        SeqLine s;
        s.line = line;
        s.number = std::strtoul(line.c_str() + 4, nullptr, 10);
        const size_t colon = line.find("): ");
        if (colon == std::string::npos) continue;
        std::string rest = line.substr(colon + 3);
        if (rest.rfind("FAILED ", 0) == 0) {
            s.failed = true;
            s.status = rest.substr(7, rest.find(':') - 7);
        }
        const size_t tk = rest.rfind("tokens:");
        if (tk != std::string::npos) {
            std::istringstream ts(rest.substr(tk + 7));
            int v;
            while (ts >> v) s.tokens.push_back(v);
        }
        seqs.push_back(s);
    }
    // in request order (rank 0 prints each as it finishes: a chunked prompt can finish later)
    std::stable_sort(seqs.begin(), seqs.end(), [](const SeqLine &a, const SeqLine &b) { return a.number < b.number; });
    return seqs;
}

std::vector<std::vector<int32_t>> read_prompts(const std::string &path) {
    std::vector<std::vector<int32_t>> prompts;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::vector<int32_t> ids;
        std::stringstream ss(line);
        std::string item;
        while (std::getline(ss, item, ',')) ids.push_back(std::stoi(item));
        prompts.push_back(ids);
    }
    return prompts;
}

// The whole model as one FULL range in this process: greedy tokens of each prompt.
std::vector<std::vector<int32_t>> whole_model(const mk_model *model, mk_dtype weights,
                                              const std::vector<std::vector<int32_t>> &prompts, size_t n_new) {
    size_t longest = 0;
    for (const auto &p : prompts) longest = std::max(longest, p.size());
    mk_range_options o = mk_range_options_default();
    o.backend.weight_dtype = weights;
    o.max_context = longest + n_new;
    o.max_batch_tokens = longest;
    mk_range *range = nullptr;
    EXPECT_EQ(mk_range_create(model, 0, (int64_t)mk_model_hparams(model)->n_layers - 1, &o, &range), MK_OK)
        << mk_last_error();
    std::vector<std::vector<int32_t>> all;
    for (const auto &p : prompts) {
        mk_sequence *seq = nullptr;
        EXPECT_EQ(mk_sequence_open(range, &seq), MK_OK);
        std::vector<int32_t> toks;
        std::vector<int32_t> in = p;
        for (size_t k = 0; k < n_new; k++) {
            mk_tail_output *t = nullptr;
            EXPECT_EQ(mk_range_forward(range, seq, in.data(), in.size(), nullptr, nullptr, nullptr, &t), MK_OK)
                << mk_last_error();
            toks.push_back(t->token_ids[0]);
            in.assign(1, t->token_ids[0]);
            mk_tail_output_free(t);
        }
        mk_sequence_close(seq);
        all.push_back(toks);
    }
    mk_range_free(range);
    return all;
}

// The CLI's --random:kv_heads=2 model (seed 20260715).
mk_model *random_model(uint64_t seed = 20260715) {
    mk_hparams hp = mk_hparams_seed_default();
    hp.n_kv_heads = 2;
    mk_model *m = nullptr;
    EXPECT_EQ(mk_model_create_random(&hp, seed, nullptr, &m), MK_OK) << mk_last_error();
    return m;
}

const char *kRandom = "--random:kv_heads=2";
const std::string kPrompts = std::string(MK_FIXTURE_DIR) + "/prompts_random.txt";

std::vector<std::string> stage_args(const std::string &model, const std::string &split, int rank, int world, int port,
                                    const std::vector<std::string> &extra) {
    std::vector<std::string> a = {"stage", model, "--split", split, "--rank", std::to_string(rank), "--world",
                                  std::to_string(world), "--rendezvous", "127.0.0.1:" + std::to_string(port)};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
}

// Launch `world` ranks (rank 0 last, so the others wait at the rendezvous) and reap them.
void run_ranks(Ranks &ranks, const std::string &model, const std::string &split, int world,
               const std::vector<std::string> &rank0_extra, const std::vector<std::string> &extra,
               const std::string &fault, double limit_s, const std::vector<std::string> &models = {}) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    for (int r = 1; r < world; r++)
        ranks.launch(r, stage_args(models.empty() ? model : models[(size_t)r], split, r, world, port, extra), fault);
    std::vector<std::string> a0 = extra;
    a0.insert(a0.end(), rank0_extra.begin(), rank0_extra.end());
    ranks.launch(0, stage_args(model, split, 0, world, port, a0), fault);
    ranks.wait(limit_s);
}

void expect_parity(Ranks &ranks, size_t rank0, const std::vector<std::vector<int32_t>> &want) {
    const std::string out = slurp(ranks[rank0].out);
    const auto seqs = parse_seqs(out);
    ASSERT_EQ(seqs.size(), want.size()) << out << slurp(ranks[rank0].err);
    for (size_t i = 0; i < want.size(); i++) {
        EXPECT_FALSE(seqs[i].failed) << seqs[i].line;
        ASSERT_EQ(seqs[i].tokens.size(), want[i].size()) << seqs[i].line;
        EXPECT_EQ(memcmp(seqs[i].tokens.data(), want[i].data(), want[i].size() * sizeof(int32_t)), 0)
            << "sequence " << i + 1 << " differs from the whole model: " << seqs[i].line;
    }
    EXPECT_NE(out.find("aggregate: "), std::string::npos) << out;
    for (size_t i = 0; i < ranks.size(); i++) EXPECT_EQ(exit_code(ranks[i]), 0) << slurp(ranks[i].err);
}

// Rank 0's per-hop figures: one line per seam, each seam crossed once per generated token
// (a prefill, then a decode step per token but the last), with non-zero bytes, seam time
// and a latency below the deadline; then the mean.
void expect_hops(const std::string &out, int world, const std::string &seam,
                 const std::vector<std::vector<int32_t>> &want) {
    size_t tokens = 0;
    for (const auto &w : want) tokens += w.size();
    double lowest = 1e300, highest = 0.0; // the hops' latencies (us): their mean lies between
    for (int k = 0; k + 1 < world; k++) {
        const std::string prefix = "hop " + std::to_string(k) + ": rank " + std::to_string(k) + " -> " +
                                   std::to_string(k + 1) + " over " + seam + ": ";
        const size_t at = out.find(prefix);
        ASSERT_NE(at, std::string::npos) << out;
        const std::string line = out.substr(at, out.find('\n', at) - at);
        unsigned long long boundaries = 0, bytes = 0;
        double seconds = 0.0, latency_us = 0.0;
        ASSERT_EQ(std::sscanf(line.c_str() + prefix.size(), "%llu boundaries, %llu bytes, %lf s in the seam, %lf us per hop",
                              &boundaries, &bytes, &seconds, &latency_us),
                  4)
            << line;
        EXPECT_EQ(boundaries, tokens) << line;
        EXPECT_GT(bytes, 0u) << line;
        EXPECT_GT(seconds, 0.0) << line;
        EXPECT_GT(latency_us, 0.0) << line;
        EXPECT_LT(latency_us, 20e6) << line;
        lowest = std::min(lowest, latency_us);
        highest = std::max(highest, latency_us);
    }
    const std::string mean_prefix = "per-hop latency: ";
    const size_t at = out.find(mean_prefix);
    ASSERT_NE(at, std::string::npos) << out;
    const std::string line = out.substr(at, out.find('\n', at) - at);
    double mean_us = 0.0;
    unsigned long long crossings = 0;
    char seam_name[32] = {0};
    ASSERT_EQ(std::sscanf(line.c_str() + mean_prefix.size(), "%lf us mean over %llu boundaries (%31[a-z]", &mean_us,
                          &crossings, seam_name),
              3)
        << line;
    EXPECT_EQ(seam_name, seam) << line;
    EXPECT_GE(mean_us, lowest - 0.1) << line; // printed to 0.1 us
    EXPECT_LE(mean_us, highest + 0.1) << line;
    EXPECT_EQ(crossings, tokens * (size_t)(world - 1)) << line;
}

class StageParity : public ::testing::TestWithParam<std::tuple<int, const char *, int>> {};

// 2 and 3 processes over TCP (and unix), 5 prompts with 2 in flight: every sequence's
// tokens equal the whole model's; also with rank 0 sending the prompts in chunks of two
// rows (--prefill-chunk 2, where the seams carry a boundary per chunk, not per token).
TEST_P(StageParity, RandomModelTokensEqualTheWholeModel) {
    const int world = std::get<0>(GetParam()), chunk = std::get<2>(GetParam());
    const std::string seam = std::get<1>(GetParam());
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 6);
    Ranks ranks("parity" + std::to_string(world) + seam + std::to_string(chunk));
    run_ranks(ranks, kRandom, world == 2 ? "2" : "1,3", world, {"--prompts", kPrompts},
              {"--max-tokens", "6", "--max-sequences", "2", "--timeout", "20", "--seam", seam, "--prefill-chunk",
               std::to_string(chunk)},
              "", 60);
    expect_parity(ranks, world - 1, want); // rank 0 was launched last
    if (chunk == 0) expect_hops(slurp(ranks[(size_t)world - 1].out), world, seam, want);
    mk_model_free(model);
}

INSTANTIATE_TEST_SUITE_P(Stage, StageParity,
                         ::testing::Values(std::make_tuple(2, "tcp", 0), std::make_tuple(3, "tcp", 0),
                                           std::make_tuple(2, "unix", 0), std::make_tuple(2, "tcp", 2)));

// SmolLM2 (native weights, the cpu default for a GGUF) in 2 and 3 processes: two prompts,
// three tokens each.
TEST(Stage, SmolLM2TokensEqualTheWholeModel) {
    const std::string path = mk_test_model_path();
    MK_REQUIRE_MODEL_FILE(path);
    mk_model *model = nullptr;
    ASSERT_EQ(mk_model_open_gguf(path.c_str(), &model), MK_OK) << mk_last_error();
    const std::string file = std::string(MK_FIXTURE_DIR) + "/prompts_smollm2.txt";
    const auto prompts = read_prompts(file);
    ASSERT_EQ(prompts.size(), 2u);
    const auto want = whole_model(model, MK_DTYPE_NATIVE, prompts, 3);
    for (int world : {2, 3}) {
        Ranks ranks("smol" + std::to_string(world));
        run_ranks(ranks, path, world == 2 ? "14" : "9,19", world, {"--prompts", file},
                  {"--max-tokens", "3", "--max-sequences", "2", "--timeout", "60"}, "", 110);
        expect_parity(ranks, (size_t)world - 1, want);
    }
    mk_model_free(model);
}

// ---------------------------------------------------------------- faults --

struct FaultCase {
    const char *fault;   // MESHKERN_FAULT
    int faulty;          // its rank
    const char *status;  // what every request in flight fails with
    const char *names;   // the rank the message must name
};

// A failed rank other than 0 prints each request the failure took ("rank K: seq N:
// FAILED ..."), or that it held none: never nothing.
void expect_request_list(const std::string &out, int rank) {
    const std::string prefix = "rank " + std::to_string(rank) + ": ";
    const bool listed = out.find(prefix + "seq ") != std::string::npos;
    const bool none = out.find(prefix + "no request in flight when the run failed") != std::string::npos;
    EXPECT_TRUE(listed || none) << "rank " << rank << " printed no request list:\n" << out;
}

class StageFault : public ::testing::TestWithParam<FaultCase> {};

// 3 processes, 2 s deadline: the fault stops the run; rank 0 reports each of the 5
// requests failed with the named status (never a token list cut short without a word);
// the surviving ranks report it too; every process exits non-zero within 2 + 5 s.
TEST_P(StageFault, EveryRequestFailsWithTheNamedStatus) {
    const FaultCase c = GetParam();
    const double deadline_s = 2.0;
    Ranks ranks(std::string("fault") + std::to_string(c.faulty));
    const auto t0 = now_s();
    run_ranks(ranks, kRandom, "1,3", 3, {"--prompts", kPrompts},
              {"--max-tokens", "6", "--max-sequences", "3", "--timeout", "2"}, c.fault, deadline_s + 5.0 + 3.0);
    (void)t0;
    const size_t rank0 = 2; // launched last
    const std::string out = slurp(ranks[rank0].out), err = slurp(ranks[rank0].err);
    const auto seqs = parse_seqs(out);
    ASSERT_EQ(seqs.size(), 5u) << out << err;
    for (const auto &s : seqs) {
        EXPECT_TRUE(s.failed) << s.line;
        EXPECT_EQ(s.status, c.status) << s.line;
        EXPECT_NE(s.line.find(c.names), std::string::npos) << s.line;
    }
    EXPECT_EQ(out.find("aggregate: "), std::string::npos) << out;
    for (size_t i = 0; i < ranks.size(); i++) {
        const int rank = i == rank0 ? 0 : (int)i + 1;
        EXPECT_NE(exit_code(ranks[i]), 0) << "rank " << rank;
        EXPECT_LE(ranks[i].exit_s, deadline_s + 5.0) << "rank " << rank << " exited late";
        if (rank != c.faulty) {
            // A surviving rank names the status; a middle or tail rank still sending a result
            // when rank 0, done reporting, exits may instead see rank 0 gone (both are a clear
            // status; rank 0's per-request report above is the one that must name the fault).
            const std::string e = slurp(ranks[i].err), prefix = std::string("rank ") + std::to_string(rank) + ": ";
            const bool named = e.find(prefix + c.status) != std::string::npos;
            const bool lost_rank0 = rank != 0 && e.find(prefix + "MK_ERR_PEER_LOST: " + prefix.substr(0, prefix.size() - 2) +
                                                         " lost rank 0") != std::string::npos;
            EXPECT_TRUE(named || lost_rank0) << "rank " << rank << ": " << e;
            // and every rank says which requests the failure took
            if (rank != 0) expect_request_list(slurp(ranks[i].out), rank);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Stage, StageFault,
    ::testing::Values(FaultCase{"rank=1,step=4,kind=exit", 1, "MK_ERR_PEER_LOST", "rank 1"},
                      FaultCase{"rank=1,step=4,kind=silent", 1, "MK_ERR_PEER_TIMEOUT", "rank 1"},
                      FaultCase{"rank=1,step=4,kind=corrupt_header", 1, "MK_ERR_FRAME", "rank 1"},
                      // within the deadline and naming rank 1, not rank 2 stuck in the frame
                      FaultCase{"rank=1,step=4,kind=half_frame", 1, "MK_ERR_PEER_TIMEOUT", "from rank 1"},
                      FaultCase{"rank=1,step=4,kind=other_digest", 1, "MK_ERR_RECIPE_DIGEST", "rank 1"},
                      FaultCase{"rank=0,step=4,kind=other_layer", 0, "MK_ERR_SEAM_MISMATCH", "rank 0"},
                      FaultCase{"rank=2,step=3,kind=exit", 2, "MK_ERR_PEER_LOST", "rank 2"},
                      FaultCase{"rank=2,step=3,kind=silent", 2, "MK_ERR_PEER_TIMEOUT", "rank 2"},
                      FaultCase{"rank=2,step=3,kind=corrupt_header", 2, "MK_ERR_FRAME", "rank 2"},
                      FaultCase{"rank=2,step=3,kind=other_digest", 2, "MK_ERR_RECIPE_DIGEST", "rank 2"}),
    [](const ::testing::TestParamInfo<FaultCase> &info) {
        std::string name = std::string(info.param.fault).substr(std::string(info.param.fault).find("kind=") + 5);
        return name + "_at_rank" + std::to_string(info.param.faulty);
    });

// Batches cross the seams between stage processes (a step's boundaries are one message on
// tcp), and a lie in one entry (rank 1 sends one request's boundary with a position one
// past its sequence's) fails that request alone: rank 2 refuses the entry, rank 0 reports
// that request failed with MK_ERR_POSITIONS_SHAPE naming the refusal, and every other
// request's tokens equal the whole model's; no rank fails.
TEST(Stage, ALyingEntryFailsOnlyItsRequestAcrossProcesses) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 6);
    Ranks ranks("lying");
    run_ranks(ranks, kRandom, "1,3", 3, {"--prompts", kPrompts},
              {"--max-tokens", "6", "--max-sequences", "3", "--timeout", "20"}, "rank=1,step=4,kind=lying_entry", 60);
    const size_t rank0 = 2; // launched last
    const std::string out = slurp(ranks[rank0].out), err = slurp(ranks[rank0].err);
    const auto seqs = parse_seqs(out);
    ASSERT_EQ(seqs.size(), want.size()) << out << err;
    size_t failed = 0;
    for (const SeqLine &seq : seqs) {
        size_t number = 0; // "seq N (...": reports come in the order requests end
        ASSERT_EQ(std::sscanf(seq.line.c_str(), "seq %zu", &number), 1) << seq.line;
        ASSERT_TRUE(number >= 1 && number <= want.size()) << seq.line;
        const size_t i = number - 1;
        if (seq.failed) {
            failed++;
            EXPECT_EQ(seq.status, "MK_ERR_POSITIONS_SHAPE") << seq.line;
            EXPECT_NE(seq.line.find("rank 2 refused the boundary of req-"), std::string::npos) << seq.line;
            EXPECT_NE(seq.line.find("from rank 1"), std::string::npos) << seq.line;
            continue;
        }
        EXPECT_EQ(seq.tokens, want[i]) << "sequence " << number << ": " << seq.line;
    }
    EXPECT_EQ(failed, 1u) << out;
    // every boundary sent was received (the refused one too): the hop figures add up
    EXPECT_NE(out.find("hop 1: rank 1 -> 2 over tcp: "), std::string::npos) << out;
    EXPECT_EQ(out.find("no figures"), std::string::npos) << out;
    for (size_t i = 0; i < 2; i++) EXPECT_EQ(exit_code(ranks[i]), 0) << "rank " << i + 1 << ": " << slurp(ranks[i].err);
    mk_model_free(model);
}

// A result for a request rank 0 never admitted (a lying rank upstream opened it, or the
// last rank lies): dropped and logged, every rank told to free what it holds for that id,
// and the run goes on with every request's tokens equal to the whole model's (it ended the
// whole run).
TEST(Stage, AResultForARequestNeverAdmittedIsDroppedAndTheRunGoesOn) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 6);
    Ranks ranks("stray_result");
    run_ranks(ranks, kRandom, "1,3", 3, {"--prompts", kPrompts},
              {"--max-tokens", "6", "--max-sequences", "3", "--timeout", "20"}, "rank=2,step=3,kind=stray_result", 60);
    expect_parity(ranks, 2, want);
    const std::string err = slurp(ranks[2].err);
    EXPECT_NE(err.find("dropped rank 2's result for 'req-999999': not a request in flight"), std::string::npos) << err;
    mk_model_free(model);
}

// A rank that computes a step longer than any peer waits in silence (fault: 3 deadlines;
// as a 1000-token prefill on SmolLM2 with --timeout 1, which failed at ~1.25 s with "rank
// 1 is silent") is busy, not silent: --timeout bounds silence, not work. The run finishes
// with every token equal to the whole model's, whether the busy rank is a middle one (rank
// 0 waits for its result, rank 2 for its boundary) or rank 0 itself (the others wait for it).
TEST(Stage, BusyRankIsNotSilent) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 3);
    for (const char *fault : {"rank=1,step=2,kind=busy", "rank=0,step=2,kind=busy"}) {
        SCOPED_TRACE(fault);
        const int port = free_port();
        // 0.6 s: the busy step sleeps 1.8 s; the ranks (ASan builds, a loaded machine) still
        // start and join within the deadline
        const std::vector<std::string> extra = {"--max-tokens", "3", "--max-sequences", "2", "--timeout", "0.6"};
        std::vector<std::string> a0 = extra;
        a0.insert(a0.end(), {"--prompts", kPrompts});
        Ranks ranks(std::string("busy") + fault[5]);
        ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, a0), fault); // listening before the others come
        for (int r = 1; r < 3; r++) ranks.launch(r, stage_args(kRandom, "1,3", r, 3, port, extra), fault);
        ranks.wait(20);
        expect_parity(ranks, 0, want);
        EXPECT_GT(ranks[0].exit_s, 1.8) << "the busy step did not happen";
    }
    mk_model_free(model);
}

// Rank 0 itself dies or falls silent: the other ranks report it (the closed connection at
// once, silence after twice the deadline) and exit non-zero within the deadline + 5 s.
TEST(Stage, Rank0FaultIsReportedByEveryOtherRank) {
    const double deadline_s = 2.0;
    for (const char *kind : {"exit", "silent"}) {
        SCOPED_TRACE(kind);
        Ranks ranks(std::string("rank0") + kind);
        run_ranks(ranks, kRandom, "1,3", 3, {"--prompts", kPrompts}, {"--max-tokens", "6", "--max-sequences", "3", "--timeout", "2"},
                  std::string("rank=0,step=4,kind=") + kind, deadline_s + 5.0 + 3.0);
        const char *status = std::string(kind) == "exit" ? "MK_ERR_PEER_LOST" : "MK_ERR_PEER_TIMEOUT";
        for (size_t i = 0; i + 1 < ranks.size(); i++) { // ranks 1 and 2
            const std::string err = slurp(ranks[i].err);
            EXPECT_NE(exit_code(ranks[i]), 0) << err;
            EXPECT_LE(ranks[i].exit_s, deadline_s + 5.0) << err;
            EXPECT_NE(err.find(std::string("rank ") + std::to_string(i + 1) + ": " + status), std::string::npos) << err;
            EXPECT_NE(err.find("rank 0"), std::string::npos) << err;
            // rank 0 sends no list: each rank names the requests it held (it holds some at step 4)
            const std::string out = slurp(ranks[i].out);
            EXPECT_NE(out.find("rank " + std::to_string(i + 1) + ": seq "), std::string::npos) << out;
            EXPECT_NE(out.find("(rank 0 sent no list: a request this rank held)"), std::string::npos) << out;
        }
        EXPECT_NE(exit_code(ranks[ranks.size() - 1]), 0);
    }
}

// A rank on another model file (here another random seed) is refused at startup, before
// any request, by every rank, naming it: itself at once (rank 0 answers its hello), the
// others when rank 0 gives up waiting for a rank 2 of this run (its deadline, 2 s here: a
// hello is not authenticated, so a stranger's must not end the wait early).
TEST(Stage, DigestMismatchIsRefusedAtStartup) {
    Ranks ranks("digest");
    run_ranks(ranks, kRandom, "1,3", 3, {"--prompts", kPrompts}, {"--max-tokens", "4", "--timeout", "2"}, "", 15,
              {kRandom, kRandom, "--random:kv_heads=2,seed=7"});
    for (size_t i = 0; i < ranks.size(); i++) {
        const std::string err = slurp(ranks[i].err);
        EXPECT_EQ(exit_code(ranks[i]), 1) << err;
        EXPECT_NE(err.find("refused at startup: MK_ERR_RECIPE_DIGEST"), std::string::npos) << err;
        EXPECT_NE(err.find("rank 2's stage digest"), std::string::npos) << err;
        EXPECT_EQ(slurp(ranks[i].out).find("seq "), std::string::npos) << "a request ran";
    }
}

// Another cut on one rank changes the digest just the same.
TEST(Stage, CutMismatchIsRefusedAtStartup) {
    const int port = free_port();
    Ranks ranks("cuts");
    ranks.launch(1, stage_args(kRandom, "3", 1, 2, port, {"--timeout", "2"}), "");
    ranks.launch(0, stage_args(kRandom, "2", 0, 2, port, {"--timeout", "2", "--prompts", kPrompts}), "");
    ranks.wait(15);
    for (size_t i = 0; i < ranks.size(); i++) {
        EXPECT_EQ(exit_code(ranks[i]), 1);
        EXPECT_NE(slurp(ranks[i].err).find("MK_ERR_RECIPE_DIGEST"), std::string::npos) << slurp(ranks[i].err);
    }
}

// So does another seam transport on one rank (under MPI an nccl seam adds a broadcast
// every rank must take part in: a rank without it would leave the others waiting).
TEST(Stage, SeamMismatchIsRefusedAtStartup) {
    const int port = free_port();
    Ranks ranks("seam");
    ranks.launch(1, stage_args(kRandom, "2", 1, 2, port, {"--timeout", "2", "--seam", "unix"}), "");
    ranks.launch(0, stage_args(kRandom, "2", 0, 2, port, {"--timeout", "2", "--prompts", kPrompts}), "");
    ranks.wait(15);
    for (size_t i = 0; i < ranks.size(); i++) {
        const std::string err = slurp(ranks[i].err);
        EXPECT_EQ(exit_code(ranks[i]), 1) << err;
        EXPECT_NE(err.find("refused at startup: MK_ERR_RECIPE_DIGEST: rank 1's stage digest"), std::string::npos) << err;
        EXPECT_NE(err.find("cuts, seam or meshkern version"), std::string::npos) << err;
    }
}

// The backend options go through the run forms' shared parser: --kv f16 on one rank is
// another KV mode (another digest), refused at startup; the same --kv f16 on both runs and
// prints its weights. (--speed, a cuda flag, is refused on cpu: meshkern_cli.Input.speed_on_cpu.)
TEST(Stage, KvModeFromTheSharedParserIsPartOfTheDigest) {
    {
        const int port = free_port();
        Ranks ranks("kv");
        ranks.launch(1, stage_args(kRandom, "2", 1, 2, port, {"--timeout", "2", "--kv", "f16"}), "");
        ranks.launch(0, stage_args(kRandom, "2", 0, 2, port, {"--timeout", "2", "--prompts", kPrompts}), "");
        ranks.wait(15);
        for (size_t i = 0; i < ranks.size(); i++) {
            EXPECT_EQ(exit_code(ranks[i]), 1);
            EXPECT_NE(slurp(ranks[i].err).find("MK_ERR_RECIPE_DIGEST"), std::string::npos) << slurp(ranks[i].err);
        }
    }
    const int port = free_port();
    Ranks ranks("kv2");
    ranks.launch(1, stage_args(kRandom, "2", 1, 2, port, {"--timeout", "2", "--kv", "f16"}), "");
    ranks.launch(0, stage_args(kRandom, "2", 0, 2, port,
                               {"--timeout", "2", "--kv", "f16", "--max-tokens", "2", "--prompts", kPrompts}),
                 "");
    ranks.wait(15);
    for (size_t i = 0; i < ranks.size(); i++) EXPECT_EQ(exit_code(ranks[i]), 0) << slurp(ranks[i].err);
    EXPECT_NE(slurp(ranks[1].out).find("aggregate: "), std::string::npos) << slurp(ranks[1].out);
}

// ------------------------------------------------------------ in process --

// Both ranks of a 2-rank stage in this process through the library alone (rank 1 on a
// thread), on the random model: rank 0's reports and both ranks' statuses and messages.
struct LibraryRun {
    mk_status join[2] = {MK_OK, MK_OK}, serve[2] = {MK_OK, MK_OK};
    std::string message[2];
    std::vector<mk_stage_report> reports; // tokens copied below
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::string> errors;
};

void library_rank(const mk_model *model, mk_stage_options o, const std::vector<mk_stage_request> &req, LibraryRun *run) {
    const int rank = o.rank;
    mk_stage *st = nullptr;
    run->join[rank] = mk_stage_join(model, &o, &st);
    if (run->join[rank] != MK_OK) {
        run->message[rank] = mk_last_error();
        return;
    }
    auto report = [](void *user, const mk_stage_report *r) {
        LibraryRun *lr = static_cast<LibraryRun *>(user);
        lr->reports.push_back(*r);
        lr->tokens.emplace_back(r->tokens, r->tokens + r->n_tokens);
        lr->errors.emplace_back(r->error ? r->error : "");
    };
    run->serve[rank] = mk_stage_serve(st, rank == 0 ? req.data() : nullptr, rank == 0 ? req.size() : 0,
                                      rank == 0 ? +report : nullptr, run);
    run->message[rank] = mk_last_error();
    mk_stage_free(st);
}

LibraryRun run_library(const mk_model *model, mk_stage_options o, const std::vector<mk_stage_request> &req) {
    LibraryRun run;
    const std::string address = "127.0.0.1:" + std::to_string(free_port());
    o.rendezvous = address.c_str();
    static const int64_t cut = 2;
    o.cuts = &cut;
    o.n_cuts = 1;
    o.world = 2;
    mk_stage_options o1 = o;
    o1.rank = 1;
    std::thread t(library_rank, model, o1, req, &run);
    o.rank = 0;
    library_rank(model, o, req, &run);
    t.join();
    return run;
}

// A token limit that wraps when multiplied by 4 bytes (2^62: `meshkern stage --max-tokens
// 4611686018427387904` printed tokens outside the vocabulary and aborted in free()) is
// bounded by the context: the one-token prompt yields max_context tokens, then that request
// fails alone with the context error, and nothing is written past a buffer (ASan in CI).
TEST(StageLibrary, HugeTokenLimitIsBoundedByTheContext) {
    mk_model *model = random_model();
    const int32_t prompt[] = {11};
    const std::vector<mk_stage_request> req = {{prompt, 1}};
    for (size_t limit : {(size_t)1 << 62, SIZE_MAX}) {
        SCOPED_TRACE(limit);
        mk_stage_options o = mk_stage_options_default();
        o.range.max_context = 12;
        o.range.max_batch_tokens = 4;
        o.timeout_ms = 5000;
        o.max_new_tokens = limit;
        const LibraryRun run = run_library(model, o, req);
        ASSERT_EQ(run.join[0], MK_OK) << run.message[0];
        ASSERT_EQ(run.join[1], MK_OK) << run.message[1];
        // the request fails alone (its tokens kept); the run, and the other rank, end well
        EXPECT_EQ(run.serve[0], MK_OK) << run.message[0];
        ASSERT_EQ(run.reports.size(), 1u);
        EXPECT_EQ(run.reports[0].status, MK_ERR_CONTEXT_OVERFLOW) << run.errors[0];
        EXPECT_NE(run.errors[0].find("context of 12 positions is full after 12 tokens"), std::string::npos)
            << run.errors[0];
        EXPECT_EQ(run.tokens[0].size(), 12u);
        for (int32_t t : run.tokens[0]) EXPECT_LT((size_t)t, mk_model_hparams(model)->vocab);
        EXPECT_EQ(run.serve[1], MK_OK) << run.message[1];
    }
    mk_model_free(model);
}

// By default each rank's pool holds one full context per request in flight, in whole blocks:
// a context of 20 positions in blocks of 16 takes two (one would hold 16), so one request
// runs to the end of its context.
TEST(StageLibrary, TheDefaultPoolHoldsAWholeContextPerRequest) {
    mk_model *model = random_model();
    const int32_t prompt[] = {11};
    const std::vector<mk_stage_request> req = {{prompt, 1}};
    mk_stage_options o = mk_stage_options_default();
    o.range.max_context = 20;
    o.range.kv_block_size = 16;
    o.max_sequences = 1;
    o.timeout_ms = 5000;
    o.max_new_tokens = 20; // positions 0..19: every one of the context
    const LibraryRun run = run_library(model, o, req);
    ASSERT_EQ(run.join[0], MK_OK) << run.message[0];
    ASSERT_EQ(run.join[1], MK_OK) << run.message[1];
    EXPECT_EQ(run.serve[0], MK_OK) << run.message[0];
    EXPECT_EQ(run.serve[1], MK_OK) << run.message[1];
    ASSERT_EQ(run.reports.size(), 1u);
    EXPECT_EQ(run.reports[0].status, MK_OK) << run.errors[0];
    EXPECT_EQ(run.tokens[0].size(), 20u);
    mk_model_free(model);
}

// Rank 0 of a two-rank stage joined in this thread (cut after layer 2, loopback), rank 1 on
// *rank1 through the library (its outcome in *other); NULL when rank 0 could not join.
mk_stage *join_rank0(const mk_model *model, mk_stage_options o, std::thread *rank1, LibraryRun *other) {
    const std::string address = "127.0.0.1:" + std::to_string(free_port());
    o.rendezvous = address.c_str();
    static const int64_t cut = 2;
    o.cuts = &cut;
    o.n_cuts = 1;
    mk_stage_options o1 = o;
    o1.rank = 1;
    *rank1 = std::thread(library_rank, model, o1, std::vector<mk_stage_request>{}, other);
    o.rank = 0;
    mk_stage *st = nullptr;
    if (mk_stage_join(model, &o, &st) != MK_OK) return nullptr;
    return st;
}

// Rank 0's live source (meshkern stage --serve), with rank 1 on a thread: requests are
// released over time through an eventfd (the first after an idle spell of 3 deadlines, which
// rank 1 survives only if rank 0 beats while idle; each later one when a token arrives), so
// they join while others run; one is cut by on_token after 2 tokens; one has a prompt over
// max_batch_tokens and fails alone; the run ends when the source closes. Each token streams
// out as it comes; every request's tokens equal the whole model's.
struct LiveSource {
    std::vector<std::vector<int32_t>> prompts;
    size_t cut_index = 1, cut_after = 2, too_long_index = 3;
    int wake_fd = -1;
    std::mutex mu;
    size_t released = 0, taken = 0;
    std::map<uint64_t, std::vector<int32_t>> streamed;
    std::map<uint64_t, mk_stage_report> reports;
    std::map<uint64_t, std::vector<int32_t>> report_tokens;
    void release() {
        std::lock_guard<std::mutex> g(mu);
        if (released < prompts.size()) released++;
        const uint64_t one = 1;
        (void)!write(wake_fd, &one, sizeof one);
    }
};

TEST(StageLibrary, LiveSourceAdmitsWhileRunningCutsAndRefusesAlone) {
    mk_model *model = random_model();
    auto prompts = read_prompts(kPrompts);
    ASSERT_GE(prompts.size(), 3u);
    size_t longest = 0;
    for (const auto &p : prompts) longest = std::max(longest, p.size());
    const size_t n_new = 5;
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, n_new);
    LiveSource src;
    src.prompts = prompts;
    src.too_long_index = prompts.size();
    src.prompts.push_back(std::vector<int32_t>(longest + 1, 7)); // over max_batch_tokens
    src.wake_fd = eventfd(0, EFD_NONBLOCK);
    ASSERT_GE(src.wake_fd, 0);

    mk_stage_options o = mk_stage_options_default();
    o.range.backend.weight_dtype = MK_DTYPE_F32;
    o.range.max_context = longest + 1 + n_new;
    o.range.max_batch_tokens = longest;
    o.max_new_tokens = n_new;
    o.max_sequences = 2;
    o.timeout_ms = 400;
    LibraryRun other;
    std::thread rank1;
    mk_stage *st = join_rank0(model, o, &rank1, &other);
    ASSERT_NE(st, nullptr) << mk_last_error();

    mk_stage_source s{};
    s.struct_size = sizeof s;
    s.take = [](void *user, mk_stage_arrival *next) {
        LiveSource *l = static_cast<LiveSource *>(user);
        uint64_t drained;
        (void)!read(l->wake_fd, &drained, sizeof drained);
        std::lock_guard<std::mutex> g(l->mu);
        if (l->taken == l->released) return false;
        const size_t i = l->taken++;
        *next = mk_stage_arrival{l->prompts[i].data(), l->prompts[i].size(), 0, 100 + i};
        return true;
    };
    s.on_token = [](void *user, uint64_t tag, int32_t token) {
        LiveSource *l = static_cast<LiveSource *>(user);
        auto &got = l->streamed[tag];
        got.push_back(token);
        l->release(); // the next request joins while this one runs
        return !(tag == 100 + l->cut_index && got.size() == l->cut_after);
    };
    s.report = [](void *user, const mk_stage_report *r) {
        LiveSource *l = static_cast<LiveSource *>(user);
        EXPECT_EQ(l->reports.count(r->request), 0u) << "reported twice: " << r->request;
        l->reports[r->request] = *r;
        l->report_tokens[r->request].assign(r->tokens, r->tokens + r->n_tokens);
        if (r->status != MK_OK) l->release(); // a refused request makes room for the next
    };
    s.closed = [](void *user) {
        LiveSource *l = static_cast<LiveSource *>(user);
        std::lock_guard<std::mutex> g(l->mu);
        return l->taken == l->prompts.size();
    };
    s.wake_fd = src.wake_fd;
    s.user = &src;
    std::thread first([&src] { usleep(1200 * 1000); src.release(); }); // idle for 3 deadlines first
    const mk_status served = mk_stage_serve_source(st, &s);
    first.join();
    EXPECT_EQ(served, MK_OK) << mk_last_error();
    mk_stage_live_stats live{};
    ASSERT_EQ(mk_stage_live(st, &live), MK_OK);
    mk_stage_free(st);
    rank1.join();
    EXPECT_EQ(other.join[1], MK_OK) << other.message[1];
    EXPECT_EQ(other.serve[1], MK_OK) << other.message[1];

    ASSERT_EQ(src.reports.size(), src.prompts.size());
    for (size_t i = 0; i < src.prompts.size(); i++) {
        SCOPED_TRACE(i);
        const mk_stage_report &r = src.reports[100 + i];
        if (i == src.too_long_index) {
            EXPECT_EQ(r.status, MK_ERR_CONTEXT_OVERFLOW);
            EXPECT_EQ(src.report_tokens[100 + i].size(), 0u);
            EXPECT_EQ(src.streamed.count(100 + i), 0u);
            continue;
        }
        EXPECT_EQ(r.status, MK_OK);
        std::vector<int32_t> expect = want[i];
        if (i == src.cut_index) expect.resize(src.cut_after);
        EXPECT_EQ(src.report_tokens[100 + i], expect);
        EXPECT_EQ(src.streamed[100 + i], expect);
        EXPECT_FALSE(r.stopped);
    }
    // prefill + decode steps of the requests run, each sent to rank 1
    size_t steps = 0;
    for (size_t i = 0; i < prompts.size(); i++) steps += i == src.cut_index ? src.cut_after : n_new;
    EXPECT_EQ(live.steps, steps);
    EXPECT_GT(live.busy_seconds, 0.0);
    EXPECT_GT(live.bytes_sent, steps * 32 * sizeof(float));
    close(src.wake_fd);
    mk_model_free(model);
}

// A live source's cancel reaches a request part-way through its chunked prompt: with
// chunks of 2 rows, request A (a prompt of 9 tokens: 5 chunks) and request B (2 tokens)
// start in one step; B's first token cancels A (the client gone). Rank 0 asks the source
// between steps and ends A after the one chunk that ran (MK_OK, not stopped, no tokens)
// instead of computing its other 4 chunks; B runs on and equals the whole model; B is
// asked only between its steps, never while its rows are out; every block of rank 0 is back.
struct CancelSource {
    std::vector<std::vector<int32_t>> prompts;
    size_t taken = 0;
    bool cancel_a = false;
    size_t asked_b = 0;
    std::map<uint64_t, mk_stage_report> reports;
    std::map<uint64_t, std::vector<int32_t>> tokens;
};

TEST(StageLibrary, LiveSourceCancelStopsAChunkedPromptBetweenSteps) {
    mk_model *model = random_model();
    const size_t n_new = 4;
    const std::vector<int32_t> a = {5, 9, 2, 14, 7, 7, 30, 1, 11}, b = {3, 17};
    const auto want_b = whole_model(model, MK_DTYPE_F32, {b}, n_new);
    mk_stage_options o = mk_stage_options_default();
    o.range.backend.weight_dtype = MK_DTYPE_F32;
    o.range.max_context = a.size() + n_new;
    o.range.max_batch_tokens = a.size();
    o.max_new_tokens = n_new;
    o.max_sequences = 2;
    o.prefill_chunk = 2;
    o.timeout_ms = 5000;
    LibraryRun other;
    std::thread rank1;
    mk_stage *st = join_rank0(model, o, &rank1, &other);
    ASSERT_NE(st, nullptr) << mk_last_error();

    CancelSource src;
    src.prompts = {a, b};
    mk_stage_source s{};
    s.struct_size = sizeof s;
    s.take = [](void *user, mk_stage_arrival *next) {
        CancelSource *c = static_cast<CancelSource *>(user);
        if (c->taken == c->prompts.size()) return false;
        const size_t i = c->taken++;
        *next = mk_stage_arrival{c->prompts[i].data(), c->prompts[i].size(), 0, 10 + i};
        return true;
    };
    s.on_token = [](void *user, uint64_t tag, int32_t) {
        CancelSource *c = static_cast<CancelSource *>(user);
        EXPECT_EQ(tag, 11u) << "a cancelled request made a token";
        c->cancel_a = true;
        return true;
    };
    s.report = [](void *user, const mk_stage_report *r) {
        CancelSource *c = static_cast<CancelSource *>(user);
        c->reports[r->request] = *r;
        c->tokens[r->request].assign(r->tokens, r->tokens + r->n_tokens);
    };
    s.closed = [](void *user) { // open until both ended: rank 0 keeps waking on wake_fd
        CancelSource *c = static_cast<CancelSource *>(user);
        return c->reports.size() == c->prompts.size();
    };
    // never drained: every wait of rank 0 returns at once, so it also goes round its loop
    // while a step runs, and must not ask about (nor end) a request whose rows are out
    const int wake = eventfd(1, EFD_NONBLOCK);
    ASSERT_GE(wake, 0);
    s.wake_fd = wake;
    s.user = &src;
    s.cancelled = [](void *user, uint64_t tag) {
        CancelSource *c = static_cast<CancelSource *>(user);
        if (tag == 11) c->asked_b++;
        return tag == 10 && c->cancel_a;
    };
    const mk_status served = mk_stage_serve_source(st, &s);
    EXPECT_EQ(served, MK_OK) << mk_last_error();
    mk_stage_live_stats live{};
    ASSERT_EQ(mk_stage_live(st, &live), MK_OK);
    mk_kv_pool_info pool{};
    ASSERT_EQ(mk_range_kv_pool(mk_stage_range(st), &pool), MK_OK);
    mk_stage_free(st);
    rank1.join();
    EXPECT_EQ(other.serve[1], MK_OK) << other.message[1];

    ASSERT_EQ(src.reports.size(), 2u);
    EXPECT_EQ(src.reports[10].status, MK_OK);
    EXPECT_FALSE(src.reports[10].stopped);
    EXPECT_TRUE(src.tokens[10].empty());
    EXPECT_EQ(src.reports[11].status, MK_OK);
    EXPECT_EQ(src.tokens[11], want_b[0]);
    // B: its prompt (one chunk) and n_new - 1 decode rows; A: its first chunk only
    EXPECT_EQ(live.steps, 1 + (n_new - 1) + 1);
    EXPECT_EQ(src.asked_b, n_new - 1) << "B is asked once per step result before its last";
    EXPECT_EQ(pool.free_blocks, pool.blocks) << "rank 0 kept blocks";
    EXPECT_EQ(pool.promised_blocks, 0u);
    close(wake);
    mk_model_free(model);
}

// Continuous batching across processes (in this process through the library, rank 1 on a
// thread): four requests admitted together go through rank 0 in one forward (their
// prompts), later steps carry every returned token together, and each request's tokens
// equal the whole model's; fewer forwards than boundaries.
// Rank 0 serves the first four prompts (mk_stage_serve), each report kept in run.
void serve_prompts(mk_stage *st, const std::vector<std::vector<int32_t>> &prompts, size_t n, LibraryRun *run) {
    std::vector<mk_stage_request> req;
    for (size_t i = 0; i < n; i++) req.push_back({prompts[i].data(), prompts[i].size()});
    auto report = [](void *user, const mk_stage_report *r) {
        LibraryRun *lr = static_cast<LibraryRun *>(user);
        lr->reports.push_back(*r);
        lr->tokens.emplace_back(r->tokens, r->tokens + r->n_tokens);
        lr->errors.emplace_back(r->error ? r->error : "");
    };
    EXPECT_EQ(mk_stage_serve(st, req.data(), req.size(), +report, run), MK_OK) << mk_last_error();
}

void serve_first_four(mk_stage *st, const std::vector<std::vector<int32_t>> &prompts, LibraryRun *run) {
    serve_prompts(st, prompts, 4, run);
}

// Every one of n requests succeeded with the whole model's tokens.
void expect_whole_model_tokens(const LibraryRun &run, const std::vector<std::vector<int32_t>> &want, size_t n) {
    ASSERT_EQ(run.reports.size(), n);
    for (size_t k = 0; k < n; k++) {
        EXPECT_EQ(run.reports[k].status, MK_OK) << run.errors[k];
        EXPECT_EQ(run.tokens[k], want[run.reports[k].request]) << "request " << run.reports[k].request;
    }
}

// Rank 0 (this thread) and rank 1 (a thread) serve the first four prompts with options o:
// rank 0's reports, rank 1's outcome, and rank 0's live figures and KV pool at the end.
struct FourServed {
    bool joined = false;
    LibraryRun run, other;
    mk_stage_live_stats live{};
    mk_kv_pool_info pool{};
};

FourServed serve_four(const mk_model *model, const mk_stage_options &o, const std::vector<std::vector<int32_t>> &prompts) {
    FourServed f;
    std::thread rank1;
    mk_stage *st = join_rank0(model, o, &rank1, &f.other);
    f.joined = st != nullptr;
    EXPECT_TRUE(f.joined) << mk_last_error();
    if (f.joined) {
        serve_first_four(st, prompts, &f.run);
        EXPECT_EQ(mk_stage_live(st, &f.live), MK_OK);
        EXPECT_EQ(mk_range_kv_pool(mk_stage_range(st), &f.pool), MK_OK);
        mk_stage_free(st);
    }
    rank1.join();
    EXPECT_EQ(f.other.serve[1], MK_OK) << f.other.message[1];
    return f;
}

// Options for the first four prompts, n_new tokens each, all four in flight and their
// prompts in one step of rank 0 (f32 weights, a 5 s deadline).
mk_stage_options four_in_one_step(const std::vector<std::vector<int32_t>> &prompts, size_t n_new) {
    size_t rows = 0, longest = 0;
    for (size_t i = 0; i < 4; i++) rows += prompts[i].size(), longest = std::max(longest, prompts[i].size());
    mk_stage_options o = mk_stage_options_default();
    o.range.backend.weight_dtype = MK_DTYPE_F32;
    o.range.max_context = longest + n_new;
    o.range.max_batch_tokens = std::min(rows, o.range.max_context);
    o.max_new_tokens = n_new;
    o.max_sequences = 4;
    o.timeout_ms = 5000;
    return o;
}

// The four prompts through rank 0's forward together (its steps: a prefill and a decode row
// per token each), and again with o.prefill_chunk = 2, where rank 0 sends each prompt in
// chunks of 2 rows (the prompts of 3, 2, 5 and 1 tokens take 2, 1, 3 and 1 steps; the tokens
// it gets back for a chunk before the last are not the answer's): every request's tokens
// equal the whole model's, and rank 0 sent one boundary per chunk and per decode token.
TEST(StageLibrary, ReadyRequestsShareRankZerosForward) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    ASSERT_GE(prompts.size(), 4u);
    const size_t n_new = 6;
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, n_new);
    for (size_t chunk : {0, 2}) {
        SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
        mk_stage_options o = four_in_one_step(prompts, n_new);
        o.prefill_chunk = chunk;
        const FourServed f = serve_four(model, o, prompts);
        ASSERT_TRUE(f.joined);
        expect_whole_model_tokens(f.run, want, 4);
        size_t chunks = 0;
        for (size_t i = 0; i < 4; i++) chunks += chunk ? (prompts[i].size() + chunk - 1) / chunk : 1;
        EXPECT_EQ(f.live.steps, 4 * (n_new - 1) + chunks);
        EXPECT_GT(chunks, chunk ? 4u : 3u);
        EXPECT_LE(f.live.forwards, f.live.steps - 3) << "the four prompts' first rows went through one forward";
        // and each forward's boundaries crossed to rank 1 as one batch message
        EXPECT_EQ(f.live.messages_sent, f.live.forwards);
    }
    mk_model_free(model);
}

// The first four prompts served by rank 0 and rank 1 (a thread) with KV pools of blocks of 4
// positions, `pool_runs` of the longest of their runs of 6 tokens (or `pool_blocks` outright),
// at most `max_sequences` in flight: every request's tokens equal the whole model's, and
// every block of rank 0 is back (none promised) at the end.
void serve_four_with_small_pools(size_t pool_runs, size_t max_sequences) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    ASSERT_GE(prompts.size(), 4u);
    const size_t n_new = 6, block = 4;
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, n_new);
    size_t longest = 0, most_blocks = 0;
    for (size_t i = 0; i < 4; i++) {
        longest = std::max(longest, prompts[i].size());
        most_blocks = std::max(most_blocks, (prompts[i].size() + n_new - 1 + block - 1) / block);
    }
    mk_stage_options o = mk_stage_options_default();
    o.range.backend.weight_dtype = MK_DTYPE_F32;
    o.range.max_context = longest + n_new;
    o.range.kv_block_size = block;
    o.range.kv_pool_blocks = pool_runs * most_blocks;
    o.max_new_tokens = n_new;
    o.max_sequences = max_sequences;
    o.timeout_ms = 5000;
    const FourServed f = serve_four(model, o, prompts);
    ASSERT_TRUE(f.joined);
    EXPECT_EQ(f.pool.blocks, pool_runs * most_blocks);
    EXPECT_EQ(f.pool.free_blocks, f.pool.blocks) << "rank 0 kept blocks";
    EXPECT_EQ(f.pool.promised_blocks, 0u);
    const LibraryRun &run = f.run;
    expect_whole_model_tokens(run, want, 4);
    mk_model_free(model);
}

// KV pools that hold one of the longest requests at a time (blocks of 4): rank 0 admits a
// request only once its blocks are promised, the others wait, and every request still gets
// the whole model's tokens; rank 0 tells rank 1 when a request is over, so rank 1's pool
// (the same size) never runs dry on a finished request's blocks; every block is back at
// the end.
TEST(StageLibrary, SmallKvPoolsAdmitRequestsAsBlocksFree) { serve_four_with_small_pools(1, 4); }

// A request whose run no pool could ever hold (its prompt alone outgrows rank 0's blocks,
// though it fits the context) fails alone at admission with MK_ERR_KV_POOL_FULL, naming the
// blocks; the requests around it run and equal the whole model; no block is kept.
TEST(StageLibrary, ARequestNoPoolCouldHoldFailsAlone) {
    mk_model *model = random_model();
    std::vector<std::vector<int32_t>> prompts = read_prompts(kPrompts);
    ASSERT_GE(prompts.size(), 2u);
    const size_t n_new = 4, block = 4;
    size_t longest = std::max(prompts[0].size(), prompts[1].size());
    const size_t blocks = (longest + n_new - 1 + block - 1) / block;
    const std::vector<int32_t> too_long(blocks * block, 3); // + n_new - 1 positions: one block over
    prompts.insert(prompts.begin() + 1, too_long);
    const auto want = whole_model(model, MK_DTYPE_F32, {prompts[0], prompts[2]}, n_new);
    mk_stage_options o = mk_stage_options_default();
    o.range.backend.weight_dtype = MK_DTYPE_F32;
    o.range.max_context = 4 * (too_long.size() + n_new);
    o.range.kv_block_size = block;
    o.range.kv_pool_blocks = blocks;
    o.max_new_tokens = n_new;
    o.max_sequences = 2;
    o.timeout_ms = 5000;
    LibraryRun other;
    std::thread rank1;
    mk_stage *st = join_rank0(model, o, &rank1, &other);
    ASSERT_NE(st, nullptr) << mk_last_error();
    LibraryRun run;
    serve_prompts(st, prompts, 3, &run);
    ASSERT_EQ(run.reports.size(), 3u);
    for (size_t k = 0; k < 3; k++) {
        const size_t i = run.reports[k].request;
        if (i == 1) {
            EXPECT_EQ(run.reports[k].status, MK_ERR_KV_POOL_FULL) << run.errors[k];
            EXPECT_NE(run.errors[k].find("rank 0: a sequence of up to " + std::to_string(too_long.size() + n_new - 1) +
                                         " positions needs " + std::to_string(blocks + 1) + " KV blocks; the pool holds " +
                                         std::to_string(blocks)),
                      std::string::npos)
                << run.errors[k];
            EXPECT_TRUE(run.tokens[k].empty());
        } else {
            EXPECT_EQ(run.reports[k].status, MK_OK) << run.errors[k];
            EXPECT_EQ(run.tokens[k], want[i == 0 ? 0 : 1]) << "request " << i;
        }
    }
    mk_kv_pool_info pool{};
    ASSERT_EQ(mk_range_kv_pool(mk_stage_range(st), &pool), MK_OK);
    EXPECT_EQ(pool.free_blocks, pool.blocks) << "rank 0 kept blocks";
    mk_stage_free(st);
    rank1.join();
    EXPECT_EQ(other.serve[1], MK_OK) << other.message[1];
    mk_model_free(model);
}

// Rank 0's step of four decode rows goes to rank 1 as one batch message; one entry lies
// about its position (fault lying_entry at rank 0's boundary 5, a decode step): rank 1
// refuses that entry alone and says so, rank 0 fails that request with
// MK_ERR_POSITIONS_SHAPE, the other three get the whole model's tokens, both ranks finish
// the run, and every block of rank 0 is back.
TEST(StageLibrary, ALyingEntryOfABatchFailsOnlyItsRequest) {
    setenv("MESHKERN_FAULT", "rank=0,step=5,kind=lying_entry", 1);
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    ASSERT_GE(prompts.size(), 4u);
    const size_t n_new = 5;
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, n_new);
    const FourServed f = serve_four(model, four_in_one_step(prompts, n_new), prompts);
    ASSERT_TRUE(f.joined);
    EXPECT_EQ(f.pool.free_blocks, f.pool.blocks) << "rank 0 kept blocks";
    const LibraryRun &run = f.run;
    ASSERT_EQ(run.reports.size(), 4u);
    size_t failed = 0;
    for (size_t k = 0; k < 4; k++) {
        if (run.reports[k].status != MK_OK) {
            failed++;
            EXPECT_EQ(run.reports[k].status, MK_ERR_POSITIONS_SHAPE) << run.errors[k];
            EXPECT_NE(run.errors[k].find("rank 1 refused the boundary of req-"), std::string::npos) << run.errors[k];
            EXPECT_NE(run.errors[k].find("does not continue the sequence"), std::string::npos) << run.errors[k];
            EXPECT_EQ(run.tokens[k].size(), 1u) << "its prefill's token came, then the lie";
            continue;
        }
        EXPECT_EQ(run.tokens[k], want[run.reports[k].request]) << "request " << run.reports[k].request;
    }
    EXPECT_EQ(failed, 1u);
    mk_model_free(model);
    unsetenv("MESHKERN_FAULT");
}

// Rank 0 sends each FINISHED after its next step's boundaries (fault late_finished), so the
// next request's prefill reaches rank 1 first: with a pool for one request, rank 1 finds its
// pool full and waits for the FINISHED before its forward; with room for all but two slots,
// it finds every slot held and waits for the FINISHED before taking one (never evicting a
// live request). Either way every token equals the whole model's and no block is kept.
TEST(StageLibrary, APrefillBeforeItsPredecessorsFinishedWaitsForIt) {
    setenv("MESHKERN_FAULT", "rank=0,step=0,kind=late_finished", 1);
    {
        SCOPED_TRACE("a pool for one request");
        serve_four_with_small_pools(1, 4);
    }
    {
        SCOPED_TRACE("two slots");
        serve_four_with_small_pools(4, 2);
    }
    unsetenv("MESHKERN_FAULT");
}

// A live source is rank 0's, over a seam that can wait idle.
TEST(StageLibrary, LiveSourceIsRefusedWhereItCannotRun) {
    EXPECT_EQ(mk_stage_serve_source(nullptr, nullptr), MK_ERR_INVALID_ARGUMENT);
    mk_stage_live_stats live;
    EXPECT_EQ(mk_stage_live(nullptr, &live), MK_ERR_INVALID_ARGUMENT);
}

// ------------------------------------------------------------ strangers --

size_t count(const std::string &hay, const std::string &needle) {
    size_t n = 0;
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) n++;
    return n;
}

// A TCP connection to 127.0.0.1:port, retried until someone listens (limit_s).
int connect_to(int port, double limit_s = 5.0) {
    const double t0 = now_s();
    for (;;) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        if (connect(fd, (sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
        if (now_s() - t0 > limit_s) return -1;
        usleep(20000);
    }
}

// A control message as a rank sends it: "MKCT", type, length (little-endian), then body.
std::string ctl_message(uint32_t type, const std::string &body, int64_t announced = -1) {
    const uint32_t head[3] = {MK_CTL_MAGIC, type, announced < 0 ? (uint32_t)body.size() : (uint32_t)announced};
    std::string m(reinterpret_cast<const char *>(head), sizeof head); // x86: little-endian already
    return m + body;
}

void send_all(int fd, const std::string &bytes) { ASSERT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size()); }

// Until `needle` shows in the file (a rank's stderr) or limit_s passes.
bool wait_for_text(const std::string &path, const std::string &needle, double limit_s) {
    const double t0 = now_s();
    while (now_s() - t0 < limit_s) {
        if (slurp(path).find(needle) != std::string::npos) return true;
        usleep(20000);
    }
    return false;
}

// The stage digest the CLI's ranks compute for --random:kv_heads=2 --split 1,3 (world 3, tcp).
std::string cli_stage_digest(const mk_model *model) {
    mk_stage_options o = mk_stage_options_default();
    static const int64_t cuts_in[2] = {1, 3};
    o.world = 3;
    o.cuts = cuts_in;
    o.n_cuts = 2;
    int64_t cuts[MK_STAGE_MAX_WORLD];
    char digest[MK_DIGEST_HEX_LEN + 1] = "";
    EXPECT_EQ(mk_stage_plan(model, &o, cuts, digest), MK_OK) << mk_last_error();
    return digest;
}

// What a readiness probe, a port scan, a rank of another run or a half-dead client does to
// rank 0's rendezvous port while the real ranks join (a connect-and-close used to stop the
// whole mesh; a silent half-sent hello blocked the one-at-a-time accept until the deadline
// and the real ranks were blamed): each is dropped and logged with its peer address, the
// run goes on and its tokens equal the whole model's. A duplicate hello for a rank already
// joined (with the right digest) is dropped too.
TEST(StageRendezvous, StrangersAreDroppedWhileTheRealRanksJoin) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 3);
    const std::string digest = cli_stage_digest(model);
    const int port = free_port();
    Ranks ranks("strangers");
    const std::vector<std::string> extra = {"--max-tokens", "3", "--max-sequences", "2", "--timeout", "2"};
    std::vector<std::string> a0 = extra;
    a0.insert(a0.end(), {"--prompts", kPrompts});
    ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, a0), "");
    std::vector<int> held; // closed at the end: the half-sent hello stays silent throughout
    const int probe = connect_to(port);
    ASSERT_GE(probe, 0) << "rank 0 does not listen";
    close(probe); // connect-and-close
    const struct {
        const char *what;
        std::string bytes;
    } strangers[] = {
        {"garbage", "GET / HTTP/1.0\r\n\r\n"},
        {"huge length", ctl_message(MK_CTL_HELLO, "", 0xffffffffu)},
        {"bad rank", ctl_message(MK_CTL_HELLO, "7 3 " + digest + " 127.0.0.1:1")},
        {"bad digest", ctl_message(MK_CTL_HELLO, "1 3 " + std::string(64, '0') + " 127.0.0.1:1")},
        {"bad world", ctl_message(MK_CTL_HELLO, "2 4 " + digest + " 127.0.0.1:1")},
        {"not a hello", ctl_message(MK_CTL_BYE, "")},
        {"half-sent hello", ctl_message(MK_CTL_HELLO, "1 3 ", 100)},
    };
    for (const auto &x : strangers) {
        const int fd = connect_to(port);
        ASSERT_GE(fd, 0) << x.what;
        send_all(fd, x.bytes);
        held.push_back(fd);
    }
    ranks.launch(1, stage_args(kRandom, "1,3", 1, 3, port, extra), "");
    ASSERT_TRUE(wait_for_text(ranks[0].err, "rank 1 joined from 127.0.0.1:", 10)) << slurp(ranks[0].err);
    const int dup = connect_to(port);
    ASSERT_GE(dup, 0);
    send_all(dup, ctl_message(MK_CTL_HELLO, "1 3 " + digest + " 127.0.0.1:1"));
    held.push_back(dup);
    ASSERT_TRUE(wait_for_text(ranks[0].err, "rank 1 joined twice", 10)) << slurp(ranks[0].err);
    ranks.launch(2, stage_args(kRandom, "1,3", 2, 3, port, extra), "");
    ranks.wait(20);
    for (int fd : held) close(fd);
    expect_parity(ranks, 0, want);
    const std::string err = slurp(ranks[0].err);
    EXPECT_NE(err.find("rank 0: rendezvous: dropped 127.0.0.1:"), std::string::npos) << err;
    for (const char *why : {"closed without a word", "not a meshkern control message (magic 0x20544547)",
                            "a hello of 4294967295 bytes announced (limit 4096)",
                            "a rank joined as rank 7 of world 3", "rank 1's stage digest 0000000000000000... differs",
                            "rank 2 runs with world 4, rank 0 with 3", "a control message of type 5 where a hello belongs",
                            "rank 1 joined twice (first from 127.0.0.1:"})
        EXPECT_NE(err.find(why), std::string::npos) << why << "\n" << err;
    mk_model_free(model);
}

// A flood of silent connections fills rank 0's table of connections without a hello (64):
// each one past it makes room by dropping the oldest, which has waited longest (a newest-first
// rule would drop whoever just connected, the real rank among them). The drop names the
// first connection's address; the real ranks then join and the run's tokens are the model's.
TEST(StageRendezvous, AFullTableOfSilentStrangersDropsTheOldestFirst) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 3);
    const int port = free_port();
    Ranks ranks("flood");
    const std::vector<std::string> extra = {"--max-tokens", "3", "--max-sequences", "2", "--timeout", "10"};
    std::vector<std::string> a0 = extra;
    a0.insert(a0.end(), {"--prompts", kPrompts});
    ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, a0), "");
    // rank 0 listens before its accept loop runs (it plans and loads first): one silent probe,
    // dropped at its hello deadline, says the loop is there to take the flood at once
    const int probe = connect_to(port);
    ASSERT_GE(probe, 0) << "rank 0 does not listen";
    ASSERT_TRUE(wait_for_text(ranks[0].err, "said nothing within", 10)) << slurp(ranks[0].err);
    close(probe);
    std::vector<int> held;
    std::vector<int> local_port;
    for (int i = 0; i < 65; i++) { // 5 ms apart: each accepted at its own millisecond (an age)
        usleep(5000);
        const int fd = connect_to(port);
        ASSERT_GE(fd, 0) << "connection " << i;
        sockaddr_in a{};
        socklen_t len = sizeof a;
        ASSERT_EQ(getsockname(fd, (sockaddr *)&a, &len), 0);
        held.push_back(fd);
        local_port.push_back(ntohs(a.sin_port));
    }
    ASSERT_TRUE(wait_for_text(ranks[0].err, "no hello while 64 later connections waited", 10)) << slurp(ranks[0].err);
    const std::string flooded = slurp(ranks[0].err);
    const std::string first = "dropped 127.0.0.1:" + std::to_string(local_port[0]) + ": no hello while 64";
    EXPECT_NE(flooded.find(first), std::string::npos) << "the oldest was not the one dropped:\n" << flooded;
    ranks.launch(1, stage_args(kRandom, "1,3", 1, 3, port, extra), "");
    ranks.launch(2, stage_args(kRandom, "1,3", 2, 3, port, extra), "");
    ranks.wait(30);
    for (int fd : held) close(fd);
    expect_parity(ranks, 0, want);
    mk_model_free(model);
}

// The same at a rank's seam listener (it took the first connection as its previous rank:
// one port scan stopped the whole run): a connect-and-close, garbage, a frame header where
// the ticket belongs, a ticket of another run and a silent client, all queued before rank
// 0 connects, are each dropped and logged with their address, and rank 0's connection
// (behind them in the backlog, proving itself with the run's ticket) becomes the seam.
TEST(StageSeam, StrangersAtASeamListenerAreDroppedAndTheRealRankConnects) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 3);
    const int port = free_port();
    Ranks ranks("seam_strangers");
    // a 20 s deadline: each stranger gets 2 s of it (the silent one all of them), not the whole
    const std::vector<std::string> extra = {"--max-tokens", "3", "--max-sequences", "2", "--timeout", "20"};
    std::vector<std::string> a0 = extra;
    a0.insert(a0.end(), {"--prompts", kPrompts});
    ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, a0), "");
    ranks.launch(1, stage_args(kRandom, "1,3", 1, 3, port, extra), "");
    ASSERT_TRUE(wait_for_text(ranks[1].err, "seam listener at 127.0.0.1:", 10)) << slurp(ranks[1].err);
    const std::string err1 = slurp(ranks[1].err);
    const size_t at = err1.find("seam listener at 127.0.0.1:") + std::strlen("seam listener at 127.0.0.1:");
    const int seam_port = std::atoi(err1.c_str() + at);
    ASSERT_GT(seam_port, 0) << err1;
    const int scan = connect_to(seam_port);
    ASSERT_GE(scan, 0);
    close(scan);
    std::vector<int> held;
    for (const std::string &bytes : {std::string("GET / HTTP/1.0\r\n\r\n"), std::string("MKFR") + std::string(36, '\xff'),
                                     std::string("MKSEAM01") + std::string(32, 'a'), std::string()}) {
        const int fd = connect_to(seam_port);
        ASSERT_GE(fd, 0);
        if (!bytes.empty()) send_all(fd, bytes);
        held.push_back(fd);
    }
    ranks.launch(2, stage_args(kRandom, "1,3", 2, 3, port, extra), "");
    ranks.wait(40);
    for (int fd : held) close(fd);
    expect_parity(ranks, 0, want);
    for (size_t i = 0; i < ranks.size(); i++) EXPECT_LT(ranks[i].exit_s, 12.0) << "the strangers held the seam's start";
    const std::string err = slurp(ranks[1].err);
    for (const char *why : {"the peer closed the connection after 0 of 40 bytes of the seam ticket",
                            "its first bytes are not a meshkern seam ticket", "a seam ticket of another run",
                            "the peer did not send the seam ticket before the deadline"})
        EXPECT_NE(err.find(why), std::string::npos) << why << "\n" << err;
    EXPECT_EQ(count(err, "dropped 127.0.0.1:"), 5u) << err;
    mk_model_free(model);
}

// A rank that never comes: rank 0 waits until its own deadline (strangers do not end the
// wait early), then every rank's failure names the rank missing and each connection
// dropped, with its peer address and why; a stranger that claimed the missing rank with
// another stage digest gives the status. The silent half-sent hello is dropped at its own
// hello deadline (the run's timeout, here 1 s) without holding anything up.
TEST(StageRendezvous, FailureNamesTheMissingRankAndTheDroppedStrangers) {
    const int port = free_port();
    Ranks ranks("missing2");
    ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, {"--timeout", "1", "--prompts", kPrompts}), "");
    const int probe = connect_to(port);
    ASSERT_GE(probe, 0);
    close(probe);
    const int half = connect_to(port);
    ASSERT_GE(half, 0);
    send_all(half, ctl_message(MK_CTL_HELLO, "2 3 ", 90));
    const int claim = connect_to(port);
    ASSERT_GE(claim, 0);
    send_all(claim, ctl_message(MK_CTL_HELLO, "2 3 " + std::string(64, 'f') + " 127.0.0.1:1"));
    ranks.launch(1, stage_args(kRandom, "1,3", 1, 3, port, {"--timeout", "1"}), "");
    ranks.wait(8);
    close(half);
    close(claim);
    EXPECT_LE(ranks[0].exit_s, 1.0 + 3.0);
    for (size_t i = 0; i < ranks.size(); i++) {
        const std::string err = slurp(ranks[i].err);
        EXPECT_EQ(exit_code(ranks[i]), 1) << err;
        EXPECT_NE(err.find("refused at startup: MK_ERR_RECIPE_DIGEST: rank 2's stage digest ffffffffffffffff..."),
                  std::string::npos) << err;
        EXPECT_NE(err.find("rank(s) 2 did not join within 1000 ms; dropped 3 connection(s): 127.0.0.1:"),
                  std::string::npos) << err;
        EXPECT_NE(err.find(" closed without a word, 127.0.0.1:"), std::string::npos) << err;
        EXPECT_NE(err.find(" claimed rank 2 with another stage digest"), std::string::npos) << err;
        EXPECT_NE(err.find(" sent 16 bytes of a hello, then nothing within "), std::string::npos) << err;
    }
}

// ------------------------------------------------------------- messages --

// A failed public call leaves a message naming the failure, and the calls that cannot fail
// (getters, free functions, defaults), which a caller makes while cleaning up or printing
// its figures, leave it alone: `run --seam tcp` whose listener another process reached first
// printed "MK_ERR_PEER_CLOSED: " with no text, once mk_pipeline_seam_bytes had cleared it.
void expect_message_survives_cleanup(mk_status s, const char *case_name, const char *part) {
    SCOPED_TRACE(case_name);
    EXPECT_NE(s, MK_OK);
    const std::string message = mk_last_error();
    EXPECT_FALSE(message.empty()) << mk_status_name(s) << " with an empty message";
    EXPECT_NE(message.find(part), std::string::npos) << message;
    // what a caller does after a failure, before it prints the message
    (void)mk_seam_bytes(nullptr);
    (void)mk_seam_seconds(nullptr);
    (void)mk_seam_kind_name(MK_SEAM_TCP);
    (void)mk_seam_options_default(MK_SEAM_TCP);
    (void)mk_seam_listener_address(nullptr);
    mk_seam_free(nullptr);
    mk_seam_listener_free(nullptr);
    (void)mk_pipeline_seam_bytes(nullptr);
    (void)mk_pipeline_seam_seconds(nullptr);
    mk_pipeline_free(nullptr);
    (void)mk_stage_rank(nullptr);
    (void)mk_stage_range(nullptr);
    (void)mk_stage_options_default();
    mk_stage_free(nullptr);
    mk_boundary_free(nullptr);
    (void)mk_boundary_range(nullptr);
    EXPECT_EQ(std::string(mk_last_error()), message) << "a call that cannot fail changed the message";
}

// The seam path: a listener whose first connection is a stranger's (here one that sends
// nothing a frame and hangs up), as when another process reaches a `run --seam tcp`
// listener first; and a connect to nobody.
TEST(SeamMessages, AStrangersConnectionFailsWithAMessageThatSurvivesCleanup) {
    mk_model *model = random_model();
    mk_range_options ro = mk_range_options_default();
    ro.max_context = 16;
    mk_range *tail = nullptr;
    ASSERT_EQ(mk_range_create(model, 3, 5, &ro, &tail), MK_OK) << mk_last_error();
    mk_sequence *seq = nullptr;
    ASSERT_EQ(mk_sequence_open(tail, &seq), MK_OK);
    mk_boundary *into = nullptr;
    ASSERT_EQ(mk_boundary_create(tail, &into), MK_OK);
    for (const std::string &junk : {std::string(), std::string("GET / HTTP/1.0\r\n\r\n")}) {
        mk_seam_options so = mk_seam_options_default(MK_SEAM_TCP);
        so.address = "127.0.0.1:0";
        so.connect_timeout_ms = so.io_timeout_ms = 2000;
        mk_seam_listener *l = nullptr;
        ASSERT_EQ(mk_seam_listen(&so, &l), MK_OK) << mk_last_error();
        const std::string bound = mk_seam_listener_address(l);
        const int fd = connect_to(std::stoi(bound.substr(bound.rfind(':') + 1)));
        ASSERT_GE(fd, 0);
        if (!junk.empty()) send_all(fd, junk);
        close(fd);
        mk_seam *rx = nullptr;
        mk_status s = mk_seam_accept(l, tail, &rx);
        if (s == MK_OK) s = mk_seam_recv(rx, seq, into);
        expect_message_survives_cleanup(s, junk.empty() ? "stranger closed" : "stranger sent garbage",
                                        junk.empty() ? "closed" : "frame");
        EXPECT_EQ(s, junk.empty() ? MK_ERR_PEER_CLOSED : MK_ERR_FRAME) << mk_last_error();
        mk_seam_free(rx);
        mk_seam_listener_free(l);
    }
    mk_seam_options so = mk_seam_options_default(MK_SEAM_TCP);
    const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
    so.address = nobody.c_str();
    so.connect_timeout_ms = 200;
    mk_seam *tx = nullptr;
    expect_message_survives_cleanup(mk_seam_connect(&so, tail, &tx), "connect to nobody", nobody.c_str());
    mk_boundary_free(into);
    mk_sequence_close(seq);
    mk_range_free(tail);
    mk_model_free(model);
}

// The stage path: refused options, a rendezvous nobody comes to, a "rank 0" that hangs up
// on the hello, calls on no stage.
TEST(StageMessages, EveryFailureHasAMessageThatSurvivesCleanup) {
    mk_model *model = random_model();
    static const int64_t cut = 2;
    mk_stage_options o = mk_stage_options_default();
    o.cuts = &cut;
    o.n_cuts = 1;
    o.timeout_ms = 300;
    const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
    o.rendezvous = nobody.c_str();
    mk_stage *st = nullptr;
    mk_stage_options bad = o;
    bad.world = 1;
    expect_message_survives_cleanup(mk_stage_join(model, &bad, &st), "world 1", "need 0 <= rank < world");
    bad = o;
    bad.struct_size = 3;
    expect_message_survives_cleanup(mk_stage_join(model, &bad, &st), "struct_size", "struct_size");
    bad = o;
    bad.timeout_ms = -1;
    expect_message_survives_cleanup(mk_stage_join(model, &bad, &st), "negative timeout", "timeout_ms -1 is negative");
    bad = o;
    bad.rank = 1;
    expect_message_survives_cleanup(mk_stage_join(model, &bad, &st), "no rank 0", "no rendezvous at");
    expect_message_survives_cleanup(mk_stage_join(model, &o, &st), "no rank 1", "rank(s) 1 did not join");
    // a "rank 0" that accepts the hello and hangs up
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(bind(lfd, (sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(lfd, 4), 0);
    ASSERT_EQ(getsockname(lfd, (sockaddr *)&a, &len), 0);
    std::thread hang_up([lfd] {
        const int fd = accept(lfd, nullptr, nullptr);
        char buf[256];
        (void)!read(fd, buf, sizeof buf);
        close(fd);
    });
    const std::string fake = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    bad = o;
    bad.rank = 1;
    bad.rendezvous = fake.c_str();
    expect_message_survives_cleanup(mk_stage_join(model, &bad, &st), "rank 0 hangs up", "rank 0");
    hang_up.join();
    close(lfd);
    expect_message_survives_cleanup(mk_stage_serve(nullptr, nullptr, 0, nullptr, nullptr), "serve NULL", "NULL");
    // an abort from a peer with a status and no reason (found by tests/fuzz/fuzz_control.c)
    expect_message_survives_cleanup(mk_ctl_abort_status("240"), "abort of an unknown status", "does not know: no reason");
    EXPECT_EQ(mk_ctl_abort_status("240"), MK_ERR_FRAME);
    expect_message_survives_cleanup(mk_ctl_abort_status("95"), "abort of a known status without a reason", "no reason given");
    expect_message_survives_cleanup(mk_ctl_abort_status("52 "), "abort with an empty reason", "no reason given");
    expect_message_survives_cleanup(mk_ctl_abort_status("x"), "abort without a status", "without a status");
    mk_stage_hop hop;
    expect_message_survives_cleanup(mk_stage_hop_stats(nullptr, 0, &hop), "hop stats NULL", "NULL");
    mk_model_free(model);
}

// A rank that joined (a hello of this run) and then hangs up before its welcome stops the
// start at once, named with its address, rather than at the deadline or at the welcome.
TEST(StageRendezvous, ARankThatJoinsAndLeavesFailsTheStartAtOnce) {
    mk_model *model = random_model();
    const std::string digest = cli_stage_digest(model);
    const int port = free_port();
    Ranks ranks("joinleave");
    ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, {"--timeout", "5", "--prompts", kPrompts}), "");
    const int fd = connect_to(port);
    ASSERT_GE(fd, 0);
    send_all(fd, ctl_message(MK_CTL_HELLO, "2 3 " + digest + " 127.0.0.1:1"));
    ASSERT_TRUE(wait_for_text(ranks[0].err, "rank 2 joined from 127.0.0.1:", 10)) << slurp(ranks[0].err);
    close(fd);
    ranks.wait(4);
    const std::string err = slurp(ranks[0].err);
    EXPECT_EQ(exit_code(ranks[0]), 1) << err;
    EXPECT_LT(ranks[0].exit_s, 3.0) << "waited for the deadline";
    EXPECT_NE(err.find("MK_ERR_PEER_LOST: rank 2 (from 127.0.0.1:"), std::string::npos) << err;
    EXPECT_NE(err.find("joined, then closed its connection before the welcome"), std::string::npos) << err;
    mk_model_free(model);
}

// ------------------------------------------------------------------- TLS --

const char kStagePsk[] = "8f2a61c0de55aa0193b7e4f6021c9d3b5e7a8c0f1d2e3f405162738495a6b7c8";
const char kOtherPsk[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

// A TLS client with this key to 127.0.0.1:port: the handshake's status.
mk_status tls_probe(int port, const char *psk) {
    mk_seam_tls tls{};
    tls.enabled = true;
    tls.psk_hex = psk;
    SSL_CTX *ctx = nullptr;
    mk_status s = mk_tls_context(&tls, false, &ctx);
    mk_io io = {connect_to(port), nullptr};
    if (s == MK_OK) s = mk_tls_attach(&io, ctx, false);
    if (s == MK_OK) {
        (void)fcntl(io.fd, F_SETFL, fcntl(io.fd, F_GETFL) | O_NONBLOCK);
        s = mk_tls_handshake(&io, nullptr, mk_deadline_ms(3000, 3000));
    }
    mk_io_close(&io);
    mk_tls_context_free(ctx);
    return s;
}

// With --tls-psk every connection between the ranks runs inside TLS 1.3 (the rendezvous,
// control and seams), and one who can compute the stage digest but has no key cannot take a
// rank's place: a plaintext hello of rank 1 with the right digest, and a TLS client with
// another key, are dropped at the handshake while the real ranks join; the tokens equal the
// whole model's. Bound to 0.0.0.0 with TLS, rank 0 has no notice to give.
TEST(StageTls, PskProtectsEveryConnectionAndAStrangerWithoutTheKeyIsDropped) {
    mk_model *model = random_model();
    const auto prompts = read_prompts(kPrompts);
    const auto want = whole_model(model, MK_DTYPE_F32, prompts, 3);
    const std::string digest = cli_stage_digest(model);
    const int port = free_port();
    const std::vector<std::string> extra = {"--max-tokens", "3", "--max-sequences", "2", "--timeout", "5", "--tls-psk", kStagePsk};
    std::vector<std::string> a0 = stage_args(kRandom, "1,3", 0, 3, port, extra);
    for (auto &x : a0)
        if (x == "127.0.0.1:" + std::to_string(port)) x = "0.0.0.0:" + std::to_string(port);
    a0.insert(a0.end(), {"--prompts", kPrompts});
    Ranks ranks("tls");
    ranks.launch(0, a0, "");
    const int plain = connect_to(port);
    ASSERT_GE(plain, 0);
    send_all(plain, ctl_message(MK_CTL_HELLO, "1 3 " + digest + " 127.0.0.1:1"));
    EXPECT_EQ(tls_probe(port, kOtherPsk), MK_ERR_AUTH) << mk_last_error();
    ASSERT_TRUE(wait_for_text(ranks[0].err, "the TLS handshake failed", 10)) << slurp(ranks[0].err);
    for (int r = 1; r < 3; r++) ranks.launch(r, stage_args(kRandom, "1,3", r, 3, port, extra), "");
    ranks.wait(20);
    close(plain);
    expect_parity(ranks, 0, want);
    const std::string err = slurp(ranks[0].err), out = slurp(ranks[0].out);
    size_t drops = 0;
    for (size_t at = err.find("the TLS handshake failed"); at != std::string::npos;
         at = err.find("the TLS handshake failed", at + 1))
        drops++;
    EXPECT_EQ(drops, 2u) << err;
    EXPECT_NE(err.find("rank 1 joined from 127.0.0.1:"), std::string::npos) << err;
    EXPECT_NE(err.find("(2 of 2), TLS"), std::string::npos) << err;
    EXPECT_EQ(err.find("not loopback"), std::string::npos) << err;
    EXPECT_NE(out.find("seam tcp (TLS 1.3 on every connection)"), std::string::npos) << out;
    mk_model_free(model);
}

// A rank with another key fails its handshake with rank 0 (MK_ERR_AUTH, naming rank 0's
// address); rank 0 drops it like any stranger and, at its deadline, names rank 2 missing
// and the failed handshake. Without TLS, a rendezvous bound beyond loopback says so.
TEST(StageTls, ARankWithAnotherKeyIsRefusedAndPlaintextOffLoopbackIsNoticed) {
    const int port = free_port();
    Ranks ranks("tlskey");
    ranks.launch(0, stage_args(kRandom, "1,3", 0, 3, port, {"--timeout", "1", "--tls-psk", kStagePsk, "--prompts", kPrompts}), "");
    ranks.launch(1, stage_args(kRandom, "1,3", 1, 3, port, {"--timeout", "1", "--tls-psk", kStagePsk}), "");
    ranks.launch(2, stage_args(kRandom, "1,3", 2, 3, port, {"--timeout", "1", "--tls-psk", kOtherPsk}), "");
    ranks.wait(8);
    const std::string e0 = slurp(ranks[0].err), e2 = slurp(ranks[2].err);
    EXPECT_EQ(exit_code(ranks[2]), 1) << e2;
    EXPECT_NE(e2.find("refused at startup: MK_ERR_AUTH: rank 2: no TLS with rank 0 at 127.0.0.1:"), std::string::npos) << e2;
    EXPECT_EQ(exit_code(ranks[0]), 1) << e0;
    EXPECT_NE(e0.find("rank(s) 2 did not join within 1000 ms; dropped 1 connection(s): 127.0.0.1:"), std::string::npos) << e0;
    EXPECT_NE(e0.find("no TLS with this run's key"), std::string::npos) << e0;
    EXPECT_EQ(exit_code(ranks[1]), 1);

    const int port2 = free_port();
    Ranks plain("plainwide");
    std::vector<std::string> a0 = stage_args(kRandom, "2", 0, 2, port2, {"--timeout", "0.3", "--prompts", kPrompts});
    for (auto &x : a0)
        if (x == "127.0.0.1:" + std::to_string(port2)) x = "0.0.0.0:" + std::to_string(port2);
    plain.launch(0, a0, "");
    plain.wait(6);
    EXPECT_NE(slurp(plain[0].err).find("rendezvous at 0.0.0.0:" + std::to_string(port2) + ": not loopback and no TLS"),
              std::string::npos) << slurp(plain[0].err);
}

// The library refuses TLS options it cannot honour, whoever calls it: TLS on a seam that
// never leaves the process (nothing would be encrypted), a key of 16 bytes (the README
// promises 32 to 64), an identity without a key, a key with certificates.
TEST(SeamOptions, TlsIsRefusedWhereItCannotProtect) {
    mk_model *model = random_model();
    mk_range *head = nullptr, *tail = nullptr;
    ASSERT_EQ(mk_range_create(model, 0, 2, nullptr, &head), MK_OK) << mk_last_error();
    ASSERT_EQ(mk_range_create(model, 3, 5, nullptr, &tail), MK_OK) << mk_last_error();
    const std::string k32 = "8f2a61c0de55aa0193b7e4f6021c9d3b5e7a8c0f1d2e3f405162738495a6b7c8";
    const std::string k16 = k32.substr(0, 32), k65 = k32 + k32 + "00";
    const struct {
        mk_seam_kind kind;
        const char *psk, *identity, *cert;
        const char *part;
    } cases[] = {
        {MK_SEAM_LOCAL, k32.c_str(), nullptr, nullptr, "the local seam never leaves the process"},
        {MK_SEAM_WIRE, k32.c_str(), nullptr, nullptr, "the wire seam never leaves the process"},
        {MK_SEAM_UNIX, k16.c_str(), nullptr, nullptr, "32 to 64 bytes (64 to 128 hex digits), not 32 hex digits"},
        {MK_SEAM_UNIX, k65.c_str(), nullptr, nullptr, "32 to 64 bytes (64 to 128 hex digits), not 130 hex digits"},
        {MK_SEAM_UNIX, nullptr, "me", nullptr, "identity without a pre-shared key"},
        {MK_SEAM_UNIX, k32.c_str(), nullptr, "cert.pem", "a pre-shared key or certificates, not both"},
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.part);
        mk_seam_options o = mk_seam_options_default(c.kind);
        o.tls.enabled = true;
        o.tls.psk_hex = c.psk;
        o.tls.psk_identity = c.identity;
        o.tls.cert_file = c.cert;
        mk_seam *tx = nullptr, *rx = nullptr;
        EXPECT_EQ(mk_seam_pair(&o, head, tail, &tx, &rx), MK_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(mk_last_error()).find(c.part), std::string::npos) << mk_last_error();
        EXPECT_EQ(tx, nullptr);
        mk_seam_free(tx);
        mk_seam_free(rx);
    }
    // the same 32-byte key on a unix pair works
    mk_seam_options o = mk_seam_options_default(MK_SEAM_UNIX);
    o.tls.enabled = true;
    o.tls.psk_hex = k32.c_str();
    mk_seam *tx = nullptr, *rx = nullptr;
    EXPECT_EQ(mk_seam_pair(&o, head, tail, &tx, &rx), MK_OK) << mk_last_error();
    mk_seam_free(tx);
    mk_seam_free(rx);
    mk_range_free(head);
    mk_range_free(tail);
    mk_model_free(model);
}

// A unix-seam stage killed during startup (between its hello and the previous rank's
// connect) cannot remove its socket file; the next unix stage to start removes the files
// whose process is gone.
TEST(Stage, UnixSocketOfAStageKilledAtStartupIsRemovedAtTheNextStart) {
    // a "rank 0" that takes the connection into its backlog and never answers
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(bind(lfd, (sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(lfd, 4), 0);
    ASSERT_EQ(getsockname(lfd, (sockaddr *)&a, &len), 0);
    const int port = ntohs(a.sin_port);
    Ranks ranks("stale_unix");
    ranks.launch(1, stage_args(kRandom, "2", 1, 2, port, {"--timeout", "5", "--seam", "unix"}), "");
    const std::string sock = "/tmp/meshkern-stage-" + std::to_string(ranks[0].pid) + "-rank1.sock";
    struct stat sb;
    const double t0 = now_s();
    while (stat(sock.c_str(), &sb) != 0 && now_s() - t0 < 10) usleep(10000);
    ASSERT_EQ(stat(sock.c_str(), &sb), 0) << "rank 1 made no socket at " << sock;
    kill(ranks[0].pid, SIGKILL);
    ranks.wait(5);
    EXPECT_EQ(stat(sock.c_str(), &sb), 0) << "the killed rank's socket file is left (nothing could remove it)";
    close(lfd);
    // the next unix stage (here one whose rendezvous is gone) removes it before anything else
    const int dead = free_port();
    Ranks next("stale_unix_next");
    next.launch(1, stage_args(kRandom, "2", 1, 2, dead, {"--timeout", "0.3", "--seam", "unix"}), "");
    next.wait(10);
    EXPECT_EQ(exit_code(next[0]), 1) << slurp(next[0].err);
    EXPECT_NE(stat(sock.c_str(), &sb), 0) << sock << " is still there";
    EXPECT_NE(slurp(next[0].err).find("removed " + sock + ", left by a stage process that is gone"), std::string::npos)
        << slurp(next[0].err);
}

// A rank whose peers never come gives up at the deadline instead of waiting forever.
TEST(Stage, MissingRankTimesOutAtStartup) {
    const int port = free_port();
    Ranks ranks("missing");
    ranks.launch(0, stage_args(kRandom, "2", 0, 2, port, {"--timeout", "1", "--prompts", kPrompts}), "");
    ranks.wait(7);
    EXPECT_EQ(exit_code(ranks[0]), 1);
    EXPECT_LE(ranks[0].exit_s, 1.0 + 5.0);
    EXPECT_NE(slurp(ranks[0].err).find("MK_ERR_PEER_TIMEOUT"), std::string::npos) << slurp(ranks[0].err);
    EXPECT_NE(slurp(ranks[0].err).find("rank(s) 1 did not join"), std::string::npos) << slurp(ranks[0].err);
}

} // namespace
