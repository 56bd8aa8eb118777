// A layer kind: everything halotrain knows about one type of layer, in one place. Config
// reading and emitting, the model spec, the model hash, the shard plan, the memory model
// and the worker's layers read it, so adding a layer is its LayerKind (the built-in ones
// are in layer_kinds.cpp; others come through register_layer_kind), its kernels
// (worker/layers/layers.hpp: register_layer_kernels) and its tests.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"

namespace ht {

struct LayerSpec;  // orchestrator/model_spec.hpp: what a kind computes its shape into

// How one key of a layer is read and checked.
enum class KeyType {
  Int,       // an integer >= LayerKey::min
  Unit,      // a number in [0, 1)
  Positive,  // a number > 0
  NonNegative,  // a number >= 0
  Real,      // any finite number
  Bool,
  Padding,   // an integer >= 0, same or valid (SPEC section 5)
  Choice,    // one of LayerKey::choices
  Size2,     // an integer >= 1, or [rows, cols]: {rows, cols} (kernels, strides, sizes)
  Margins,   // an integer >= 0, [rows, cols], or [[top, bottom], [left, right]]: {top, bottom, left, right}
};

struct LayerKey {
  std::string name;
  KeyType type = KeyType::Int;
  std::optional<LayerValue> default_value;  // none and no default_key: the key is required
  std::string default_key;                  // the default is this (earlier) key's value
  int64_t min = 1;                          // KeyType::Int
  std::vector<std::string> choices;         // KeyType::Choice
  // Whether a change of it is a change of the model, which resume refuses (the model
  // hash); batch norm's momentum and epsilon may change on resume.
  bool in_model_hash = true;
  // False for keys added to a kind after checkpoints of it existed: hashed only when not at
  // their default, so the models of before keep their hash (and resume).
  bool hash_default = true;
};

// Where a layer may sit: on a feature map, on a per-image channel vector (a global pool's
// output and what follows from it, the same on every shard of a sample group), or on either.
enum class LayerInput { FeatureMap, Vector, Either };

// What the backward of a windowed layer reads of its halo-extended input.
enum class WindowUse {
  None,            // only shapes (average pooling): the forward keeps nothing
  WeightGradient,  // the weight gradient (convolution); the input gradient needs only dy,
                   // so the input is freed before the input gradient is made
  InputGradient,   // the input gradient (max pooling); freed once it is made
};

// What the worker's layer does with memory and neighbours; the memory model and the
// shard plan read these, the worker's layers behave by them.
struct LayerTraits {
  LayerInput input = LayerInput::Either;  // where its first input may be
  bool global_pool = false;  // a feature map in, a vector out, reduced over the sample group
  bool windowed = false;     // reads a window of its input (LayerSpec rows/cols): halos
  WindowUse backward_window = WindowUse::None;
  bool conv_workspace = false;  // CUDA: the cuDNN workspace, and a padded copy of the input
                                // where a shard's padding is asymmetric
  int min_inputs = 1, max_inputs = 1;  // how many layers it reads; max 0: no limit (add)
  // Its inputs may mix feature maps and channel vectors, a vector standing for its value at
  // every pixel (multiply: squeeze-excitation's gate).
  bool broadcasts_vectors = false;
  // Its backward is element by element, one input of the output's shape: it may write its
  // input gradient over its output gradient (step_schedule.hpp backward_in_place), which
  // no other layer reads. Its worker layer implements Layer::backward_over.
  bool backward_in_place = false;
  // What its backward reads besides the output gradient: its inputs (ReLU: no, its output
  // decides), its output (convolution, batch norm: no). A tensor that no backward reads
  // (nor a reader under recompute) goes after its last reader's forward whatever its
  // policy (step_schedule.hpp read_by_backward).
  bool backward_reads_inputs = true;
  bool backward_reads_output = true;
};

// A model that does not work at one layer: the message without the layer's location,
// which build_model_spec adds.
class LayerShapeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LayerKind {
  std::string type;          // the YAML spelling: "conv2d"
  std::string keras_class;   // Keras 2's class: "Conv2D"
  std::string keras_prefix;  // default names: conv2d_1, conv2d_2, ...
  std::vector<LayerKey> keys;  // besides `type` and `name`, in the order they are emitted
  LayerTraits traits;
  // Fills `layer.out`, `rows`/`cols` (windowed kinds), `weights` and `flops_per_image`
  // from `layer.config`, `layer.in` and `layer.spatial` (whether the input is a feature
  // map); throws LayerShapeError when the input does not suit the layer.
  std::function<void(LayerSpec& layer)> shape;
};

// The built-in kinds (layer_kinds.cpp), which the table starts with.
std::vector<LayerKind> builtin_layer_kinds();

// Every kind, the built-in ones first, in the order they were registered.
std::vector<const LayerKind*> layer_kinds();
const LayerKind* find_layer_kind(const std::string& type);  // nullptr when there is none
// The one kind whose Keras class this is (the Keras importer's type for a layer of that
// class); nullptr when none or several are (Activation, Dropout).
const LayerKind* find_keras_kind(const std::string& keras_class);
// Adds a kind; std::logic_error when its type is taken or the description is not
// consistent (keys, defaults). Not thread-safe: register before anything reads the table.
const LayerKind& register_layer_kind(LayerKind kind);

// A layer of `type` with the given values and every other key at its default (code and
// tests; configs are read by load_config). std::logic_error on an unknown type or key or a
// required key left out.
LayerConfig make_layer_config(const std::string& type,
                              const std::vector<std::pair<std::string, LayerValue>>& values = {});

// "16", "same", "true", "0.3": a value as the model hash spells it.
std::string describe_value(const LayerValue& value);

}  // namespace ht
