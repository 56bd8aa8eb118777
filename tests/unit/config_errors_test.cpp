// Config errors: every class of user error names file/line, key path, expected and found.
#include <gtest/gtest.h>

#include <string>

#include "orchestrator/config.hpp"
#include "orchestrator/config_io.hpp"
#include "orchestrator/model_spec.hpp"

#include "common/config_support.hpp"

namespace ht {
namespace {

using namespace ht::testing;

TEST(ConfigErrors, UnknownKeySuggestsNearest) {
  const std::string yaml = std::string(kMinimal) + "  optimzer: {type: adam}\n";
  EXPECT_EQ(error_of(yaml), at(yaml, "optimzer") +
                                "unknown key 'training.optimzer'; did you mean 'training.optimizer'?");
  const std::string top = std::string(kMinimal) + "paralel: {backend: cpu}\n";
  EXPECT_EQ(error_of(top), at(top, "paralel") + "unknown key 'paralel'; did you mean 'parallel'?");
  const std::string in_layer =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: conv2d, filtres: 2}\n"
      "training: {steps: 1}\n";
  EXPECT_EQ(error_of(in_layer),
            "cfg.yaml:5: unknown key 'model.layers[0].filtres'; did you mean 'model.layers[0].filters'?");
}

TEST(ConfigErrors, FarOffKeyListsValidKeys) {
  const std::string yaml = std::string(kMinimal) + "checkpoint: {xyz: 1}\n";
  EXPECT_EQ(error_of(yaml), "cfg.yaml:11: unknown key 'checkpoint.xyz'; did you mean 'checkpoint.keep'? (valid "
                            "keys here: every_steps, keep, resume, best)");
  // A prefix of a value is near enough to suggest it.
  EXPECT_CONTAINS(error_of(kMinimal, {"model.loss=softmax"}),
                  "found 'softmax'; did you mean 'softmax_cross_entropy'?");
}

TEST(ConfigErrors, WrongType) {
  const std::string yaml =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: relu}\n"
      "    - {type: conv2d, filters: 2}\n    - {type: conv2d, filters: abc}\ntraining: {steps: 1}\n";
  EXPECT_EQ(error_of(yaml), "cfg.yaml:7: model.layers[2].filters: expected an integer >= 1, found 'abc'");
  std::string e = error_of(std::string(kMinimal) + "  batch_size: [2]\n");
  EXPECT_CONTAINS(e, "cfg.yaml:11: training.batch_size: expected an integer >= 1, found a list");
  e = error_of(std::string(kMinimal) + "  init_by_name: maybe\n");
  EXPECT_CONTAINS(e, "training.init_by_name: expected true or false, found 'maybe'");
  e = error_of(std::string(kMinimal) + "parallel: {backend: gpu}\n");
  EXPECT_CONTAINS(e, "cfg.yaml:11: parallel.backend: expected one of cpu | cuda, found 'gpu'");
  e = error_of(std::string(kMinimal) + "parallel: {grid: 2x1}\n");
  EXPECT_CONTAINS(e, "parallel.grid: expected [rows, cols] (integers >= 1) or auto, found '2x1'");
  e = error_of("data: {train: d.h5}\nmodel: {input: [8, 8, 1], layers: [{type: relu, name: a/b}]}\n");
  EXPECT_CONTAINS(e, "cfg.yaml:2: model.layers[0].name: expected a layer name without '/', found 'a/b'");
  e = error_of(std::string(kMinimal) + "model2: 1\n");
  EXPECT_CONTAINS(e, "unknown key 'model2'; did you mean 'model'?");
  e = error_of(std::string(kMinimal) + "  optimizer: {lr: fast}\n");
  EXPECT_CONTAINS(e, "training.optimizer.lr: expected a number > 0, found 'fast'");
  e = error_of("data: {train: d.h5}\nmodel: {input: [8, 8], layers: [{type: relu}]}\ntraining: {steps: 1}\n");
  EXPECT_CONTAINS(e, "cfg.yaml:2: model.input: expected a list [height, width, channels] of integers >= 1, found a list of 2");
}

