/* cudasim_gtest_seed.cpp - a failed test under cudasim says which stream interleaving it ran.
 *
 * Linked (as an object library) into every GoogleTest binary that runs on cudasim: after a
 * failed test it prints the seed of the random interleaving of work on different streams,
 * so CUDASIM_STREAM_SEED=<seed> reruns the same interleaving.
 */
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>

#include "cudasim.h"

namespace {

class SeedPrinter : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo &info) override {
    if (!info.result()->Failed()) return;
    fprintf(stderr,
            "cudasim: %s.%s failed with stream interleaving seed %" PRIu64
            " (%" PRIu64 " random choices so far); CUDASIM_STREAM_SEED=%" PRIu64 " reruns it\n",
            info.test_suite_name(), info.name(), cudasim::stream_seed(), cudasim::stream_choices(),
            cudasim::stream_seed());
  }
};

const bool g_installed = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedPrinter());
  return true;
}();

}  // namespace
