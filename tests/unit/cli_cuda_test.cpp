// `backend: cuda` where it cannot run (no GPU here, or a build without CUDA): `halotrain
// train` exits 1 with one clear message, never "internal error" or a crash. Runs on CPU
// machines (CI); skips where a CUDA device answers, since training would then just work.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/runtime/backend.hpp"

#include "common/run_halotrain.hpp"

namespace fs = std::filesystem;

namespace {

using Result = ht::testing::RunResult;
Result run(const std::string& args) { return ht::testing::run_halotrain(args); }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

using ht::testing::why_no_cuda;

TEST(CliCuda, NoUsableGpuIsOneUserErrorNamingTheFix) {
  const std::string why = why_no_cuda();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present: backend cuda would train";

  const fs::path dir = fs::temp_directory_path() / ("halotrain-cli-cuda-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string data = (dir / "data.h5").string();
  const Result made = run("make-data " + data + " --count 4 --height 16 --width 12 --classes 2");
  ASSERT_EQ(made.code, 0) << made.output;
  const std::string cfg = (dir / "cfg.yaml").string();
  std::ofstream(cfg) << "name: t\nrun_dir: " << (dir / "run").string() << "\n"
                     << "data: {train: " << data << "}\n"
                     << "model:\n  input: [16, 12, 1]\n  layers:\n"
                     << "    - {type: conv2d, filters: 2, kernel: 3, padding: same}\n"
                     << "    - {type: relu}\n    - {type: global_avg_pool}\n    - {type: dense, units: 2}\n"
                     << "  loss: softmax_cross_entropy\n"
                     << "training: {batch_size: 2, steps: 2, optimizer: {type: sgd, lr: 0.1}}\n"
                     << "parallel: {grid: [2, 1], device_memory: 1GiB}\n";

  const Result r = run("train " + cfg + " --set parallel.backend=cuda");
  EXPECT_EQ(r.code, 1) << r.output;
#ifdef HALOTRAIN_HAVE_CUDA_BACKEND
  const std::string message = "no CUDA device (driver: ";
  EXPECT_NE(r.output.find("); use backend: cpu"), std::string::npos) << r.output;
#else
  const std::string message = "built without CUDA";
#endif
  EXPECT_NE(why.find(message), std::string::npos) << why;
  // Once, although every shard failed; and nothing that reads like a crash.
  EXPECT_EQ(count(r.output, message), 1u) << r.output;
  for (const char* crash : {"internal error", "terminate called", "Aborted", "Segmentation", "core dumped",
                            "stack trace", "backtrace"})
    EXPECT_EQ(r.output.find(crash), std::string::npos) << crash << " in:\n" << r.output;
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints")) << "nothing trained, nothing written";
  fs::remove_all(dir);
}

}  // namespace