TEST(ConfigErrors, OutOfRange) {
  std::string e = error_of(
      "data: {train: d.h5}\nmodel: {input: [8, 8, 1], layers: [{type: conv2d, filters: 0}]}\ntraining: {steps: 1}\n");
  EXPECT_EQ(e, "cfg.yaml:2: model.layers[0].filters: expected an integer >= 1, found '0'");
  e = error_of(
      "data: {train: d.h5}\nmodel: {input: [8, 8, 1], layers: [{type: batch_norm, momentum: 1.5}]}\n"
      "training: {steps: 1}\n");
  EXPECT_CONTAINS(e, "model.layers[0].momentum: expected a number in [0, 1), found '1.5'");
  e = error_of(std::string(kMinimal) + "parallel: {grid: [0, 2]}\n");
  EXPECT_CONTAINS(e, "parallel.grid[0]: expected an integer >= 1, found '0'");
  e = error_of(std::string(kMinimal) + "  batch_size: 99999999999\n");
  EXPECT_CONTAINS(e, "training.batch_size: expected an integer in [1, 2147483647], found '99999999999'");
  e = error_of(std::string(kMinimal) + "slurm: {signal_before: 70000}\n");
  EXPECT_CONTAINS(e, "slurm.signal_before: expected an integer in [0, 65535], found '70000'");
  e = error_of(std::string(kMinimal) + "slurm: {time: '01:00', signal_before: 120}\n");
  EXPECT_CONTAINS(e, "slurm.signal_before: 120 s must be shorter than slurm.time '01:00' (60 s)");
  e = error_of(
      "data: {train: d.h5}\nmodel: {input: [8, 8, 1], layers: [{type: conv2d, filters: 1, padding: -1}]}\n"
      "training: {steps: 1}\n");
  EXPECT_CONTAINS(e, "model.layers[0].padding: expected an integer >= 0, found '-1'");
}

TEST(ConfigErrors, MissingRequiredNamesParentLine) {
  const std::string yaml =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: relu}\n"
      "    - type: conv2d\n      kernel: 3\ntraining: {steps: 1}\n";
  EXPECT_EQ(error_of(yaml), "cfg.yaml:6: missing required key 'model.layers[1].filters': expected an integer >= 1");
  std::string e = error_of("model: {input: [8, 8, 1], layers: [{type: relu}]}\ntraining: {steps: 1}\n");
  EXPECT_CONTAINS(e, "missing required key 'data'");
  e = error_of("data:\n  images: x\nmodel: {input: [8, 8, 1], layers: [{type: relu}]}\ntraining: {steps: 1}\n");
  EXPECT_CONTAINS(e, "cfg.yaml:1: missing required key 'data.train'");
  e = error_of("data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {name: x}\n");
  EXPECT_CONTAINS(e, "cfg.yaml:5: missing required key 'model.layers[0].type': expected one of conv2d |");
  e = error_of("data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers: [{type: dense}]\n");
  EXPECT_CONTAINS(e, "missing required key 'model.layers[0].units'");
  e = error_of("");
  EXPECT_CONTAINS(e, "cfg.yaml: missing required key 'model'");
}

TEST(ConfigErrors, MalformedYamlGivesLineAndColumn) {
  EXPECT_CONTAINS(error_of("name: a\nseed: 1\n  bad: 2\n"), "cfg.yaml:3:6: malformed YAML at line 3, column 6:");
  EXPECT_CONTAINS(error_of("name: a\nmodel:\n  input: [1, 2\n  loss: mse\n"), "cfg.yaml:4:7: malformed YAML");
  EXPECT_CONTAINS(error_of("- just\n- a list\n"), "cfg.yaml: expected a map of settings");
  const std::string dup = std::string(kMinimal) + "  steps: 4\n";
  EXPECT_EQ(error_of(dup), "cfg.yaml:11: duplicate key 'training.steps' (first given at cfg.yaml:10)");
}

TEST(ConfigErrors, UnknownLayerType) {
  const std::string yaml =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: conv3d, filters: 2}\n";
  EXPECT_EQ(error_of(yaml),
            "cfg.yaml:5: model.layers[0].type: expected one of conv2d | batch_norm | relu | max_pool2d | "
            "avg_pool2d | global_avg_pool | dense | leaky_relu | sigmoid | tanh | global_max_pool | dropout | add | "
            "concatenate | depthwise_conv2d | separable_conv2d | upsampling2d | conv2d_transpose | zero_padding2d | "
            "cropping2d | resize | relu6 | clip | silu | hard_sigmoid | hard_swish | gelu | multiply | layer_norm | "
            "scale | drop_path | flatten | channel_shuffle | channel_slice | instance_norm | group_norm, found "
            "'conv3d'; "
            "did you mean 'conv2d'?");
  EXPECT_CONTAINS(error_of("data: {train: d}\nmodel: {input: [8, 8, 1], layers: [relu]}\n"),
                  "model.layers[0]: expected a map such as {type: conv2d, filters: 16}, found 'relu'");
}

