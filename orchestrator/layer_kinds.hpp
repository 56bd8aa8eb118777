// What the built-in kind descriptions share (layer_kinds.cpp: the windowed kinds;
// layer_kinds_pixel.cpp: pointwise, normalising, joining and vector kinds). Internal to
// the orchestrator: everything else reads kinds through layer_kind.hpp.
#pragma once

#include <vector>

#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"

namespace ht {

// Window geometry for the window kinds (make_window along both axes) from the layer's
// `kernel_key` ([h, w]), `stride` and `padding` keys; throws LayerShapeError when the window
// does not fit the input.
void set_windows(LayerSpec& layer, const LayerConfig& config, const char* kernel_key, int dilation_h, int dilation_w,
                 bool ceil_mode = false);

}  // namespace ht

namespace ht::kinds {

LayerKey required_int(const char* name);
LayerKey with_default(const char* name, KeyType type, LayerValue def);
// A key added to a kind after checkpoints of it existed: hashed only away from its default.
LayerKey added_key(const char* name, KeyType type, LayerValue def);
LayerKey choice_key(const char* name, std::vector<std::string> choices);  // the first is the default

// Throws LayerShapeError unless the layer's first input is a feature map.
void require_feature_map(const LayerSpec& l);

// Families, in the order their kinds were added.
std::vector<LayerKind> window_kinds();  // conv2d, pools, upsampling, padding, resize, ...
std::vector<LayerKind> pixel_kinds();   // batch_norm, activations, joins, dense, norms, ...

}  // namespace ht::kinds
