// `halotrain train` end to end on backend cuda against the CPU reference: two shards as
// threads of one process on one GPU (halos and gradients through the local comm's host
// staging), conv + batch norm + pooling + dense, three SGD-with-momentum steps from the
// same seeded initialization. Every weight of the final checkpoints must agree within
// |a - r| <= 1e-5 + 1e-4 |r|. Skips, with the reason, when no CUDA device answers.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "worker/io/keras_h5.hpp"
#include "worker/runtime/backend.hpp"

#include "common/run_halotrain.hpp"

namespace fs = std::filesystem;

namespace {

using Result = ht::testing::RunResult;
Result run(const std::string& args) { return ht::testing::run_halotrain(args); }

using ht::testing::why_no_cuda;

class TrainerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = why_no_cuda();
    if (!why.empty()) GTEST_SKIP() << "no usable CUDA device: " << why;
    dir_ = fs::temp_directory_path() / ("halotrain-trainer-gpu-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // Two shards of 16 rows each; the max pool keeps shard borders on its stride. Both
    // runs share the data file (the first one writes it) and the seed, hence the init.
    cfg_ = (dir_ / "cfg.yaml").string();
    std::ofstream(cfg_) << "name: gpu-vs-cpu\nseed: 77\n"
                        << "data:\n  train: " << (dir_ / "data.h5").string() << "\n"
                        << "  synthesize: {count: 4, height: 32, width: 24, channels: 1, classes: 2}\n"
                        << "model:\n  input: [32, 24, 1]\n  layers:\n"
                        << "    - {type: conv2d, filters: 4, kernel: 3, padding: same, bias: false}\n"
                        << "    - {type: batch_norm, momentum: 0.9}\n"
                        << "    - {type: relu}\n"
                        << "    - {type: max_pool2d, pool: 2}\n"
                        << "    - {type: conv2d, filters: 4, kernel: 3, padding: same}\n"
                        << "    - {type: relu}\n"
                        << "    - {type: global_avg_pool}\n"
                        << "    - {type: dense, units: 2}\n"
                        << "  loss: softmax_cross_entropy\n"
                        << "training: {batch_size: 2, steps: 3, optimizer: {type: sgd, lr: 0.1, momentum: 0.9}}\n"
                        << "parallel: {grid: [2, 1], device_memory: 1GiB, devices_per_node: 1}\n"
                        << "checkpoint: {every_steps: 0, keep: 1, resume: never}\n";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Trains in run_dir dir_/<name>; returns the final checkpoint's path.
  std::string train(const std::string& name, const std::string& sets) {
    const fs::path run_dir = dir_ / name;
    const Result r = run("train " + cfg_ + " --set run_dir=" + run_dir.string() + " " + sets);
    EXPECT_EQ(r.code, 0) << r.output;
    const fs::path ckpt = run_dir / "checkpoints" / "ckpt-3.h5";
    EXPECT_TRUE(fs::exists(ckpt)) << r.output;
    return ckpt.string();
  }

  fs::path dir_;
  std::string cfg_;
};

void expect_same_weights(const std::string& got_path, const std::string& ref_path) {
  const ht::KerasWeightsFile got(got_path), ref(ref_path);
  ASSERT_EQ(got.layer_names(), ref.layer_names());
  size_t compared = 0;
  for (const std::string& layer : ref.layer_names()) {
    ASSERT_EQ(got.weight_names(layer), ref.weight_names(layer)) << layer;
    for (const std::string& weight : ref.weight_names(layer)) {
      const std::vector<int64_t> shape = ref.shape(layer, weight);
      ASSERT_EQ(got.shape(layer, weight), shape) << weight;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> a(static_cast<size_t>(n)), r(static_cast<size_t>(n));
      got.read(layer, weight, a.data());
      ref.read(layer, weight, r.data());
      size_t bad = 0;
      for (size_t i = 0; i < r.size(); ++i) {
        const double tol = 1e-5 + 1e-4 * std::fabs(double(r[i]));
        if (!(std::fabs(double(a[i]) - double(r[i])) <= tol) && ++bad <= 5)
          ADD_FAILURE() << weight << "[" << i << "]: cuda " << a[i] << " cpu " << r[i];
      }
      EXPECT_EQ(bad, 0u) << weight << ": " << bad << " of " << r.size() << " values differ";
      compared += r.size();
    }
  }
  EXPECT_GT(compared, 0u);
}

TEST_F(TrainerGpuTest, CudaTrainsLikeCpuOnTwoShards) {
  const std::string ref = train("cpu", "--set parallel.backend=cpu");
  const std::string got = train("cuda", "--set parallel.backend=cuda");
  if (HasFailure()) return;
  expect_same_weights(got, ref);
}

// A recycle destroys and rebuilds the backend (and the comms on it) between steps; the
// trajectory must not change.
TEST_F(TrainerGpuTest, CudaWithRecycleEveryStepTrainsLikeCpu) {
  const std::string ref = train("cpu", "--set parallel.backend=cpu");
  const std::string got = train("cuda", "--set parallel.backend=cuda --set recycle.every_steps=1");
  if (HasFailure()) return;
  expect_same_weights(got, ref);
}

}  // namespace

