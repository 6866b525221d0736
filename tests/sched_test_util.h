// Helpers for the placed-pipeline suites (cpu: test_pipeline_sched.cpp; cuda under
// cudasim: backend/test_sched_cuda.cpp): run sequences through an mk_sched, collecting
// every token's logits from the callback, and compare each sequence with the same
// sequence run alone on the whole model.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <tuple>

#include "mk_test_util.h"

struct SchedDeleter { void operator()(mk_sched *s) const { mk_sched_free(s); } };
using SchedPtr = std::unique_ptr<mk_sched, SchedDeleter>;

struct SeqSpec {
    std::vector<int32_t> prompt;
    size_t max_new;
    std::vector<int32_t> stop;
};

struct SeqResult {
    mk_seq_info info{};
    std::string error;
    std::vector<int32_t> tokens;             // from mk_sched_poll
    std::vector<int32_t> callback_tokens;    // from the callback, in order
    std::vector<std::vector<float>> logits;  // from the callback, per token
};

// Token callback: appends per sequence; checks the index arrives in order.
struct Collector {
    std::mutex mu;
    std::map<uint64_t, SeqResult> seqs;
    bool out_of_order = false;
    // hold_at > 0: the first sequence to deliver its hold_at-th token waits in the callback
    // (the scheduler's worker with it) until release(), so a test can act on a sequence that
    // is known to be running and not yet finished, whatever the machine's load.
    size_t hold_at = 0;
    bool held = false, released = false;
    uint64_t held_id = 0;
    std::condition_variable cv;
    static void on_token(void *user, uint64_t id, size_t index, int32_t token, const float *logits, size_t vocab) {
        auto *c = static_cast<Collector *>(user);
        std::unique_lock<std::mutex> g(c->mu);
        SeqResult &r = c->seqs[id];
        if (index != r.callback_tokens.size()) c->out_of_order = true;
        r.callback_tokens.push_back(token);
        r.logits.emplace_back(logits, logits + vocab);
        if (c->hold_at > 0 && !c->held && index + 1 == c->hold_at) {
            c->held = true;
            c->held_id = id;
            c->cv.notify_all();
            c->cv.wait_for(g, std::chrono::seconds(30), [c] { return c->released; });
        }
    }
    // Waits (up to 30 s) until a sequence is held; returns its id, 0 if none was.
    uint64_t wait_held() {
        std::unique_lock<std::mutex> g(mu);
        cv.wait_for(g, std::chrono::seconds(30), [this] { return held; });
        return held ? held_id : 0;
    }
    void release() {
        std::lock_guard<std::mutex> g(mu);
        released = true;
        cv.notify_all();
    }
};

// Wait for every sequence, failing (instead of hanging the suite) past `seconds`.
inline bool wait_all_within(mk_sched *s, int seconds) {
    auto done = std::async(std::launch::async, [s] { return mk_sched_wait_all(s); });
    if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
        ADD_FAILURE() << "mk_sched_wait_all did not return within " << seconds << " s";
        std::fflush(nullptr);
        std::abort(); // a hung pipeline: nothing later in this process can run
    }
    return done.get() == MK_OK;
}

inline SchedPtr make_sched(const mk_model *model, const mk_sched_options &o, Collector *c) {
    mk_sched_options opt = o;
    opt.on_token = &Collector::on_token;
    opt.user = c;
    mk_sched *s = nullptr;
    const mk_status st = mk_sched_create(model, &opt, &s);
    EXPECT_EQ(st, MK_OK) << mk_status_name(st) << ": " << mk_last_error();
    return SchedPtr(s);
}

inline std::vector<uint64_t> submit_all(mk_sched *s, const std::vector<SeqSpec> &specs) {
    std::vector<uint64_t> ids;
    for (const SeqSpec &sp : specs) {
        uint64_t id = 0;
        const mk_status st = mk_sched_submit(s, sp.prompt.data(), sp.prompt.size(), sp.max_new, sp.stop.data(),
                                             sp.stop.size(), &id);
        EXPECT_EQ(st, MK_OK) << mk_status_name(st) << ": " << mk_last_error();
        ids.push_back(id);
    }
    return ids;
}

