// Config parsing: the SPEC example and defaults parse to the documented values, --set
// overrides apply before validation, to_yaml round-trips. Errors: config_errors_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orchestrator/config.hpp"
#include "orchestrator/config_io.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/layer_kind.hpp"

#include "common/config_support.hpp"

namespace ht {
namespace {

using namespace ht::testing;

// SPEC section 3, verbatim.
const char* kSpecExample = R"(name: demo                     # run name; outputs go to run_dir
run_dir: runs/demo             # metrics.csv, logs, checkpoints/, job.sbatch
seed: 1234
data:
  train: data/demo.h5          # HDF5 file (section 4)
  images: images               # dataset name
  targets: labels              # dataset name: labels [N] or masks [N,H,W,1]
  scale: 1.0                   # pixel multiplier applied on read (e.g. 1/65535 for uint16)
  shuffle: true                # per-epoch permutation from `seed`; false = file order
  synthesize: {count: 16, height: 1024, width: 768, channels: 1, classes: 2}  # optional: make data.train if missing
model:
  input: [5928, 4728, 1]       # H, W, C; must match the dataset
  layers:                      # applied in order; `name` optional (Keras-style default names)
    - {type: conv2d, filters: 16, kernel: 3, stride: 1, padding: same, dilation: 1, bias: true}
    - {type: batch_norm, momentum: 0.99, epsilon: 0.001}
    - {type: relu}
    - {type: max_pool2d, pool: 2, stride: 2}
    - {type: global_avg_pool}
    - {type: dense, units: 2}
  loss: softmax_cross_entropy  # | sigmoid_bce (per-pixel, masks) | mse
training:
  batch_size: 2                # global batch (images per step, all shards together)
  steps: 100                   # total optimizer steps (or `epochs:`)
  optimizer: {type: adam, lr: 0.0001, beta1: 0.9, beta2: 0.999, epsilon: 1.0e-7}   # | {type: sgd, lr, momentum}
  init_weights: null           # Keras-format .h5 to start from
  init_by_name: false          # true: load layers whose names match, report the rest
parallel:
  backend: cpu                 # cpu | cuda
  grid: [2, 1]                 # shards per image: rows x cols; or `auto`
  device_memory: 11441MiB      # budget per device (a K80 die); plan and run must stay under it
  devices_per_node: 2          # K80: 2 dies per card
  activations: auto            # auto | keep | offload | recompute: how activations kept for backward fit
checkpoint:
  every_steps: 50
  keep: 3
  resume: auto                 # auto: newest valid checkpoint in run_dir | never | a path
recycle:
  every_steps: 0               # 0 = off; else tear down and rebuild all device/comm state
  mode: in_process             # in_process | restart (the process exits and is relaunched)
slurm:
  partition: gpu
  nodes: 1
  time: "04:00:00"
  account: null
  signal: USR2                 # sent `signal_before` seconds before the time limit
  signal_before: 120           # -> checkpoint, `scontrol requeue`, exit 3, resume on restart
  extra: []                    # more `#SBATCH` lines, verbatim
)";


TEST(Config, SpecExampleParses) {
  const Config c = parse_config(kSpecExample, "spec.yaml");
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.run_dir, "runs/demo");
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.data.train, "data/demo.h5");
  EXPECT_EQ(c.data.images, "images");
  EXPECT_EQ(c.data.targets, "labels");
  EXPECT_DOUBLE_EQ(c.data.scale, 1.0);
  EXPECT_TRUE(c.data.shuffle);
  ASSERT_TRUE(c.data.synthesize.has_value());
  EXPECT_EQ(c.data.synthesize->count, 16);
  EXPECT_EQ(c.data.synthesize->height, 1024);
  EXPECT_EQ(c.data.synthesize->width, 768);
  EXPECT_EQ(c.data.synthesize->channels, 1);
  EXPECT_EQ(c.data.synthesize->classes, 2);
  EXPECT_FALSE(c.data.synthesize->masks);
  EXPECT_EQ(c.model.height, 5928);
  EXPECT_EQ(c.model.width, 4728);
  EXPECT_EQ(c.model.channels, 1);
  ASSERT_EQ(c.model.layers.size(), 6u);
  const auto& L = c.model.layers;
  EXPECT_EQ(L[0].type(), "conv2d");
  EXPECT_EQ(L[0].name, "conv2d_1");
  EXPECT_EQ(L[0].integer("filters"), 16);
  EXPECT_EQ(L[0].integer("kernel"), 3);
  EXPECT_EQ(L[0].integer("stride"), 1);
  EXPECT_EQ(L[0].padding("padding").mode, PaddingMode::Same);
  EXPECT_EQ(L[0].integer("dilation"), 1);
  EXPECT_TRUE(L[0].flag("bias"));
  EXPECT_EQ(L[0].line, line_of(kSpecExample, "type: conv2d"));
  EXPECT_EQ(L[1].type(), "batch_norm");
  EXPECT_EQ(L[1].name, "batch_normalization_1");
  EXPECT_DOUBLE_EQ(L[1].number("momentum"), 0.99);
  EXPECT_DOUBLE_EQ(L[1].number("epsilon"), 0.001);
  EXPECT_EQ(L[2].name, "activation_1");
  EXPECT_EQ(L[3].type(), "max_pool2d");
  EXPECT_EQ(L[3].name, "max_pooling2d_1");
  EXPECT_EQ(L[3].integer("pool"), 2);
  EXPECT_EQ(L[3].integer("stride"), 2);
  EXPECT_EQ(L[3].padding("padding").mode, PaddingMode::Valid);
  EXPECT_EQ(L[4].name, "global_average_pooling2d_1");
  EXPECT_EQ(L[5].type(), "dense");
  EXPECT_EQ(L[5].name, "dense_1");
  EXPECT_EQ(L[5].integer("units"), 2);
  EXPECT_EQ(L[5].line, line_of(kSpecExample, "type: dense"));
  EXPECT_EQ(c.model.loss, LossType::SoftmaxCrossEntropy);
  EXPECT_EQ(c.training.batch_size, 2);
  EXPECT_EQ(c.training.steps, 100);
  EXPECT_EQ(c.training.epochs, 0);
  EXPECT_EQ(c.training.optimizer.type, OptimizerType::Adam);
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.training.optimizer.epsilon, 1e-7);
  EXPECT_EQ(c.training.init_weights, "");
  EXPECT_FALSE(c.training.init_by_name);
  EXPECT_EQ(c.parallel.backend, Backend::CPU);
  EXPECT_FALSE(c.parallel.grid_auto);
  EXPECT_EQ(c.parallel.grid_rows, 2);
  EXPECT_EQ(c.parallel.grid_cols, 1);
  EXPECT_EQ(c.parallel.device_memory, 11441ull * 1024 * 1024);
  EXPECT_EQ(c.parallel.devices_per_node, 2);
  EXPECT_EQ(c.parallel.activations, ActivationPolicy::Auto);
  EXPECT_EQ(c.checkpoint.every_steps, 50);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.recycle.every_steps, 0);
  EXPECT_EQ(c.recycle.mode, RecycleMode::InProcess);
  EXPECT_EQ(c.slurm.partition, "gpu");
  EXPECT_EQ(c.slurm.nodes, 1);
  EXPECT_EQ(c.slurm.time, "04:00:00");
  EXPECT_EQ(c.slurm.account, "");
  EXPECT_EQ(c.slurm.signal, "USR2");
  EXPECT_EQ(c.slurm.signal_before, 120);
  EXPECT_TRUE(c.slurm.extra.empty());
  EXPECT_EQ(c.source_path, "spec.yaml");
  EXPECT_EQ(c.text, kSpecExample);
}

