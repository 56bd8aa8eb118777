// `halotrain import` (SPEC section 9): a Keras 2 model, from a `model.save()` file (its
// `model_config` attribute, weights under `model_weights`) or a `model.to_json()` file, as
// a halotrain model section and a Keras-format init weights file.
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "orchestrator/config.hpp"

namespace ht {

// One halotrain layer's weights, in Keras layout and order ("kernel:0" (kh, kw, cin, cout)).
struct ImportedWeights {
  std::string layer;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
};

struct ImportedModel {
  std::string source;  // the file read
  std::string name;    // the Keras model's name
  ModelConfig model;   // input, layers (Keras names kept; inputs where the graph branches), loss
  // Per halotrain layer with weights: the Keras layer whose weights it takes (its own name).
  std::vector<std::string> weighted_layers;
  // Keras layer names halotrain cannot keep ('/' is an HDF5 group separator: DenseNet's
  // "conv1/conv"), by the halotrain name that stands for them.
  std::map<std::string, std::string> keras_names;
  std::vector<std::string> notes;  // what the import folded or changed, for the user
  bool has_weights = false;        // a model.save() file (weights under model_weights), or ONNX initializers
  std::vector<ImportedWeights> weights;  // ONNX: converted at import; Keras: read by write_imported_weights
};

// What `halotrain import` is told beside the model file.
struct ImportOptions {
  // --input-size H,W: the image size of a model whose input leaves it open (0: none given).
  int input_height = 0, input_width = 0;
  // --channels N: the image's channels, the first conv2d's kernel converted (0: as the model).
  int channels = 0;
};

// Reads a Keras JSON model (model.to_json(), or a model.save() file's model_config;
// importer/keras_layers.cpp). ConfigError naming `source`, the layer, its class and the
// attribute for anything halotrain cannot express, with the supported classes listed.
ImportedModel import_keras_json(const std::string& json_text, const std::string& source,
                                const ImportOptions& options = {});

// A .json file, or an HDF5 model.save() file (its model_config attribute and weights).
ImportedModel import_keras_file(const std::string& path, const ImportOptions& options = {});

// An ONNX file (importer/onnx_import.cpp): nodes as halotrain layers, node names sanitised
// and kept where unique, initializers as Keras-layout weights.
ImportedModel import_onnx_file(const std::string& path, const ImportOptions& options = {});

// For the readers: a layer of `type` named `name`, and its appending to `model` reading
// `inputs` (halotrain names; `inputs` is written only where it is not the layer before).
// Returns the appended layer's name.
LayerConfig imported_layer(const std::string& type, const std::string& name,
                           const std::vector<std::pair<std::string, LayerValue>>& values = {});
std::string append_layer(ModelConfig& model, LayerConfig layer, const std::vector<std::string>& inputs);

// The check every import ends with: the model spec builds (shapes work). ConfigError
// naming `m.source`.
void check_imported(const ImportedModel& m);

// The config text: the model section is the imported model; data (synthetic data of the
// model's input size, to replace), training and parallel are defaults to edit.
// `init_weights` (may be empty) becomes training.init_weights. Checked by parsing it back
// and building the model spec, so `halotrain plan` works on it at once.
std::string imported_config_yaml(const ImportedModel& model, const std::string& init_weights);

// --channels N (SPEC section 14): the model takes images of `channels` channels; the first
// conv2d (reached from the image through padding or cropping only, groups 1) has its kernel
// summed over its input channels for 1 (as timm adapts a pretrained RGB stem), repeated and
// scaled by cin / N otherwise. ConfigError naming the layer that stands in the way.
void set_input_channels(ImportedModel& model, int channels);

// The model's weights (its `weights`, or those of its model.save() file) as a Keras weights
// file that training.init_weights reads (written to a temporary file, then renamed).
void write_imported_weights(const ImportedModel& model, const std::string& path);

// The command: reads a .onnx file as ONNX and anything else as Keras; writes `config_path`
// (default: MODEL's stem + ".yaml") and, when the model file holds weights, `weights_path`
// (default: stem + "-init.h5"); reports to `out`.
int run_import(const std::string& model_path, std::string config_path, std::string weights_path,
               const ImportOptions& options, std::ostream& out);

}  // namespace ht