TEST(ConfigErrors, KeyNotAllowedForLayerType) {
  const std::string yaml =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: relu, filters: 3}\n";
  EXPECT_EQ(error_of(yaml),
            "cfg.yaml:5: key 'model.layers[0].filters' is not allowed for a relu layer (it is a setting of "
            "conv2d, separable_conv2d, conv2d_transpose); allowed keys: type, name, inputs, trainable");
  const std::string pool =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: max_pool2d, bias: false}\n";
  EXPECT_CONTAINS(error_of(pool), "key 'model.layers[0].bias' is not allowed for a max_pool2d layer (it is a "
                                  "setting of conv2d, dense, depthwise_conv2d, separable_conv2d, conv2d_transpose); allowed keys: type, name, inputs, trainable, pool, stride, padding");
}

TEST(ConfigErrors, BadSizeUnit) {
  const std::string yaml = std::string(kMinimal) + "parallel:\n  device_memory: 12XB\n";
  const std::string e = error_of(yaml);
  EXPECT_CONTAINS(e, "cfg.yaml:12: parallel.device_memory: expected a size such as 11441MiB, 2GB");
  EXPECT_CONTAINS(e, "found '12XB' (unknown unit 'XB'");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "parallel: {device_memory: 0}\n"),
                  "parallel.device_memory: expected a size > 0, found '0'");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "parallel:\n  host_memory: lots\n"),
                  "cfg.yaml:12: parallel.host_memory: expected a size such as 11441MiB, 2GB");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "parallel: {host_memory: [1]}\n"),
                  "parallel.host_memory: expected auto or a size such as");
}

TEST(ConfigErrors, BadSlurmTimeAndSignal) {
  for (const char* bad : {"4h", "1:2:3:4", "10:61", "1-25", "12:", "-1", "1:70:00", "2-3:60"}) {
    const std::string yaml = std::string(kMinimal) + "slurm:\n  time: '" + bad + "'\n";
    const std::string e = error_of(yaml);
    EXPECT_CONTAINS(e, "cfg.yaml:12: slurm.time: expected a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, "
                       "D-HH:MM or D-HH:MM:SS), found '" + std::string(bad) + "'");
  }
  for (const char* good : {"30", "30:00", "04:00:00", "2-12", "2-12:30", "2-12:30:15", "90", "UNLIMITED"}) {
    const Config c = parse_config(std::string(kMinimal) + "slurm: {time: '" + good + "', signal_before: 10}\n", "c");
    EXPECT_EQ(c.slurm.time, good);
  }
  EXPECT_EQ(parse_config(std::string(kMinimal) + "slurm: {signal: SIGUSR1}\n", "c").slurm.signal, "USR1");
  EXPECT_EQ(parse_config(std::string(kMinimal) + "slurm: {signal: sigterm}\n", "c").slurm.signal, "TERM");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "slurm: {signal: KILL}\n"),
                  "slurm.signal: expected a signal name (USR1, USR2, TERM, INT, HUP, ALRM, with or without SIG), "
                  "found 'KILL'");
  const Config nullable = parse_config(
      std::string(kMinimal) + "slurm: {account: proj1, extra: ['--gres=gpu:2', '--exclusive']}\n", "c");
  EXPECT_EQ(nullable.slurm.account, "proj1");
  EXPECT_EQ(nullable.slurm.extra, (std::vector<std::string>{"--gres=gpu:2", "--exclusive"}));
}

TEST(ConfigErrors, DuplicateLayerNamesNameBothLines) {
  const std::string yaml =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: conv2d, filters: 2, name: stem}\n"
      "    - {type: relu}\n    - {type: conv2d, filters: 2, name: stem}\n";
  EXPECT_EQ(error_of(yaml),
            "cfg.yaml:7: model.layers[2].name: duplicate layer name 'stem'; model.layers[0] at cfg.yaml:5 already "
            "uses it");
  const std::string clash =
      "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  layers:\n    - {type: conv2d, filters: 2}\n"
      "    - {type: conv2d, filters: 2, name: conv2d_1}\n";
  EXPECT_EQ(error_of(clash),
            "cfg.yaml:6: model.layers[1].name: 'conv2d_1' is also the default name of model.layers[0] at "
            "cfg.yaml:5; choose another name");
}