TEST(Config, DefaultsFillEverythingOptional) {
  const Config c = parse_config(kMinimal, "cfg.yaml");
  EXPECT_EQ(c.name, "run");
  EXPECT_EQ(c.run_dir, "runs/run");
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.data.images, "images");
  EXPECT_EQ(c.data.targets, "labels");
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_FALSE(c.data.synthesize.has_value());
  EXPECT_EQ(c.model.loss, LossType::SoftmaxCrossEntropy);
  const LayerConfig& conv = c.model.layers[0];
  EXPECT_EQ(conv.integer("kernel"), 1);
  EXPECT_EQ(conv.integer("stride"), 1);
  EXPECT_EQ(conv.integer("dilation"), 1);
  EXPECT_EQ(conv.padding("padding").mode, PaddingMode::Valid);
  EXPECT_TRUE(conv.flag("bias"));
  EXPECT_EQ(c.model.layers[2].integer("pool"), 2);
  EXPECT_EQ(c.model.layers[2].integer("stride"), 2);  // pools stride by their window
  EXPECT_EQ(c.training.batch_size, 2);
  EXPECT_EQ(c.training.optimizer.type, OptimizerType::Adam);
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 1e-4);
  EXPECT_EQ(c.training.log_every, 10);
  EXPECT_EQ(c.parallel.grid_rows * c.parallel.grid_cols, 1);
  EXPECT_EQ(c.parallel.device_memory, 11441ull << 20);
  EXPECT_EQ(c.checkpoint.resume, "auto");
  EXPECT_EQ(c.recycle.mode, RecycleMode::InProcess);
  EXPECT_EQ(c.slurm.time, "04:00:00");
  EXPECT_EQ(c.slurm.signal, "USR2");

  const Config named = parse_config(std::string(kMinimal) + "name: exp7\n", "cfg.yaml");
  EXPECT_EQ(named.run_dir, "runs/exp7");
}

