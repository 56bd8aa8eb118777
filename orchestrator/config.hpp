// The typed config of SPEC section 3: parsed once from YAML, validated, then read-only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "orchestrator/config_error.hpp"

namespace ht {


enum class PaddingMode { Explicit, Same, Valid };
enum class LossType { SoftmaxCrossEntropy, SigmoidBCE, MSE };
enum class OptimizerType { Adam, SGD };
enum class Backend { CPU, CUDA };
enum class ActivationPolicy { Auto, Keep, Offload, Recompute };
enum class RecycleMode { InProcess, Restart };
enum class Metric { Accuracy, AUC, Dice, IoU };
enum class ScheduleType { Constant, Cosine, Step, Plateau };
enum class MonitorMode { Auto, Min, Max };

const char* to_string(PaddingMode m);      // "explicit", "same", "valid"
const char* to_string(LossType t);
const char* to_string(OptimizerType t);
const char* to_string(Backend b);
const char* to_string(ActivationPolicy p);
const char* to_string(RecycleMode m);
const char* to_string(Metric m);           // "accuracy", "auc", "dice", "iou"
const char* to_string(ScheduleType t);     // "constant", "cosine", "step"

// A window's padding: `same` (TensorFlow's rule per axis), `valid`, or explicit pixels on
// each side (an integer: every side; [h, w]: top and bottom h, left and right w; or
// [[top, bottom], [left, right]]).
struct Padding {
  PaddingMode mode = PaddingMode::Valid;
  int top = 0, bottom = 0, left = 0, right = 0;  // Explicit only
  Padding(PaddingMode m = PaddingMode::Valid, int every_side = 0)
      : mode(m), top(every_side), bottom(every_side), left(every_side), right(every_side) {}
  Padding(PaddingMode m, int t, int b, int l, int r) : mode(m), top(t), bottom(b), left(l), right(r) {}
  static Padding uniform(int pixels) { return {PaddingMode::Explicit, pixels}; }
  bool is_uniform() const { return top == bottom && top == left && top == right; }
  bool operator==(const Padding& o) const {
    return mode == o.mode && top == o.top && bottom == o.bottom && left == o.left && right == o.right;
  }
};

struct LayerKind;  // orchestrator/layer_kind.hpp: what a layer type is

// One key of a layer: an integer, a number, a flag, a padding, a word of a fixed set
// (interpolation: nearest) or a list of integers (a size [sh, sw]; margins [top, bottom,
// left, right]).
using LayerValue = std::variant<int64_t, double, bool, Padding, std::string, std::vector<int64_t>>;

// The name `inputs` gives the image (SPEC section 7); no layer may take it.
inline constexpr const char* kInputName = "input";

struct LayerConfig {
  const LayerKind* kind = nullptr;
  std::string name;  // Keras-style default filled in when the YAML gives none
  int line = 0;      // 1-based line of the layer in the config file (0: unknown)
  // The layers it reads, by name ("input" is the image), in order; empty: the layer
  // before it (the image for the first). SPEC section 7.
  std::vector<std::string> inputs;
  // Every key of the kind, in its order, defaults filled in.
  std::vector<std::pair<std::string, LayerValue>> values;
  // false: its weights never train (SPEC section 14): no gradient, no optimizer state, a
  // batch norm normalises with its moving statistics. Keras's `trainable`.
  bool trainable = true;

