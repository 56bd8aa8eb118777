// A layer kind added from the test tree through the registry alone: its LayerKind
// (orchestrator/layer_kind.hpp) and its kernels (worker/layers/layers.hpp), nothing else. The
// config reads and emits its key, the model hash covers it, the model spec and the memory
// model use its description, and it trains: sharded 2x2 as unsharded, its weight moved by
// the gradient the kernels compute, the memory model's peak equal to the measured one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "orchestrator/config_io.hpp"
#include "orchestrator/layer_kind.hpp"
#include "worker/io/keras_h5.hpp"
#include "worker/layers/layers.hpp"
#include "worker/run/checkpoint.hpp"
#include "worker/run/trainer.hpp"

namespace fs = std::filesystem;

namespace ht {
namespace {

// y[n, c, h, w] = gain * alpha[c] * x[n, c, h, w]; alpha trainable, gain a config key.
// Computed on host copies, so it runs on any backend.
class ScaleLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  double gain() const { return spec().config.number("gain"); }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(t.size());
    ctx_.backend.to_host(v.data(), t.data(), v.size() * sizeof(float));
    return v;
  }
  std::vector<float> alpha() {
    std::vector<float> a(size_t(spec().in.c));
    ctx_.backend.to_host(a.data(), weight("alpha:0"), a.size() * sizeof(float));
    return a;
  }
  Tensor scaled(const Tensor& like, const std::vector<float>& values, const std::string& what) {
    const std::vector<float> a = alpha();
    const size_t plane = size_t(like.h()) * like.w();
    std::vector<float> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = float(gain() * a[(i / plane) % a.size()] * values[i]);
    Tensor t(ctx_.backend.allocator(), like.n(), like.c(), like.h(), like.w(), what + " of " + label());
    ctx_.backend.from_host(t.data(), out.data(), out.size() * sizeof(float));
    return t;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode) override { return scaled(x, host(x), "output"); }
  Tensor backward_impl(const Tensor& x, const Tensor&, const Tensor& dy, bool need_dx) override {
    const std::vector<float> xs = host(x), dys = host(dy);
    const size_t plane = size_t(x.h()) * x.w(), channels = size_t(x.c());
    std::vector<double> sums(channels, 0.0);
    for (size_t i = 0; i < xs.size(); ++i) sums[(i / plane) % channels] += double(xs[i]) * dys[i];
    std::vector<float> dalpha(channels);
    for (size_t c = 0; c < channels; ++c) dalpha[c] = float(gain() * sums[c]);
    // This shard's share; the step's gradient all-reduce sums the shards.
    ctx_.backend.from_host(weight_grad("alpha:0"), dalpha.data(), channels * sizeof(float));
    return need_dx ? scaled(x, dys, "input gradient") : Tensor();
  }
};

void register_scale_layer() {
  static const bool once = [] {
    LayerKind k;
    k.type = "test_scale";
    k.keras_class = "TestScale";
    k.keras_prefix = "test_scale";
    k.keys = {{"gain", KeyType::Positive, LayerValue(1.0), "", 1, {}}};
    k.traits.input = LayerInput::FeatureMap;
    k.shape = [](LayerSpec& l) {
      l.out = l.in;
      l.weights = {{"alpha:0", {l.in.c}, true, WeightLayout::Keras, WeightInit::Ones}};
      l.flops_per_image = 2 * l.in.elements();
    };
    register_layer_kind(std::move(k));
    register_layer_kernels("test_scale", [](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
      return std::make_unique<ScaleLayer>(ctx, index);
    });
    return true;
  }();
  (void)once;
}

class LayerRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    register_scale_layer();
    dir_ = fs::temp_directory_path() / ("halotrain-registry-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string yaml(const std::string& grid, double gain) const {
    std::ostringstream y;
    y << "name: registry\nseed: 5\nrun_dir: " << (dir_ / ("run-" + grid)).string() << "\n"
      << "data:\n  train: " << (dir_ / "data.h5").string() << "\n"
      << "  synthesize: {count: 4, height: 20, width: 18, channels: 1, classes: 2}\n"
      << "model:\n  input: [20, 18, 1]\n  layers:\n"
      << "    - {type: conv2d, filters: 3, kernel: 3, padding: same}\n"
      << "    - {type: test_scale, gain: " << gain << "}\n"
      << "    - {type: conv2d, filters: 2, kernel: 3, padding: same}\n"
      << "    - {type: global_avg_pool}\n"
      << "    - {type: dense, units: 2}\n"
      << "training: {batch_size: 2, steps: 3, log_every: 1, optimizer: {type: sgd, lr: 0.5}}\n"
      << "parallel: {grid: " << grid << ", device_memory: 1GiB}\n"
      << "checkpoint: {every_steps: 0, keep: 1, resume: never}\n";
    return y.str();
  }

  fs::path dir_;
};