TEST(Config, StepsEpochsAndOptimizers) {
  const std::string base = R"(data: {train: d.h5}
model: {input: [8, 8, 1], layers: [{type: relu}]}
)";
  Config c = parse_config(base + "training: {epochs: 4, optimizer: {type: sgd, lr: 0.1, momentum: 0.9}}\n", "c");
  EXPECT_EQ(c.training.steps, 0);
  EXPECT_EQ(c.training.epochs, 4);
  EXPECT_EQ(c.training.optimizer.type, OptimizerType::SGD);
  EXPECT_DOUBLE_EQ(c.training.optimizer.momentum, 0.9);
  c = parse_config(base + "training: {steps: 7, epochs: 4}\n", "c");
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(c.training.epochs, 0);  // steps wins

  const std::string none = base + "training: {batch_size: 2}\n";
  std::string e = error_of(none);
  EXPECT_CONTAINS(e, "training: expected steps >= 1 or epochs >= 1");
  EXPECT_CONTAINS(e, "found neither");
  e = error_of(base + "training:\n  steps: 5\n  optimizer: {type: adam, momentum: 0.9}\n");
  EXPECT_CONTAINS(e, "cfg.yaml:5: key 'training.optimizer.momentum' is not allowed with type adam");
  EXPECT_CONTAINS(e, "allowed keys: type, lr, beta1, beta2, epsilon");
}

TEST(ConfigOverrides, ApplyBeforeValidation) {
  const Config c = parse_config(kSpecExample, "spec.yaml",
                                {"parallel.grid=[4, 2]", "model.layers[0].filters=8", "training.steps=5",
                                 "slurm.account=proj", "model.layers[6]={type: relu, name: last}",
                                 "data.synthesize.count=4", "parallel.device_memory=2GB"});
  EXPECT_EQ(c.parallel.grid_rows, 4);
  EXPECT_EQ(c.parallel.grid_cols, 2);
  EXPECT_EQ(c.model.layers[0].integer("filters"), 8);
  EXPECT_EQ(c.model.layers[0].integer("kernel"), 3);  // the rest of the layer is kept
  EXPECT_EQ(c.training.steps, 5);
  EXPECT_EQ(c.slurm.account, "proj");
  ASSERT_EQ(c.model.layers.size(), 7u);
  EXPECT_EQ(c.model.layers[6].name, "last");
  EXPECT_EQ(c.model.layers[6].line, 0);  // not from the file
  EXPECT_EQ(c.data.synthesize->count, 4);
  EXPECT_EQ(c.data.synthesize->height, 1024);
  EXPECT_EQ(c.parallel.device_memory, 2000000000ull);
  EXPECT_EQ(c.source_path, "spec.yaml");
  // The text is the tree after overrides: parsing it gives the same config.
  const Config again = parse_config(c.text, "text");
  EXPECT_EQ(to_yaml(again), to_yaml(c));

  EXPECT_TRUE(parse_config(kMinimal, "c", {"parallel.grid=auto"}).parallel.grid_auto);
  // An override may create a whole missing section.
  EXPECT_EQ(parse_config(kMinimal, "c", {"recycle.mode=restart"}).recycle.mode, RecycleMode::Restart);
}