// SPEC section 7: the graph's errors name the layer, its line and the name.
std::string graph(const std::string& layers) {
  return "data: {train: d.h5}\nmodel:\n  input: [8, 8, 1]\n  loss: mse\n  layers:\n" + layers;
}

// The message of the ConfigError that building the model spec throws, as `plan` does
// (shapes are the spec's), with `training: {steps: 1}` added unless `complete`; "" when
// none is thrown.
std::string spec_error(const std::string& yaml, bool complete = false) {
  try {
    build_model_spec(parse_config(complete ? yaml : yaml + "training: {steps: 1}\n", "cfg.yaml"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigErrors, GraphInputsMustNameEarlierLayers) {
  const std::string unknown = graph(
      "    - {type: conv2d, filters: 2, name: stem}\n"
      "    - {type: relu}\n"
      "    - {type: add, inputs: [stme, activation_1]}\n");
  EXPECT_EQ(error_of(unknown),
            "cfg.yaml:8: model.layers[2].inputs[0]: model.layers[2] (add 'add_1') reads 'stme', which is no layer "
            "of the model; did you mean 'stem'?");
  const std::string later = graph(
      "    - {type: conv2d, filters: 2, name: stem}\n"
      "    - {type: add, inputs: [stem, r]}\n"
      "    - {type: relu, name: r}\n");
  EXPECT_EQ(error_of(later),
            "cfg.yaml:7: model.layers[1].inputs[1]: model.layers[1] (add 'add_1') reads 'r', which is a later "
            "layer (model.layers[2]); a layer may only read earlier layers");
  const std::string self = graph("    - {type: relu, name: r, inputs: [r]}\n");
  EXPECT_CONTAINS(error_of(self), "reads 'r', which is itself (model.layers[0])");
  EXPECT_CONTAINS(error_of(graph("    - {type: relu, name: input}\n")),
                  "model.layers[0].name: 'input' names the model's input; choose another name");
  EXPECT_CONTAINS(error_of(graph("    - {type: relu, inputs: []}\n")),
                  "model.layers[0].inputs: expected a list of names of earlier layers (or input)");
}

TEST(ConfigErrors, GraphLayerThatLeadsNowhere) {
  const std::string yaml = graph(
      "    - {type: conv2d, filters: 2, name: a}\n"
      "    - {type: conv2d, filters: 2, name: b, inputs: [input]}\n"
      "    - {type: relu}\n");
  EXPECT_EQ(error_of(yaml),
            "cfg.yaml:6: model.layers[0]: model.layers[0] (conv2d 'a') is read by no later layer, so it does not "
            "lead to the model's output (the last layer, 'activation_1'); remove it or name it in a later layer's "
            "inputs");
}

TEST(ConfigErrors, GraphJoinsTakeSeveralInputs) {
  EXPECT_EQ(error_of(graph("    - {type: relu}\n    - {type: add}\n")),
            "cfg.yaml:7: model.layers[1]: model.layers[1] (add 'add_1') needs inputs: a list of at least 2 layer "
            "names");
  EXPECT_EQ(error_of(graph("    - {type: relu}\n    - {type: concatenate, inputs: [activation_1]}\n")),
            "cfg.yaml:7: model.layers[1].inputs: model.layers[1] (concatenate 'concatenate_1') takes at least 2 "
            "inputs; found 1");
  EXPECT_EQ(error_of(graph("    - {type: relu, name: a}\n    - {type: relu, inputs: [a, input]}\n")),
            "cfg.yaml:7: model.layers[1].inputs: model.layers[1] (relu 'activation_1') takes 1 input; found 2");
}

TEST(ConfigErrors, GraphJoinShapesNameBothInputs) {
  EXPECT_EQ(spec_error(graph("    - {type: conv2d, filters: 2, name: a}\n"
                             "    - {type: conv2d, filters: 3, padding: same, name: b, inputs: [input]}\n"
                             "    - {type: add, inputs: [b, a]}\n"
                             "    - {type: conv2d, filters: 1}\n")),
            "cfg.yaml:8: model.layers[2] (add 'add_1'): add needs inputs of one shape: input 'b' is 8x8x3 but input "
            "'a' is 8x8x2 (H x W x C)");
  EXPECT_EQ(spec_error(graph("    - {type: conv2d, filters: 2, kernel: 3, name: a}\n"
                             "    - {type: concatenate, inputs: [input, a]}\n"
                             "    - {type: conv2d, filters: 1}\n")),
            "cfg.yaml:7: model.layers[1] (concatenate 'concatenate_1'): concatenate joins channels of maps of one "
            "size: input 'input' is 8x8x1 but input 'a' is 6x6x2 (H x W x C)");
}

TEST(ConfigErrors, NewLayerKeysNameWhatIsExpected) {
  EXPECT_EQ(error_of(graph("    - {type: upsampling2d, interpolation: bicubic}\n")),
            "cfg.yaml:6: model.layers[0].interpolation: expected one of nearest | bilinear, found 'bicubic'");
  EXPECT_CONTAINS(error_of(graph("    - {type: upsampling2d, size: [2]}\n")),
                  "model.layers[0].size: expected an integer >= 1 or a list [rows, cols] of them, found a list of 1");
  EXPECT_CONTAINS(error_of(graph("    - {type: upsampling2d, size: 0}\n")), "model.layers[0].size: expected");
  EXPECT_CONTAINS(error_of(graph("    - {type: zero_padding2d, padding: [[1, 2], [3]]}\n")),
                  "model.layers[0].padding[1]: expected an integer >= 0 or a list [before, after], found a list of 1");
  EXPECT_CONTAINS(error_of(graph("    - {type: cropping2d, cropping: -1}\n")), "model.layers[0].cropping: expected");
  EXPECT_CONTAINS(error_of(graph("    - {type: depthwise_conv2d, depth_multiplier: 0}\n")),
                  "model.layers[0].depth_multiplier: expected an integer >= 1, found '0'");
  EXPECT_CONTAINS(error_of(graph("    - {type: separable_conv2d, kernel: 3}\n")),
                  "model.layers[0].filters");
}

TEST(ConfigErrors, NewLayerShapesNameTheLayer) {
  EXPECT_EQ(spec_error(graph("    - {type: cropping2d, cropping: [[5, 3], [0, 0]]}\n")),
            "cfg.yaml:6: model.layers[0] (cropping2d 'cropping2d_1'): cropping [[5, 3], [0, 0]] leaves nothing of "
            "its 8x8 input");
  EXPECT_EQ(spec_error(graph("    - {type: conv2d_transpose, filters: 1, kernel: 2, stride: 3}\n")),
            "cfg.yaml:6: model.layers[0] (conv2d_transpose 'conv2d_transpose_1'): kernel 2 must be at least the "
            "stride 3");
  EXPECT_EQ(spec_error(graph("    - {type: conv2d_transpose, filters: 1, kernel: 3, padding: 1}\n")),
            "cfg.yaml:6: model.layers[0] (conv2d_transpose 'conv2d_transpose_1'): padding must be valid or same; "
            "found 1");
  // A U-Net whose skip does not match the upsampled size names both.
  EXPECT_CONTAINS(spec_error(graph("    - {type: max_pool2d, name: down}\n"
                                   "    - {type: conv2d, filters: 1, kernel: 3}\n"
                                   "    - {type: upsampling2d, name: up}\n"
                                   "    - {type: concatenate, inputs: [up, input]}\n")),
                  "concatenate joins channels of maps of one size: input 'up' is 4x4x1 but input 'input' is 8x8x1");
}

// Sizes from a config are checked before anything is sized by them: one message, no crash.
TEST(ConfigErrors, SizesTooLargeForAnyMachine) {
  EXPECT_CONTAINS(error_of(graph("    - {type: conv2d, filters: 2147483648, kernel: 3}\n")),
                  "model.layers[0].filters: expected an integer in [1, 2147483647], found '2147483648'");
  EXPECT_CONTAINS(error_of("data: {train: d.h5}\nmodel: {input: [2147483648, 8, 1], layers: [{type: relu}]}\n"),
                  "model.input[0]: expected an integer in [1, 2147483647], found '2147483648'");
  EXPECT_CONTAINS(spec_error("data: {train: d.h5}\nmodel: {input: [2147483647, 2147483647, 1], layers: "
                             "[{type: relu}]}\n"),
                  "model.input: [2147483647, 2147483647, 1] is more than 1099511627776 pixel values an image");
  // 2^31 - 1 channels of 8M x 8M pixels: a product past int64 is still refused.
  EXPECT_CONTAINS(spec_error(graph("    - {type: conv2d, filters: 2147483647, kernel: 1}\n"
                                   "    - {type: upsampling2d, size: 1048576}\n")),
                  "(upsampling2d 'up_sampling2d_1'): its output of 8388608x8388608x2147483647 (H x W x C) is too large");
}

// Per-pixel softmax (SPEC section 7): masks as class maps need K >= 2 channels at the
// input's size; a classifier's output is no per-pixel one.
TEST(ConfigErrors, SoftmaxOnMasksNeedsAFullSizeOutput) {
  const std::string masks = "data: {train: d.h5, synthesize: {masks: true}}\ntraining: {steps: 1}\n";
  EXPECT_EQ(spec_error(masks + "model: {input: [8, 8, 1], layers: [{type: conv2d, filters: 3, kernel: 3, padding: same}]}\n", true),
            "");
  EXPECT_EQ(spec_error(masks + "model: {input: [8, 8, 1], layers: [{type: conv2d, filters: 1}]}\n", true),
            "cfg.yaml: model.loss softmax_cross_entropy on class maps expects an output of 8x8xK (the input size, K "
            ">= 2 classes); found 8x8x1");
  EXPECT_CONTAINS(spec_error(masks + "model: {input: [8, 8, 1], layers: [{type: conv2d, filters: 3, kernel: 3}]}\n", true),
                  "found 6x6x3");
  EXPECT_CONTAINS(spec_error("data: {train: d.h5}\nmodel: {input: [8, 8, 1], layers: [{type: conv2d, filters: 3, "
                             "kernel: 3, padding: same}]}\ntraining: {steps: 1, metrics: [dice]}\n", true),
                  "training.metrics: dice is for two-class masks; this model outputs 3 classes per pixel");
}

// SPEC section 14: one class weight per class of the loss; pos_weight is sigmoid_bce's.
TEST(ConfigErrors, ClassWeightsOnePerClass) {
  const std::string classifier =
      "data: {train: d.h5}\nmodel: {input: [8, 8, 1], layers: [{type: global_avg_pool}, {type: dense, units: 3}]}\n";
  EXPECT_EQ(spec_error(classifier + "training: {steps: 1, class_weights: [1, 2.5, 0]}\n", true), "");
  EXPECT_EQ(spec_error(classifier + "training: {steps: 1, class_weights: [1, 20]}\n", true),
            "cfg.yaml: training.class_weights has 2 weights; model.loss softmax_cross_entropy has 3 classes (the "
            "output's channels), one weight each");
  EXPECT_EQ(spec_error(classifier + "training: {steps: 1, pos_weight: 4}\n", true),
            "cfg.yaml: training.pos_weight weighs the positive term of sigmoid_bce; model.loss is "
            "softmax_cross_entropy");
  const std::string bce = "data: {train: d.h5, synthesize: {masks: true}}\nmodel: {input: [8, 8, 1], loss: sigmoid_bce, "
                          "layers: [{type: conv2d, filters: 1, kernel: 1}]}\n";
  EXPECT_EQ(spec_error(bce + "training: {steps: 1, class_weights: [1, 20], pos_weight: 3}\n", true), "");
  EXPECT_CONTAINS(spec_error(bce + "training: {steps: 1, class_weights: [1, 2, 3]}\n", true),
                  "training.class_weights has 3 weights; model.loss sigmoid_bce has 2 classes (0 and 1)");
  EXPECT_CONTAINS(spec_error("data: {train: d.h5}\nmodel: {input: [8, 8, 1], loss: mse, layers: [{type: conv2d, "
                             "filters: 1, kernel: 1}]}\ntraining: {steps: 1, class_weights: [1, 2]}\n", true),
                  "training.class_weights weighs softmax_cross_entropy and sigmoid_bce; model.loss is mse");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "  class_weights: [1, -2]\n"),
                  "training.class_weights[1]: expected a number >= 0, found '-2'");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "  class_weights: 3\n"),
                  "training.class_weights: expected a list of one weight (a number >= 0) per class, such as [1.0, "
                  "20.0], found '3'");
  EXPECT_CONTAINS(error_of(std::string(kMinimal) + "  pos_weight: 0\n"),
                  "training.pos_weight: expected a number > 0, found '0'");
}

// SPEC section 13: the data keys of manifests.
TEST(ConfigErrors, DataKeysOfManifests) {
  EXPECT_CONTAINS(error_of(kMinimal, {"data.mean=[0.5, 0.5]"}),
                  "data.mean: 2 values; model.input has 1 channel, one value each");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.std=[0]"}), "data.std[0]: expected a number > 0, found '0'");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.fit=stretch"}), "data.fit: expected one of error | pad | crop");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.level=-1"}), "data.level");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.scale=sometimes"}), "data.scale: expected a number > 0");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.channels=3"}),
                  "data.channels: 3, but model.input has 1: the images become the model's channels");
}

}  // namespace
}  // namespace ht
