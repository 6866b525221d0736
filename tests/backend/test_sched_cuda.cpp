// The placed pipeline (mk_sched) on the cuda backend: every stage's range on its own
// device with its own stream and host thread, many sequences in flight, each sequence's
// tokens and logits bit-identical to the same sequence alone on the whole model.
//
// One source, two flavours (tests/backend/CMakeLists.txt):
//   sim     (MK_TEST_CUDASIM) under tests/cudasim with 2 and 3 simulated devices
//   device  on real GPUs; with fewer GPUs than stages, the stages share device 0 (one
//           stream each); every test skips with "no CUDA device" where there is none
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "range/range.h"
#include "sched/sched.h"
#include "sched_test_util.h"

#if defined(MK_TEST_CUDASIM)
#include "cudasim.h"
#endif

namespace {

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

size_t device_bytes_used(int device) {
    int prev = 0;
    cudaGetDevice(&prev);
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(device);
    cudaMemGetInfo(&free_b, &total_b);
    cudaSetDevice(prev);
    return total_b - free_b;
}

// `n` simulated devices for one test (cudasim); on hardware, whatever is there.
struct Devices {
#if defined(MK_TEST_CUDASIM)
    explicit Devices(int n) { cudasim::set_device_count(n); }
    ~Devices() { cudasim::set_device_count(2); }
#else
    explicit Devices(int) {}
#endif
};

// MK_REQUIRE_DEVICE (mk_test_util.h): a device query error fails, no device skips.

mk_range_options cuda_options() {
    mk_range_options o = mk_range_options_default();
    o.backend = mk_backend_config_default(MK_BACKEND_CUDA);
    o.max_context = 32;
    return o;
}

// Stage i on device i, or all on device 0 when there are fewer devices than stages.
std::vector<int> placement(size_t stages) {
    std::vector<int> d(stages);
    for (size_t i = 0; i < stages; i++) d[i] = device_count() >= (int)stages ? (int)i : 0;
    return d;
}

void run_parity(size_t stages, const std::vector<size_t> &in_flight, mk_seam_kind seam) {
    const ModelCase mc = model_cases()[stages == 3 ? 1 : 0];
    ModelPtr model = make_random_model(mc.hp);
    ASSERT_TRUE(model);
    const std::vector<int> devices = placement(stages);
    // One pool of 9 sequences (limits 2..5; whole-model runs computed once), rotated per m.
    const std::vector<SeqSpec> pool = mixed_specs(model.get(), cuda_options(), 9, (uint32_t)stages, 4);
    ReferenceCache refs;
    for (size_t m : in_flight) {
        std::vector<SeqSpec> specs;
        for (size_t k = 0; k <= m; k++) specs.push_back(pool[(m + k) % pool.size()]);
        mk_sched_options o = mk_sched_options_default();
        o.range = cuda_options();
        o.split_auto = true;
        o.devices = devices.data();
        o.n_devices = devices.size();
        o.max_sequences = m;
        o.seam = seam;
        std::vector<size_t> used_before;
        for (int d : devices) used_before.push_back(device_bytes_used(d));
        Collector c;
        SchedPtr s = make_sched(model.get(), o, &c);
        ASSERT_TRUE(s);
        ASSERT_EQ(mk_sched_worker_count(s.get()), stages);
        if (device_count() >= (int)stages) {
            for (size_t i = 0; i < stages; i++) {
                EXPECT_GE(device_bytes_used(devices[i]),
                          used_before[i] + mk_range_weight_bytes(mk_sched_worker_range(s.get(), i)))
                    << "stage " << i << "'s weights are not on device " << devices[i];
            }
        }
        const std::vector<uint64_t> ids = submit_all(s.get(), specs);
        ASSERT_TRUE(wait_all_within(s.get(), 300));
        expect_all_match_whole(model.get(), cuda_options(), specs, collect(s.get(), &c, ids),
                               std::to_string(stages) + " stages, m=" + std::to_string(m), &refs);
        // every stage replayed captured decode steps (its neighbours' peer copies wait for a
        // recording), and none gave graphs up
        for (size_t i = 0; i < stages; i++) {
            const mk_range *r = mk_sched_worker_range(s.get(), i);
            EXPECT_GT(mk_range_backend_counters(r)->graph_launches, 0u) << "stage " << i << " decoded op by op";
            EXPECT_EQ(mk_range_graph_failure(r), nullptr) << "stage " << i << ": " << mk_range_graph_failure(r);
        }
        if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(SchedCuda, TwoDevicesEverySequenceMatchesWholeForOneToEightInFlight) {
    Devices n(2);
    MK_REQUIRE_DEVICE();
    run_parity(2, {1, 2, 3, 4, 5, 6, 7, 8}, MK_SEAM_LOCAL);
}

TEST(SchedCuda, ThreeDevicesEverySequenceMatchesWholeForOneToEightInFlight) {
    Devices n(3);
    MK_REQUIRE_DEVICE();
    run_parity(3, {1, 2, 3, 4, 5, 6, 7, 8}, MK_SEAM_LOCAL);
}

TEST(SchedCuda, ThreeDevicesOverTheWire) {
    Devices n(3);
    MK_REQUIRE_DEVICE();
    run_parity(3, {1, 3, 8}, MK_SEAM_WIRE);
}

// NCCL between the stages (one two-rank communicator per seam; NCCL refuses two ranks on
// one GPU, so this needs a device per stage). The placement rule picks it by itself.
#if defined(MK_TEST_NCCL)
void require_devices_for_nccl(size_t stages) {
    if (device_count() < (int)stages) GTEST_SKIP() << "NCCL needs " << stages << " devices";
}

TEST(SchedCuda, TwoDevicesOverNcclEverySequenceMatchesWhole) {
    Devices n(2);
    MK_REQUIRE_DEVICE();
    require_devices_for_nccl(2);
    if (IsSkipped()) return;
    run_parity(2, {1, 2, 3, 4, 5, 6, 7, 8}, MK_SEAM_NCCL);
}

TEST(SchedCuda, ThreeDevicesOverNcclEverySequenceMatchesWhole) {
    Devices n(3);
    MK_REQUIRE_DEVICE();
    require_devices_for_nccl(3);
    if (IsSkipped()) return;
    run_parity(3, {1, 2, 3, 4, 5, 6, 7, 8}, MK_SEAM_NCCL);
}

TEST(SchedCuda, PlacementRulePicksNcclBetweenDistinctDevicesAndLocalOnOne) {
    Devices n(2);
    MK_REQUIRE_DEVICE();
    require_devices_for_nccl(2);
    if (IsSkipped()) return;
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    for (int same = 0; same < 2; same++) {
        const int devices[2] = {0, same ? 0 : 1};
        mk_sched_options o = mk_sched_options_default();
        o.range = cuda_options();
        o.split_auto = true;
        o.devices = devices;
        o.n_devices = 2;
        Collector c;
        SchedPtr s = make_sched(model.get(), o, &c);
        ASSERT_TRUE(s);
        EXPECT_EQ(mk_sched_seam_kind(s.get(), 0), same ? MK_SEAM_LOCAL : MK_SEAM_NCCL);
        const std::vector<SeqSpec> specs = mixed_specs(model.get(), cuda_options(), 3, 17, 3);
        const std::vector<uint64_t> ids = submit_all(s.get(), specs);
        ASSERT_TRUE(wait_all_within(s.get(), 300));
        expect_all_match_whole(model.get(), cuda_options(), specs, collect(s.get(), &c, ids),
                               same ? "auto on one device" : "auto on two devices");
    }
}
#endif

// A stage on device 1 dies mid-run: its sequences fail with its status, none hangs.
TEST(SchedCuda, StageThatDiesOnItsDeviceFailsItsSequences) {
    Devices n(2);
    MK_REQUIRE_DEVICE();
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int> devices = placement(2);
    mk_sched_options o = mk_sched_options_default();
    o.range = cuda_options();
    o.split_auto = true;
    o.devices = devices.data();
    o.n_devices = 2;
    o.max_sequences = 2;
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    MK_ASSERT_OK(mk_sched_inject_fault(s.get(), 1, 3, true));
    const std::vector<SeqSpec> specs = {{{5, 6, 7}, 1, {}}, {{9, 1}, 20, {}}, {{2, 2, 4}, 6, {}}};
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 300));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    expect_all_match_whole(model.get(), cuda_options(), {specs[0]}, {results[0]}, "finished before the fault");
    for (size_t i = 1; i < results.size(); i++) {
        EXPECT_EQ(results[i].info.state, MK_SEQ_FAILED) << "seq " << i;
        EXPECT_NE(results[i].error.find("worker 1"), std::string::npos) << results[i].error;
    }
}

// A stage placed on a device that does not exist: a clear status, nothing left behind.
TEST(SchedCuda, MissingDeviceIsRefusedAndNothingLeaks) {
    Devices n(2);
    MK_REQUIRE_DEVICE();
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const size_t used0 = device_bytes_used(0);
    const int devices[2] = {0, device_count() + 3};
    mk_sched_options o = mk_sched_options_default();
    o.range = cuda_options();
    o.split_auto = true;
    o.devices = devices;
    o.n_devices = 2;
    mk_sched *s = nullptr;
    EXPECT_EQ(mk_sched_create(model.get(), &o, &s), MK_ERR_DEVICE_INDEX) << mk_last_error();
    EXPECT_EQ(s, nullptr);
    EXPECT_EQ(device_bytes_used(0), used0) << "the head's range was not released";
}

} // namespace