TEST(Config, ParallelHostMemoryIsAutoOrASize) {
  EXPECT_EQ(parse_config(kMinimal, "c").parallel.host_memory, 0u);
  EXPECT_EQ(parse_config(kMinimal, "c", {"parallel.host_memory=auto"}).parallel.host_memory, 0u);
  const Config set = parse_config(kMinimal, "c", {"parallel.host_memory=48GiB"});
  EXPECT_EQ(set.parallel.host_memory, 48ull << 30);
  EXPECT_EQ(parse_config(to_yaml(set), "again").parallel.host_memory, 48ull << 30);  // emitted and read back
  EXPECT_EQ(parse_config(to_yaml(parse_config(kMinimal, "c")), "again").parallel.host_memory, 0u);
  EXPECT_NE(error_of(kMinimal, {"parallel.host_memory=0"}).find("parallel.host_memory: expected a size > 0"),
            std::string::npos);
}

TEST(Config, ParallelThreadsIsAutoOrACount) {
  EXPECT_EQ(parse_config(kMinimal, "c").parallel.threads, 0);
  EXPECT_EQ(parse_config(kMinimal, "c", {"parallel.threads=auto"}).parallel.threads, 0);
  const Config four = parse_config(kMinimal, "c", {"parallel.threads=4"});
  EXPECT_EQ(four.parallel.threads, 4);
  EXPECT_EQ(parse_config(to_yaml(four), "again").parallel.threads, 4);  // emitted and read back
  EXPECT_NE(error_of(kMinimal, {"parallel.threads=0"})
                .find("parallel.threads: expected auto or the CPU threads of each rank, an integer in [1, 4096]"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"parallel.threads=many"}).find("parallel.threads"), std::string::npos);
}

TEST(ConfigOverrides, ErrorsNameTheOverride) {
  EXPECT_EQ(error_of(kMinimal, {"training.optimzer.lr=0.1"}),
            "--set training.optimzer.lr=0.1: unknown key 'training.optimzer'; did you mean 'training.optimizer'?");
  EXPECT_EQ(error_of(kMinimal, {"traning.steps=1"}),
            "--set traning.steps=1: unknown key 'traning'; did you mean 'training'?");
  EXPECT_EQ(error_of(kMinimal, {"model.layers[0].filters=abc"}),
            "--set model.layers[0].filters=abc: model.layers[0].filters: expected an integer >= 1, found 'abc'");
  EXPECT_EQ(error_of(kMinimal, {"model.layers[1]={type: conv2d}"}),
            "--set model.layers[1]={type: conv2d}: missing required key 'model.layers[1].filters': expected an "
            "integer >= 1");
  EXPECT_CONTAINS(error_of(kMinimal, {"training.steps"}), "--set training.steps: expected key.path=value");
  EXPECT_CONTAINS(error_of(kMinimal, {"model.layers[9].filters=3"}),
                  "--set model.layers[9].filters=3: index [9] is out of range: 'model.layers' has 3 entries");
  EXPECT_CONTAINS(error_of(kMinimal, {"training[0]=1"}),
                  "--set training[0]=1: cannot index 'training' with [0]: it is a map, not a list");
  EXPECT_CONTAINS(error_of(kMinimal, {"parallel.grid=[2,1"}),
                  "--set parallel.grid=[2,1: malformed YAML value '[2,1'");
  EXPECT_CONTAINS(error_of(kMinimal, {"a..b=1"}), "--set a..b=1: malformed key path 'a..b'");
  EXPECT_CONTAINS(error_of(kMinimal, {"model.input.h=3"}),
                  "--set model.input.h=3: cannot set key 'model.input.h': 'model.input' is a list of 3, not a map");
  // A later problem in the file still names the file, not the override.
  const std::string bad = std::string(kMinimal) + "seed: -3\n";
  EXPECT_EQ(error_of(bad, {"training.steps=2"}), "cfg.yaml:11: seed: expected an integer >= 0, found '-3'");
}