  const std::string& type() const;  // the YAML spelling: "conv2d", "batch_norm", ...
  // The value of one of the kind's keys; std::logic_error when the kind has no such key
  // of that type.
  int integer(std::string_view key) const;
  double number(std::string_view key) const;
  bool flag(std::string_view key) const;
  const Padding& padding(std::string_view key) const;
  const std::string& choice(std::string_view key) const;
  const std::vector<int64_t>& ints(std::string_view key) const;
  std::array<int, 2> pair(std::string_view key) const;  // a Size2 key: {rows, cols}
  const LayerValue* find(std::string_view key) const;
  void set(const std::string& key, LayerValue value);  // replaces the value of one of its keys
};

struct SynthesizeConfig {
  int count = 16;
  int height = 1024;
  int width = 768;
  int channels = 1;
  int classes = 2;     // labels in [0, classes)
  bool masks = false;  // write masks [N,H,W,1] instead of labels
  int validation_count = 0;  // images of data.validation when it is made too (0: count / 4, at least 1)
};

// Training-only random changes of each image, a function of (seed, step, image index).
struct AugmentConfig {
  bool flip_horizontal = false;  // mirror the columns, probability 1/2
  bool flip_vertical = false;    // mirror the rows, probability 1/2
  int crop_height = 0, crop_width = 0;  // 0: no crop; else a random window of this size
  bool crops() const { return crop_height > 0; }
};

// How a manifest's image of another size becomes model.input's (SPEC section 13): refused,
// padded at the bottom and right, cropped at the centre (and padded where smaller), or
// resized as torch's F.interpolate(mode='area') (masks and class maps: mode='nearest').
enum class DataFit { Error, Pad, Crop, Resize };

struct DataConfig {
  std::string train;  // resolved relative to the working directory
  std::string validation;  // empty: none
  std::string images = "images";
  std::string targets = "labels";
  double scale = 1.0;
  bool scale_auto = false;  // data.scale: auto (SPEC section 13)
  DataFit fit = DataFit::Error;
  double pad_value = 0;
  int level = 0;  // pyramid level of tiled TIFFs
  // Per channel, after data.scale: (x - mean) / std (SPEC section 13); empty: none.
  std::vector<double> mean, std;
  // Gray and RGB images of a manifest converted to this many channels (model.input's); 0: as they are.
  int channels = 0;
  bool shuffle = true;
  int downsample = 1;  // integer box average on read
  AugmentConfig augment;
  std::optional<SynthesizeConfig> synthesize;
};

struct ModelConfig {
  int height = 0, width = 0, channels = 0;  // model.input: [H, W, C]
  std::vector<LayerConfig> layers;
  LossType loss = LossType::SoftmaxCrossEntropy;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::Adam;
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-7;  // adam
  double momentum = 0.0;                              // sgd
};

// A validation figure that a callback watches (SPEC section 14): val_loss or val_<metric>.
struct Monitor {
  std::string name = "val_loss";
  MonitorMode mode = MonitorMode::Auto;
  std::string where;  // "cfg.yaml:12: training.early_stopping.monitor", for messages
  // Whether larger is better: mode max, or auto for accuracy, auc, dice and iou.
  bool maximizes() const;
};

// training.early_stopping: Keras's EarlyStopping (absolute min_delta; stop when the
// validations without improvement reach patience).
struct EarlyStopping {
  Monitor monitor;
  int64_t patience = 0;
  double min_delta = 0;
};

// The learning rate of step t (0-based) of T, from the optimizer's lr (SPEC section 8):
// constant; cosine: linear warmup lr*(t+1)/W for t < W, then min_lr + (lr - min_lr) *
// (1 + cos(pi*(t-W)/(T-W)))/2; step: lr * factor^floor(t/every); plateau: the
// optimizer's lr until the trainer lowers it (worker/run/monitors.hpp).
struct LrSchedule {
  ScheduleType type = ScheduleType::Constant;
  int64_t warmup_steps = 0;  // cosine
  double min_lr = 0;         // cosine, plateau
  int64_t every = 1000;      // step
  double factor = 0.5;       // step, plateau (default 0.1 there, as Keras's)
  // plateau: Keras's ReduceLROnPlateau, its defaults
  Monitor monitor;
  int64_t patience = 10;
  double min_delta = 1e-4;
  int64_t cooldown = 0;
};
double scheduled_lr(const LrSchedule& schedule, double lr, int64_t step, int64_t total_steps);

struct TrainingConfig {
  int batch_size = 2;
  int64_t steps = 0;   // total optimizer steps; when 0, `epochs` decides
  int64_t epochs = 0;  // exactly one of steps/epochs is set (steps wins when both)
  OptimizerConfig optimizer;
  std::string init_weights;  // empty: none
  bool init_by_name = false;
  int log_every = 10;  // one plain log line per this many steps when not on a TTY
  int64_t validate_every = 0;  // steps; 0: at the end only (when data.validation is set)
  std::vector<Metric> metrics{Metric::Accuracy};
  LrSchedule lr_schedule;
  double weight_decay = 0;  // adam: decoupled (AdamW); sgd: L2 added to the gradient
  int accumulate = 1;       // micro-batches per optimizer step
  // SPEC section 14: each image's (pixel's) training loss times its class's weight, then
  // the plain mean (Keras's class_weight); the BCE's positive term times pos_weight
  // (torch's BCEWithLogitsLoss). Empty and 1: unweighted. Validation losses stay unweighted.
  std::vector<double> class_weights;
  double pos_weight = 1;
  std::optional<EarlyStopping> early_stopping;
  // Layers (names or glob patterns) frozen until step unfreeze_at (0: for the whole run), as
  // `trainable: false` is; a layer released there starts its optimizer state then.
  std::vector<std::string> freeze;
  int64_t unfreeze_at = 0;
};

struct ParallelConfig {
  Backend backend = Backend::CPU;
  bool grid_auto = false;
  int grid_rows = 1, grid_cols = 1;
  uint64_t device_memory = 11441ull << 20;
  // Host memory per rank (SPEC section 12), the bound of the offload pool; 0 (auto): the
  // node's memory shared among its ranks, less an eighth (plan.hpp host_memory_budget). A
  // plan input: `submit` resolves auto for its ranks from the partition's nodes.
  uint64_t host_memory = 0;
  int devices_per_node = 2;
  ActivationPolicy activations = ActivationPolicy::Auto;
  // CPU threads per rank; 0 (auto): this machine's usable CPUs split among its ranks
  // (orchestrator/conv_geometry.hpp threads_per_rank). A plan input: oneDNN's scratchpads
  // grow with it, so `submit` sets it for the ranks it launches.
  int threads = 0;
  // The instruction set oneDNN dispatches to on the CPU backend: "auto" (what this
  // machine's oneDNN reaches) or one of kernels/cpu/dnnl_isa.hpp's names. A plan input
  // like threads: oneDNN's scratchpads follow it, so a set value plans the same on every
  // machine that has it (a machine without it refuses the plan).
  std::string cpu_isa = "auto";
  // Whether the step schedule fuses batch norm + ReLU (+ max pool)
  // chains where it can (orchestrator/step_schedule.hpp fused_chains). false runs every
  // layer on its own, to compare the two.
  bool fuse = true;
};

struct CheckpointConfig {
  int64_t every_steps = 50;  // 0: only at the end
  int keep = 3;
  std::string resume = "auto";  // auto | never | a path
  // run_dir/checkpoints/best.h5 whenever this validation figure improves (SPEC section 14).
  std::optional<Monitor> best;
};

struct RecycleConfig {
  int64_t every_steps = 0;
  RecycleMode mode = RecycleMode::InProcess;
};

struct SlurmConfig {
  std::string partition = "gpu";
  int nodes = 1;
  std::string time = "04:00:00";
  std::string account;  // empty: none
  std::string signal = "USR2";
  int signal_before = 120;
  std::vector<std::string> extra;
};

struct Config {
  std::string name = "run";
  std::string run_dir = "runs/run";
  uint64_t seed = 1234;
  DataConfig data;
  ModelConfig model;
  TrainingConfig training;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  RecycleConfig recycle;
  SlurmConfig slurm;

  std::string source_path;  // the file it was read from
  std::string text;         // the YAML as read, after --set overrides (stored in checkpoints)
};

// Parses "11441MiB", "2GB", "512" (bytes) ... Throws std::invalid_argument.
uint64_t parse_size(const std::string& text);
std::string format_size(uint64_t bytes);  // "11.17 GiB" style
std::string exact_size(uint64_t bytes);   // "11441MiB": what parse_size reads back exactly

// Seconds of a Slurm time limit (slurm.time): -1 for UNLIMITED/INFINITE; nullopt when
// Slurm would reject the text.
std::optional<int64_t> slurm_time_seconds(const std::string& text);

}  // namespace ht