inline std::vector<SeqResult> collect(mk_sched *s, Collector *c, const std::vector<uint64_t> &ids) {
    std::vector<SeqResult> out;
    std::lock_guard<std::mutex> g(c->mu);
    EXPECT_FALSE(c->out_of_order) << "token callbacks arrived out of order";
    for (uint64_t id : ids) {
        SeqResult r = c->seqs[id];
        r.tokens.assign(4096, -1);
        EXPECT_EQ(mk_sched_poll(s, id, &r.info, r.tokens.data(), r.tokens.size()), MK_OK) << mk_last_error();
        r.tokens.resize(r.info.n_tokens);
        r.error = r.info.error ? r.info.error : "";
        out.push_back(std::move(r));
    }
    return out;
}

// The sequence alone on the whole model: max_new greedy steps, cut after the first stop id.
inline Decode whole_reference(const mk_model *model, const mk_range_options &options, const SeqSpec &sp) {
    Decode d = decode_greedy(model, {}, options, sp.prompt, sp.max_new);
    for (size_t i = 0; i < d.tokens.size(); i++)
        if (std::find(sp.stop.begin(), sp.stop.end(), d.tokens[i]) != sp.stop.end()) {
            d.tokens.resize(i + 1);
            d.logits.resize(i + 1);
            break;
        }
    return d;
}

// `count` sequences of mixed prompt lengths (1..9) and token limits (2..limit_span+1);
// every third stops on the token its whole-model run emits at step 1 (so it ends early).
inline std::vector<SeqSpec> mixed_specs(const mk_model *model, const mk_range_options &options, size_t count,
                                        uint32_t seed, size_t limit_span = 7) {
    const size_t vocab = mk_model_hparams(model)->vocab;
    std::mt19937 rng(seed);
    std::vector<SeqSpec> specs;
    for (size_t i = 0; i < count; i++) {
        SeqSpec sp;
        const size_t len = 1 + (i * 4 + seed) % 9;
        for (size_t k = 0; k < len; k++) sp.prompt.push_back((int32_t)(rng() % vocab));
        sp.max_new = 2 + (i * 5 + seed) % limit_span;
        if (i % 3 == 2) {
            const Decode d = decode_greedy(model, {}, options, sp.prompt, 2);
            if (d.tokens.size() == 2) sp.stop = {d.tokens[1], (int32_t)vocab + 7 /* never emitted */};
        }
        specs.push_back(sp);
    }
    return specs;
}

// Whole-model runs of specs already seen (one model and options per cache).
struct ReferenceCache {
    std::map<std::tuple<std::vector<int32_t>, size_t, std::vector<int32_t>>, Decode> runs;
    const Decode &get(const mk_model *model, const mk_range_options &options, const SeqSpec &sp) {
        const auto key = std::make_tuple(sp.prompt, sp.max_new, sp.stop);
        auto it = runs.find(key);
        if (it == runs.end()) it = runs.emplace(key, whole_reference(model, options, sp)).first;
        return it->second;
    }
};

// Every sequence DONE with tokens and logits bit-identical to its whole-model run.
inline void expect_all_match_whole(const mk_model *model, const mk_range_options &options,
                                   const std::vector<SeqSpec> &specs, const std::vector<SeqResult> &results,
                                   const std::string &what, ReferenceCache *cache = nullptr) {
    ReferenceCache local;
    if (!cache) cache = &local;
    ASSERT_EQ(specs.size(), results.size());
    for (size_t i = 0; i < specs.size(); i++) {
        const SeqResult &r = results[i];
        ASSERT_EQ(r.info.state, MK_SEQ_DONE) << what << " seq " << i << ": " << mk_status_name(r.info.status) << " "
                                             << r.error;
        const Decode &ref = cache->get(model, options, specs[i]);
        EXPECT_EQ(r.tokens, ref.tokens) << what << " seq " << i;
        EXPECT_EQ(r.callback_tokens, ref.tokens) << what << " seq " << i;
        ASSERT_EQ(r.logits.size(), ref.logits.size()) << what << " seq " << i;
        for (size_t k = 0; k < ref.logits.size(); k++)
            EXPECT_TRUE(bit_identical(r.logits[k], ref.logits[k])) << what << " seq " << i << " step " << k;
        const bool on_stop = !ref.tokens.empty() && std::find(specs[i].stop.begin(), specs[i].stop.end(),
                                                               ref.tokens.back()) != specs[i].stop.end();
        EXPECT_EQ(r.info.stopped, on_stop) << what << " seq " << i;
    }
}