// Offload copies run on the transfer stream beside compute, recompute runs the forward
// again: neither may change the trajectory. On CUDA the memory model counts the cuDNN
// workspace at its limit, so each rank's measured peak (run_dir/memory.csv) must stay
// under the prediction.
TEST_F(TrainerGpuTest, CudaOffloadAndRecomputeTrainLikeCpuUnderThePredictedPeak) {
  const std::string ref = train("cpu", "--set parallel.backend=cpu");
  for (const std::string policy : {"offload", "recompute"}) {
    const std::string got = train(policy, "--set parallel.backend=cuda --set parallel.activations=" + policy);
    if (HasFailure()) return;
    expect_same_weights(got, ref);
    std::ifstream csv(dir_ / policy / "memory.csv");
    std::string line;
    std::getline(csv, line);  // header
    int rows = 0;
    while (std::getline(csv, line)) {
      unsigned long long rank = 0, measured = 0, predicted = 0;
      ASSERT_EQ(std::sscanf(line.c_str(), "%llu,%llu,%llu", &rank, &measured, &predicted), 3) << line;
      EXPECT_LE(measured, predicted)
          << policy << " rank " << rank << ": measured " << measured << " B, predicted " << predicted << " B";
      ++rows;
    }
    EXPECT_EQ(rows, 2) << policy;
  }
}

// Fifty in-process recycles on one shard: every one destroys the backend (buffers, cuDNN
// and cuBLAS handles, streams, the pinned host pool) and builds it again. What the driver
// reports free on the device after the last must be what it reported after the first
// (within 2 MiB: the driver's own bookkeeping), else something leaks per recycle.
TEST_F(TrainerGpuTest, CudaFiftyRecyclesGiveBackAllDeviceMemory) {
  const fs::path run_dir = dir_ / "recycle50";
  const Result r = run("train " + cfg_ + " --set run_dir=" + run_dir.string() +
                       " --set parallel.backend=cuda --set parallel.grid=[1,1] --set training.steps=51"
                       " --set recycle.every_steps=1 --set training.log_every=50");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<unsigned long long> free;
  const std::string key = "device free memory ";
  for (size_t at = r.output.find(key); at != std::string::npos; at = r.output.find(key, at + 1))
    free.push_back(std::stoull(r.output.substr(at + key.size())));
  ASSERT_EQ(free.size(), 50u) << r.output;
  const long long growth = static_cast<long long>(free.front()) - static_cast<long long>(free.back());
  std::printf("device free after recycle 1: %llu B, after recycle 50: %llu B (used grew by %lld B)\n",
              free.front(), free.back(), growth);
  EXPECT_LE(growth, 2ll << 20) << "device memory in use grew by " << growth << " B over 49 recycles";
}
