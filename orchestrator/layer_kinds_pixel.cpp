// The built-in kinds that are not windowed (SPEC sections 4, 7 and 11): batch norm and
// the other normalisations, activations, dropout, joins, global pools, flatten, dense and
// channel permutations; keys, names, traits, shapes, weights, flops. Their kernels are in
// worker/layers/layers.cpp and worker/layers/pixel_layers.cpp.
#include <fmt/format.h>

#include <string>

#include "kernels/activation.hpp"
#include "orchestrator/layer_kinds.hpp"

namespace ht::kinds {

namespace {

LayerKind batch_norm() {
  LayerKind k{"batch_norm", "BatchNormalization", "batch_normalization", {}, {}, {}};
  // center / scale false: no beta / gamma (Keras's BatchNormalization(center=False, ...)).
  k.keys = {with_default("momentum", KeyType::Unit, 0.99), with_default("epsilon", KeyType::Positive, 1e-3),
            with_default("center", KeyType::Bool, true), with_default("scale", KeyType::Bool, true)};
  // Not in the model hash: momentum and epsilon may change on resume (as before layer
  // kinds), and a change of center or scale changes the weights, which loading refuses.
  for (LayerKey& key : k.keys) key.in_model_hash = false;
  // On a channel vector (ASPP's pooling branch) its statistics are over the batch alone.
  k.shape = [](LayerSpec& l) {
    const int64_t c = l.in.c;
    l.out = l.in;
    if (l.config.flag("scale")) l.weights.push_back({"gamma:0", {c}, true, WeightLayout::Keras, WeightInit::Ones});
    if (l.config.flag("center")) l.weights.push_back({"beta:0", {c}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.weights.push_back({"moving_mean:0", {c}, false, WeightLayout::Keras, WeightInit::Zeros});
    l.weights.push_back({"moving_variance:0", {c}, false, WeightLayout::Keras, WeightInit::Ones});
    l.flops_per_image = 8 * l.in.elements();
  };
  k.traits.backward_in_place = true;
  k.traits.backward_reads_output = false;
  return k;
}

// Element-wise, shape-preserving: relu and the activations (worker/layers/layers.cpp's
// ActivationLayer), dropout, drop_path.
LayerKind elementwise(const char* type, const char* keras_class, const char* keras_prefix) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.shape = [](LayerSpec& l) {
    l.out = l.in;
    l.flops_per_image = l.in.elements();
  };
  return k;
}

// relu and the activations of worker/layers/layers.cpp's ActivationLayer: dx from x, y
// and dy element by element.
LayerKind activation(const char* type, const char* keras_class = "Activation", const char* keras_prefix = "activation") {
  LayerKind k = elementwise(type, keras_class, keras_prefix);
  k.traits.backward_in_place = true;
  return k;
}

// An activation's backward reads what kernels/activation.hpp's gradient of f reads.
LayerKind reading_as(LayerKind k, Activation f) {
  const ActivationReads reads = gradient_reads(f);
  k.traits.backward_reads_inputs = reads.input;
  k.traits.backward_reads_output = reads.output;
  return k;
}

LayerKind leaky_relu() {
  LayerKind k = activation("leaky_relu", "LeakyReLU", "leaky_re_lu");
  k.keys = {with_default("alpha", KeyType::NonNegative, 0.3)};
  return k;
}

LayerKind dropout() {
  LayerKind k = elementwise("dropout", "Dropout", "dropout");
  k.keys = {{"rate", KeyType::Unit, std::nullopt, "", 1, {}}};
  k.traits.backward_in_place = true;
  k.traits.backward_reads_inputs = false;  // the mask is made again from the step's position
  k.traits.backward_reads_output = false;
  return k;
}

LayerKind global_pool(const char* type, const char* keras_class, const char* keras_prefix) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.traits.input = LayerInput::FeatureMap;
  k.traits.global_pool = true;
  // The maximum's backward finds the maxima in its input again; the mean's reads shapes only.
  k.traits.backward_reads_inputs = std::string(type) != "global_avg_pool";
  k.traits.backward_reads_output = false;
  k.shape = [](LayerSpec& l) {
    if (!l.spatial)
      throw LayerShapeError("needs a feature map input, but it reads a per-image channel vector (the output of a "
                            "global pool or a layer after it)");
    l.out = {l.in.c, 1, 1};
    l.out_spatial = false;
    l.flops_per_image = l.in.elements();
  };
  return k;
}

LayerKind dense() {
  LayerKind k{"dense", "Dense", "dense", {}, {}, {}};
  k.keys = {required_int("units"), with_default("bias", KeyType::Bool, true)};
  k.traits.input = LayerInput::Vector;
  k.shape = [](LayerSpec& l) {
    const LayerConfig& c = l.config;
    if (l.spatial)
      throw LayerShapeError(
          fmt::format("dense needs a vector input; put a global_avg_pool or a flatten before it (found a {}x{}x{} "
                      "feature map)",
                      l.in.h, l.in.w, l.in.c));
    const int units = c.integer("units");
    l.out = {units, 1, 1};
    l.weights.push_back({"kernel:0", {l.in.c, units}, true, WeightLayout::Keras, WeightInit::GlorotUniform});
    if (c.flag("bias")) l.weights.push_back({"bias:0", {units}, true, WeightLayout::Keras, WeightInit::Zeros});
    l.flops_per_image = 2ll * l.in.c * units;
  };
  k.traits.backward_reads_output = false;  // dy and the input
  return k;
}

std::string describe_shape(const Shape3& s) { return fmt::format("{}x{}x{}", s.h, s.w, s.c); }

// Joins (SPEC section 7): several inputs, at least two, named by `inputs`.
LayerKind join(const char* type, const char* keras_class, const char* keras_prefix) {
  LayerKind k{type, keras_class, keras_prefix, {}, {}, {}};
  k.traits.min_inputs = 2;
  k.traits.max_inputs = 0;
  return k;
}

// The first input whose shape differs from the first's along what must agree.
template <class Agree>
void require_agreeing(const LayerSpec& l, const char* what, Agree agree) {
  for (size_t k = 1; k < l.ins.size(); ++k)
    if (!agree(l.ins[0], l.ins[k]))
      throw LayerShapeError(fmt::format("{}: input '{}' is {} but input '{}' is {} (H x W x C)", what,
                                        l.config.inputs[0], describe_shape(l.ins[0]), l.config.inputs[k],
                                        describe_shape(l.ins[k])));
}

LayerKind add() {
  LayerKind k = join("add", "Add", "add");
  k.shape = [](LayerSpec& l) {
    require_agreeing(l, "add needs inputs of one shape", [](const Shape3& a, const Shape3& b) { return a == b; });
    l.out = l.in;
    l.flops_per_image = int64_t(l.ins.size() - 1) * l.in.elements();
  };
  k.traits.backward_reads_inputs = false;
  k.traits.backward_reads_output = false;
  return k;
}

LayerKind concatenate() {
  LayerKind k = join("concatenate", "Concatenate", "concatenate");
  k.shape = [](LayerSpec& l) {
    require_agreeing(l, "concatenate joins channels of maps of one size",
                     [](const Shape3& a, const Shape3& b) { return a.h == b.h && a.w == b.w; });
    l.out = l.in;
    for (size_t i = 1; i < l.ins.size(); ++i) l.out.c += l.ins[i].c;
  };
  k.traits.backward_reads_inputs = false;  // the output gradient cut into blocks
  k.traits.backward_reads_output = false;
  return k;
}


LayerKind clip(const char* type, bool bounds) {
  LayerKind k = activation(type, bounds ? "Activation" : "ReLU", bounds ? "activation" : "re_lu");
  if (bounds) {
    LayerKey lo = with_default("min", KeyType::Real, 0.0), hi = with_default("max", KeyType::Real, 6.0);
    k.keys = {lo, hi};
    k.shape = [](LayerSpec& l) {
      if (l.config.number("min") > l.config.number("max"))
        throw LayerShapeError(fmt::format("clip min {} is above its max {}", l.config.number("min"),
                                          l.config.number("max")));
      l.out = l.in;
      l.flops_per_image = l.in.elements();
    };
  }
  return k;
}

LayerKind hard_sigmoid() {
  LayerKind k = activation("hard_sigmoid");
  k.keys = {with_default("alpha", KeyType::Real, 0.2), with_default("beta", KeyType::Real, 0.5)};
  return k;
}

LayerKind gelu() {
  LayerKind k = activation("gelu");
  k.keys = {choice_key("approximate", {"none", "tanh"})};
  return k;
}

// drop_path (stochastic depth): each image dropped whole with probability `rate` while
// training, else scaled by 1 / (1 - rate).
LayerKind drop_path() {
  LayerKind k = elementwise("drop_path", "Dropout", "drop_path");
  k.keys = {{"rate", KeyType::Unit, std::nullopt, "", 1, {}}};
  k.traits.backward_in_place = true;
  return k;
}

// multiply (SPEC section 11): elementwise product of two tensors of one shape, or of a
// feature map and a per-image channel vector standing for its value at every pixel.
LayerKind multiply() {
  LayerKind k = join("multiply", "Multiply", "multiply");
  k.traits.max_inputs = 2;
  k.traits.broadcasts_vectors = true;
  k.traits.backward_reads_output = false;  // each input's gradient is dy times the other input
  k.shape = [](LayerSpec& l) {
    const size_t map = l.ins_spatial[0] ? 0 : 1, other = 1 - map;
    const bool broadcast = l.ins_spatial[0] != l.ins_spatial[1];
    if (broadcast ? l.ins[0].c != l.ins[1].c : !(l.ins[0] == l.ins[1]))
      throw LayerShapeError(fmt::format(
          "multiply needs inputs of one shape, or a feature map and a channel vector of its channels: input '{}' "
          "is {} ({}) but input '{}' is {} ({})",
          l.config.inputs[0], describe_shape(l.ins[0]), l.ins_spatial[0] ? "a feature map" : "a channel vector",
          l.config.inputs[1], describe_shape(l.ins[1]), l.ins_spatial[1] ? "a feature map" : "a channel vector"));
    l.out = l.ins[map];
    l.out_spatial = l.ins_spatial[map] || l.ins_spatial[other];
    l.flops_per_image = l.out.elements();
  };
  return k;
}

// Normalisations with a per-channel gamma and beta (center / scale false: none).
void affine_weights(LayerSpec& l) {
  const int64_t c = l.in.c;
  if (l.config.flag("scale")) l.weights.push_back({"gamma:0", {c}, true, WeightLayout::Keras, WeightInit::Ones});
  if (l.config.flag("center")) l.weights.push_back({"beta:0", {c}, true, WeightLayout::Keras, WeightInit::Zeros});
}

// layer_norm (SPEC section 11): over the channels of each pixel (ConvNeXt's LayerNorm2d,
// Keras's LayerNormalization(axis=-1)), biased variance, epsilon inside the square root.
LayerKind layer_norm() {
  LayerKind k{"layer_norm", "LayerNormalization", "layer_normalization", {}, {}, {}};
  k.keys = {with_default("epsilon", KeyType::Positive, 1e-6), with_default("center", KeyType::Bool, true),
            with_default("scale", KeyType::Bool, true)};
  k.shape = [](LayerSpec& l) {
    l.out = l.in;
    affine_weights(l);
    l.flops_per_image = 8 * l.in.elements();
  };
  return k;
}

// instance_norm and group_norm (SPEC section 11): statistics per image and per channel (or
// group of channels) over the whole image, across shards; no moving statistics.
LayerKind image_norm(bool grouped) {
  LayerKind k{grouped ? "group_norm" : "instance_norm", grouped ? "GroupNormalization" : "InstanceNormalization",
              grouped ? "group_normalization" : "instance_normalization", {}, {}, {}};
  if (grouped) k.keys.push_back(required_int("groups"));
  for (LayerKey key : {with_default("epsilon", KeyType::Positive, 1e-5), with_default("center", KeyType::Bool, true),
                       with_default("scale", KeyType::Bool, true)})
    k.keys.push_back(key);
  k.traits.input = LayerInput::FeatureMap;
  k.traits.backward_in_place = true;
  k.shape = [grouped](LayerSpec& l) {
    require_feature_map(l);
    if (grouped && l.in.c % l.config.integer("groups") != 0)
      throw LayerShapeError(fmt::format("groups {} must divide its {} channels", l.config.integer("groups"), l.in.c));
    l.out = l.in;
    affine_weights(l);
    l.flops_per_image = 8 * l.in.elements();
  };
  return k;
}

// scale (SPEC section 11): x * gamma[c] (ConvNeXt's layer scale).
LayerKind scale() {
  LayerKind k{"scale", "Scale", "scale", {}, {}, {}};
  k.shape = [](LayerSpec& l) {
    l.out = l.in;
    l.weights.push_back({"gamma:0", {l.in.c}, true, WeightLayout::Keras, WeightInit::Ones});
    l.flops_per_image = l.in.elements();
  };
  return k;
}

// flatten (SPEC section 11): a small feature map gathered to every shard, as a channel
// vector in Keras's (h, w, c) order (VGG's 7x7 before its dense layers).
LayerKind flatten() {
  LayerKind k{"flatten", "Flatten", "flatten", {}, {}, {}};
  k.traits.input = LayerInput::FeatureMap;
  k.shape = [](LayerSpec& l) {
    require_feature_map(l);
    if (l.in.elements() > kMaxExtent)
      throw LayerShapeError(fmt::format("flattens a {} map into {} features; at most {} fit one vector",
                                        describe_shape(l.in), l.in.elements(), kMaxExtent));
    l.out = {int(l.in.elements()), 1, 1};
    l.out_spatial = false;
  };
  return k;
}

// channel_shuffle (ShuffleNet): groups g of C/g channels interleaved, output channel
// j * g + i is input channel i * C/g + j (torch's view-transpose-view).
LayerKind channel_shuffle() {
  LayerKind k{"channel_shuffle", "ChannelShuffle", "channel_shuffle", {}, {}, {}};
  k.keys = {required_int("groups")};
  k.shape = [](LayerSpec& l) {
    if (l.in.c % l.config.integer("groups") != 0)
      throw LayerShapeError(fmt::format("groups {} must divide its {} channels", l.config.integer("groups"), l.in.c));
    l.out = l.in;
  };
  return k;
}

// channel_slice: channels [start, start + channels) of its input (a channel Split).
LayerKind channel_slice() {
  LayerKind k{"channel_slice", "ChannelSlice", "channel_slice", {}, {}, {}};
  LayerKey start = with_default("start", KeyType::Int, int64_t(0));
  start.min = 0;
  k.keys = {start, required_int("channels")};
  k.shape = [](LayerSpec& l) {
    const int64_t first = l.config.integer("start"), count = l.config.integer("channels");
    if (first + count > l.in.c)
      throw LayerShapeError(fmt::format("channels [{}, {}) are not all among its {} input channels", first,
                                        first + count, l.in.c));
    l.out = {int(count), l.in.h, l.in.w};
  };
  return k;
}

}  // namespace

std::vector<LayerKind> pixel_kinds() {
  std::vector<LayerKind> kinds;
  kinds.push_back(batch_norm());
  LayerKind relu = activation("relu");
  relu.traits.backward_reads_inputs = false;  // its output decides its gradient
  kinds.push_back(relu);
  kinds.push_back(global_pool("global_avg_pool", "GlobalAveragePooling2D", "global_average_pooling2d"));
  kinds.push_back(dense());
  kinds.push_back(reading_as(leaky_relu(), Activation::LeakyReLU));
  kinds.push_back(reading_as(activation("sigmoid"), Activation::Sigmoid));
  kinds.push_back(reading_as(activation("tanh"), Activation::Tanh));
  kinds.push_back(global_pool("global_max_pool", "GlobalMaxPooling2D", "global_max_pooling2d"));
  kinds.push_back(dropout());
  kinds.push_back(add());
  kinds.push_back(concatenate());
  // SPEC section 11.
  kinds.push_back(reading_as(clip("relu6", false), Activation::ReLU6));
  kinds.push_back(reading_as(clip("clip", true), Activation::Clip));
  kinds.push_back(reading_as(activation("silu"), Activation::SiLU));
  kinds.push_back(reading_as(hard_sigmoid(), Activation::HardSigmoid));
  kinds.push_back(reading_as(activation("hard_swish"), Activation::HardSwish));
  static_assert(gradient_reads(Activation::GELU).input == gradient_reads(Activation::GELUTanh).input &&
                    gradient_reads(Activation::GELU).output == gradient_reads(Activation::GELUTanh).output,
                "gelu's two forms read the same");
  kinds.push_back(reading_as(gelu(), Activation::GELU));
  kinds.push_back(multiply());
  kinds.push_back(layer_norm());
  kinds.push_back(scale());
  kinds.push_back(drop_path());
  kinds.push_back(flatten());
  kinds.push_back(channel_shuffle());
  kinds.push_back(channel_slice());
  kinds.push_back(image_norm(false));
  kinds.push_back(image_norm(true));
  return kinds;
}

}  // namespace ht::kinds