TEST(Config, Sizes) {
  EXPECT_EQ(parse_size("11441MiB"), 11441ull << 20);
  EXPECT_EQ(parse_size("11441 MiB"), 11441ull * 1048576);
  EXPECT_EQ(parse_size("2GB"), 2000000000ull);
  EXPECT_EQ(parse_size("2 GB"), 2000000000ull);
  EXPECT_EQ(parse_size("512"), 512u);
  EXPECT_EQ(parse_size("512B"), 512u);
  EXPECT_EQ(parse_size("3KiB"), 3072u);
  EXPECT_EQ(parse_size("3KB"), 3000u);
  EXPECT_EQ(parse_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_size("16GiB"), 16ull << 30);
  for (const char* bad : {"", "MiB", "12XB", "-1GB", "1.5", "2 gb", "1..5MB", "99999999999999GiB", "GB2"})
    EXPECT_THROW(parse_size(bad), std::invalid_argument) << bad;
  EXPECT_EQ(format_size(11441ull << 20), "11.17 GiB");
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(1536), "1.50 KiB");
  const Config c = parse_config(std::string(kMinimal) + "parallel: {device_memory: 12000000000}\n", "c");
  EXPECT_EQ(c.parallel.device_memory, 12000000000ull);
}

TEST(Config, ToStringSpellings) {
  EXPECT_STREQ(to_string(PaddingMode::Explicit), "explicit");
  EXPECT_STREQ(to_string(LossType::SigmoidBCE), "sigmoid_bce");
  EXPECT_STREQ(to_string(OptimizerType::SGD), "sgd");
  EXPECT_STREQ(to_string(Backend::CUDA), "cuda");
  EXPECT_STREQ(to_string(ActivationPolicy::Recompute), "recompute");
  EXPECT_STREQ(to_string(RecycleMode::InProcess), "in_process");
}

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.run_dir, b.run_dir);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.targets, b.data.targets);
  EXPECT_EQ(a.data.scale, b.data.scale);
  EXPECT_EQ(a.data.synthesize.has_value(), b.data.synthesize.has_value());
  ASSERT_EQ(a.model.layers.size(), b.model.layers.size());
  for (size_t i = 0; i < a.model.layers.size(); ++i) {
    const LayerConfig &x = a.model.layers[i], &y = b.model.layers[i];
    EXPECT_EQ(x.type(), y.type());
    EXPECT_EQ(x.name, y.name);
    EXPECT_TRUE(x.values == y.values) << x.name;
  }
  EXPECT_EQ(a.model.loss, b.model.loss);
  EXPECT_EQ(a.training.steps, b.training.steps);
  EXPECT_EQ(a.training.epochs, b.training.epochs);
  EXPECT_EQ(a.training.optimizer.type, b.training.optimizer.type);
  EXPECT_EQ(a.training.optimizer.lr, b.training.optimizer.lr);
  EXPECT_EQ(a.training.optimizer.epsilon, b.training.optimizer.epsilon);
  EXPECT_EQ(a.training.optimizer.momentum, b.training.optimizer.momentum);
  EXPECT_EQ(a.training.init_weights, b.training.init_weights);
  EXPECT_EQ(a.parallel.grid_auto, b.parallel.grid_auto);
  EXPECT_EQ(a.parallel.grid_rows, b.parallel.grid_rows);
  EXPECT_EQ(a.parallel.device_memory, b.parallel.device_memory);
  EXPECT_EQ(a.parallel.activations, b.parallel.activations);
  EXPECT_EQ(a.checkpoint.resume, b.checkpoint.resume);
  EXPECT_EQ(a.recycle.mode, b.recycle.mode);
  EXPECT_EQ(a.slurm.time, b.slurm.time);
  EXPECT_EQ(a.slurm.account, b.slurm.account);
  EXPECT_EQ(a.slurm.signal, b.slurm.signal);
  EXPECT_EQ(a.slurm.extra, b.slurm.extra);
}