// Every built-in kind has its kernels (the factories run on any backend through
// ComputeBackend, so a CUDA build has them too): a kind added to layer_kinds.cpp without
// kernels fails here, not in a user's run. A model using a kind without kernels is refused
// by check_layer_kernels, which the launcher calls before any rank starts.
TEST(LayerKernels, EveryBuiltinKindHasKernels) {
  auto model_of = [](const LayerKind& kind, const std::string& name) {
    ModelSpec model;
    model.layers.emplace_back();
    model.layers.back().config.kind = &kind;
    model.layers.back().config.name = name;
    return model;
  };
  const std::vector<LayerKind> kinds = builtin_layer_kinds();
  ASSERT_GE(kinds.size(), 36u);  // the built-in kinds of SPEC sections 5, 11 and 12
  for (const LayerKind& kind : kinds) EXPECT_NO_THROW(check_layer_kernels(model_of(kind, "probe"))) << kind.type;
  LayerKind unknown = kinds.front();
  unknown.type = "no_such_kind";
  try {
    check_layer_kernels(model_of(unknown, "stem"));
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'stem': its kind 'no_such_kind' has no kernels"), std::string::npos)
        << e.what();
  }
}

TEST_F(LayerRegistryTest, ConfigReadsEmitsAndHashesTheNewKind) {
  const Config c = parse_config(yaml("[1, 1]", 0.5), "registry.yaml");
  const LayerConfig& scale = c.model.layers[1];
  EXPECT_EQ(scale.type(), "test_scale");
  EXPECT_EQ(scale.name, "test_scale_1");
  EXPECT_DOUBLE_EQ(scale.number("gain"), 0.5);
  EXPECT_NE(to_yaml(c).find("{type: test_scale, name: \"test_scale_1\", gain: 0.5}"), std::string::npos)
      << to_yaml(c);
  // Its key is checked like a built-in one, and named in the other kinds' messages.
  try {
    parse_config(yaml("[1, 1]", -1), "registry.yaml");
    ADD_FAILURE() << "a negative gain was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers[1].gain: expected a number > 0"), std::string::npos)
        << e.what();
  }
  const ModelSpec a = build_model_spec(c), b = build_model_spec(parse_config(yaml("[1, 1]", 2), "r.yaml"));
  EXPECT_NE(model_hash(a), model_hash(b));  // the new key is part of the model
  ASSERT_EQ(a.layers[1].weights.size(), 1u);
  EXPECT_EQ(a.layers[1].weights[0].keras_shape, std::vector<int64_t>{3});
  // Its traits say it needs a feature map; the spec says so, naming it, after the global pool.
  Config after = c;
  after.model.layers.insert(after.model.layers.end() - 1, scale);
  after.model.layers[after.model.layers.size() - 2].name = "late_scale";
  try {
    build_model_spec(after);
    ADD_FAILURE() << "a test_scale after the global pool was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(test_scale 'late_scale'): needs a feature map input, but it reads a "
                                         "per-image channel vector"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(LayerRegistryTest, TrainsShardedAsUnshardedWithTheMemoryModelExact) {
  std::vector<std::vector<float>> alphas;
  for (const std::string grid : {"[1, 1]", "[2, 2]"}) {
    const Config c = parse_config(yaml(grid, 0.5), "registry.yaml");
    const TrainSummary s = run_training(c);
    ASSERT_EQ(s.steps, 3);
    const KerasWeightsFile ckpt(s.checkpoint);
    std::vector<float> alpha(3);
    ckpt.read("test_scale_1", "alpha:0", alpha.data());
    alphas.push_back(alpha);
    // predicted == measured, every rank, from the kind's description alone.
    std::ifstream csv(c.run_dir + "/memory.csv");
    std::string line;
    std::getline(csv, line);
    int ranks = 0;
    while (std::getline(csv, line)) {
      std::vector<std::string> f;
      std::stringstream ss(line);
      for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
      ASSERT_GE(f.size(), 3u) << line;
      EXPECT_EQ(f[1], f[2]) << grid << " rank " << f[0] << ": measured vs predicted peak";
      ++ranks;
    }
    EXPECT_EQ(ranks, grid == "[1, 1]" ? 1 : 4);
  }
  for (int c = 0; c < 3; ++c) {
    EXPECT_GT(std::fabs(alphas[0][c] - 1.0f), 1e-6) << "alpha[" << c << "] did not train";
    EXPECT_NEAR(alphas[1][c], alphas[0][c], 1e-5 + 1e-4 * std::fabs(alphas[0][c])) << "alpha[" << c << "] on 2x2";
  }
}

}  // namespace
}  // namespace ht
