// The `halotrain` command line end to end on bad input: one clear message, exit 1, nothing
// lost. Runs the real binary in a scratch directory.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/run_halotrain.hpp"

namespace fs = std::filesystem;

namespace {

using Result = ht::testing::RunResult;
Result run(const std::string& args) { return ht::testing::run_halotrain(args); }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("halotrain-cli-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tiny classifier config over `data`, written to the scratch dir.
  std::string config(const std::string& data, int h, int w, const std::string& extra = "") {
    const std::string path = (dir_ / "cfg.yaml").string();
    std::ofstream(path) << "name: t\nrun_dir: " << (dir_ / "run").string() << "\n"
                        << "data: {train: " << data << "}\n"
                        << "model:\n  input: [" << h << ", " << w << ", 1]\n  layers:\n"
                        << "    - {type: conv2d, filters: 2, kernel: 3, padding: same}\n"
                        << "    - {type: relu}\n    - {type: global_avg_pool}\n    - {type: dense, units: 2}\n"
                        << "  loss: softmax_cross_entropy\n"
                        << "training: {batch_size: 2, steps: 2, optimizer: {type: sgd, lr: 0.1}}\n"
                        << "parallel: {grid: [2, 1], device_memory: 1GiB}\n"
                        << "checkpoint: {every_steps: 1, keep: 5}\n"
                        << extra;
    return path;
  }
  std::string make_data(int h, int w) {
    const std::string path = (dir_ / "data.h5").string();
    const Result r = run("make-data " + path + " --count 4 --height " + std::to_string(h) + " --width " +
                         std::to_string(w) + " --classes 2");
    EXPECT_EQ(r.code, 0) << r.output;
    return path;
  }
  fs::path dir_;
};

// On one K80 die the seed case fits keeping everything: no tensor that no backward reads is
// kept (each batch norm's output: the batch norm's backward reads its input, the ReLU's its
// output), fused or not. On a die of 8 GiB it fits keeping everything fused (batch norm,
// ReLU and max pool in one chain, on CUDA too: no pre-pool tensor is made), and with the
// layers apart only out of core.
TEST_F(CliTest, SeedCaseOnOneDieFitsAndOutOfCoreOnASmallerOne) {
  const std::string seed = std::string(HALOTRAIN_SOURCE_DIR) + "/configs/seed-k80.yaml";
  const std::string one_die = " --set parallel.grid=[1,1]";
  for (const char* fuse : {"", " --set parallel.fuse=false"}) {
    const Result r = run("plan " + seed + one_die + fuse);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("keep       all 24 layers"), std::string::npos) << r.output;
  }
  const Result fused = run("plan " + seed + one_die + " --set parallel.device_memory=8GiB");
  EXPECT_EQ(fused.code, 0) << fused.output;
  EXPECT_NE(fused.output.find("keep       all 24 layers"), std::string::npos) << fused.output;
  const std::string small = one_die + " --set parallel.device_memory=8GiB --set parallel.fuse=false";
  const Result keep = run("plan " + seed + small + " --set parallel.activations=keep");
  EXPECT_EQ(keep.code, 1) << keep.output;
  EXPECT_NE(keep.output.find("does not fit"), std::string::npos) << keep.output;
  EXPECT_NE(keep.output.find("smallest grid that fits: [2, 1]"), std::string::npos) << keep.output;
  const Result out_of_core = run("plan " + seed + small);
  EXPECT_EQ(out_of_core.code, 0) << out_of_core.output;
  EXPECT_EQ(out_of_core.output.find("keep       all"), std::string::npos) << out_of_core.output;
  EXPECT_TRUE(out_of_core.output.find("offload    ") != std::string::npos ||
              out_of_core.output.find("recompute  conv2d") != std::string::npos)
      << out_of_core.output;
  const Result two_dies = run("plan " + seed);
  EXPECT_EQ(two_dies.code, 0) << two_dies.output;
  EXPECT_NE(two_dies.output.find("keep       all 24 layers"), std::string::npos) << two_dies.output;
}

// The ResNet-18-style graph on the seed case fits the two dies of one K80 (issue: model graphs).
TEST_F(CliTest, ResnetMammoFitsTheTwoDiesOfOneK80) {
  const std::string cfg = std::string(HALOTRAIN_SOURCE_DIR) + "/configs/resnet-mammo.yaml";
  const Result r = run("plan " + cfg);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("grid [2, 1]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FITS: peak"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of 11.17 GiB per device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("keep       all 68 layers"), std::string::npos) << r.output;
  // On dies of 8 GiB everything kept does not fit: the plan's policies are what makes it fit.
  const Result keep = run("plan " + cfg + " --set parallel.device_memory=8GiB --set parallel.activations=keep");
  EXPECT_EQ(keep.code, 1) << keep.output;
  EXPECT_NE(keep.output.find("does not fit"), std::string::npos) << keep.output;
  EXPECT_EQ(run("plan " + cfg + " --set parallel.device_memory=8GiB").code, 0);
}

TEST_F(CliTest, DatasetShapeThatIsNotTheModelInputNamesBoth) {
  const std::string data = make_data(16, 12);
  const Result r = run("train " + config(data, 18, 12));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("[4, 16, 12, 1]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.input is [18, 12, 1]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

TEST_F(CliTest, NonFiniteLossStopsWithTheStepAndKeepsGoodCheckpoints) {
  const std::string data = make_data(16, 12);
  const std::string cfg = config(data, 16, 12);
  const Result good = run("train " + cfg);
  ASSERT_EQ(good.code, 0) << good.output;
  const fs::path ckpt = dir_ / "run" / "checkpoints" / "ckpt-2.h5";
  ASSERT_TRUE(fs::exists(ckpt));
  const auto before = fs::last_write_time(ckpt);
  // Resume with a learning rate that sends the weights to infinity at step 3, checkpoints
  // only at the end: the loss of step 4 is NaN, and nothing is written.
  const Result bad = run("train " + cfg +
                         " --set training.steps=4 --set training.optimizer.lr=1e39 --set checkpoint.every_steps=10");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("step 4: the loss is NaN"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoints" / "ckpt-3.h5"));
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoints" / "ckpt-4.h5"));
  EXPECT_EQ(fs::last_write_time(ckpt), before);
  const Result inspect = run("inspect " + ckpt.string());
  EXPECT_EQ(inspect.code, 0) << inspect.output;
}

TEST_F(CliTest, InfinitePixelsAreNamedWhereTheyAreRead) {
  const std::string data = make_data(16, 12);
  const Result bad = run("train " + config(data, 16, 12) + " --set data.scale=1e39");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find(data + ": dataset 'images' image "), std::string::npos) << bad.output;
  // Every pixel is +inf after the scale, so each of the two shards (rows 0-7 and 8-15) fails
  // on the first pixel of its own tile; whichever fails first is the one reported.
  EXPECT_TRUE(bad.output.find("has +inf at row 0, col 0, channel 0") != std::string::npos ||
              bad.output.find("has +inf at row 8, col 0, channel 0") != std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoints" / "ckpt-1.h5"));
}

TEST_F(CliTest, UnknownKeyIsOneLineWithASuggestion) {
  const std::string data = make_data(16, 12);
  const Result r = run("plan " + config(data, 16, 12, "trainng: {steps: 3}\n"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("did you mean 'training'"), std::string::npos) << r.output;
}

TEST_F(CliTest, MissingConfigFileIsAUserError) {
  const Result r = run("train " + (dir_ / "nope.yaml").string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("nope.yaml"), std::string::npos) << r.output;
}

}  // namespace