// SPEC section 7's graph and its new layers' values (inputs, words, sizes, margins).
TEST(Config, GraphsAndNewLayerValuesRoundTrip) {
  const std::string yaml = R"(data: {train: d.h5}
model:
  input: [16, 16, 1]
  loss: sigmoid_bce
  layers:
    - {type: conv2d, name: stem, filters: 2, kernel: 3, padding: same}
    - {type: max_pool2d}
    - {type: upsampling2d, size: [2, 2], interpolation: bilinear, name: up}
    - {type: conv2d_transpose, filters: 2, kernel: 3, stride: 1, padding: same}
    - {type: concatenate, inputs: [up, stem, conv2d_transpose_1]}
    - {type: zero_padding2d, padding: [[1, 2], 3]}
    - {type: cropping2d, cropping: [[2, 1], [3, 3]]}
    - {type: separable_conv2d, filters: 1, kernel: 3, padding: same, depth_multiplier: 2}
training: {steps: 1}
)";
  const Config c = parse_config(yaml, "graph.yaml");
  const auto& layers = c.model.layers;
  EXPECT_EQ(layers[4].inputs, (std::vector<std::string>{"up", "stem", "conv2d_transpose_1"}));
  EXPECT_TRUE(layers[3].inputs.empty());
  EXPECT_EQ(layers[2].choice("interpolation"), "bilinear");
  EXPECT_EQ(layers[2].ints("size"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(layers[5].ints("padding"), (std::vector<int64_t>{1, 2, 3, 3}));
  EXPECT_EQ(layers[6].ints("cropping"), (std::vector<int64_t>{2, 1, 3, 3}));
  const std::string text = to_yaml(c);
  const Config back = parse_config(text, "to_yaml");
  expect_same(c, back);
  for (size_t i = 0; i < layers.size(); ++i) EXPECT_EQ(back.model.layers[i].inputs, layers[i].inputs) << i;
  EXPECT_EQ(to_yaml(back), text);
  const ModelSpec m = build_model_spec(c);
  EXPECT_EQ(m.layers[4].inputs, (std::vector<int>{3, 1, 4}));
  EXPECT_EQ(m.layers[4].out.c, 6);
  EXPECT_EQ(m.readers[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(m.output(), (Shape3{1, 16, 16}));
}

TEST(Config, ToYamlRoundTrips) {
  const Config spec = parse_config(kSpecExample, "spec.yaml");
  const std::string text = to_yaml(spec);
  const Config back = parse_config(text, "to_yaml");
  expect_same(spec, back);
  EXPECT_EQ(to_yaml(back), text);

  // Awkward values: quoted-looking names, explicit padding, sgd, auto grid, odd sizes.
  const std::string odd = R"(name: "null"
seed: 18446744073709551615
data: {train: "123", scale: 1.5259021896696422e-05, synthesize: {count: 2, masks: true}}
model:
  input: [9, 7, 3]
  layers:
    - {type: conv2d, name: "true", filters: 3, kernel: 5, padding: 2, dilation: 2, bias: false}
    - {type: avg_pool2d, pool: 3, stride: 1, padding: same}
    - {type: conv2d, filters: 1}
  loss: sigmoid_bce
training: {epochs: 2, optimizer: {type: sgd, lr: 0.05, momentum: 0.9}, init_weights: w.h5}
parallel: {grid: auto, device_memory: 1000001, backend: cuda, activations: recompute}
checkpoint: {resume: /tmp/ckpt-5.h5}
recycle: {every_steps: 7, mode: restart}
slurm: {account: acct, time: 2-00:00:00, signal: SIGHUP, extra: ["--gres=gpu:4"]}
)";
  const Config a = parse_config(odd, "odd");
  EXPECT_EQ(a.name, "null");
  EXPECT_EQ(a.seed, 18446744073709551615ull);
  const Config b = parse_config(to_yaml(a), "to_yaml");
  expect_same(a, b);
  EXPECT_EQ(to_yaml(b), to_yaml(a));
  EXPECT_EQ(b.model.layers[0].name, "true");
  EXPECT_EQ(b.model.layers[0].padding("padding"), Padding::uniform(2));
  EXPECT_TRUE(b.data.synthesize->masks);
  EXPECT_EQ(b.parallel.device_memory, 1000001u);
}

TEST(Config, LoadConfigFromFile) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "halotrain_config_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "run.yaml").string();
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  const Config c = load_config(path, {"training.steps=9"});
  EXPECT_EQ(c.source_path, path);
  EXPECT_EQ(c.training.steps, 9);
  EXPECT_CONTAINS(c.text, "steps: 9");

  const std::string missing = (dir / "nope.yaml").string();
  try {
    load_config(missing);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), missing + ": config file not found");
  }
  try {
    load_config(dir.string());
    ADD_FAILURE() << "no error for a directory";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), dir.string() + ": is a directory");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ht
