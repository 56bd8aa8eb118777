#include "importer/keras_import.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "orchestrator/config_io.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/keras_h5.hpp"

namespace ht {

namespace {

using json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot read the model file", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_hdf5(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == std::string("\x89HDF\r\n\x1a\n", 8);
}

std::string stem(const std::string& path) {
  const std::filesystem::path p(path);
  return (p.parent_path() / p.stem()).string();
}

// The imported model as a Config, built and checked as `plan` would.
Config imported_config(const ImportedModel& m, const std::string& init_weights) {
  Config c;
  c.name = m.name.empty() ? "imported" : m.name;
  c.run_dir = "runs/" + c.name;
  c.source_path = m.source;
  c.model = m.model;
  c.data.train = "data/" + c.name + ".h5";
  // Per-pixel outputs train on masks (or class maps), classifiers on labels.
  const ModelSpec spec = build_model_spec(c);
  const bool masks = spec.spatial_output();
  c.data.targets = masks ? "masks" : "labels";
  SynthesizeConfig s;
  s.count = 8;
  s.height = m.model.height;
  s.width = m.model.width;
  s.channels = m.model.channels;
  s.masks = masks;
  s.classes = masks ? 2 : std::max(spec.output().c, 2);
  c.data.synthesize = s;
  c.training.steps = 100;
  c.training.init_weights = init_weights;
  c.parallel.grid_auto = true;
  return c;
}

}  // namespace

LayerConfig imported_layer(const std::string& type, const std::string& name,
                           const std::vector<std::pair<std::string, LayerValue>>& values) {
  LayerConfig c = make_layer_config(type, values);
  c.name = name;
  return c;
}

std::string append_layer(ModelConfig& model, LayerConfig layer, const std::vector<std::string>& inputs) {
  const std::string before = model.layers.empty() ? kInputName : model.layers.back().name;
  if (inputs != std::vector<std::string>{before}) layer.inputs = inputs;
  model.layers.push_back(std::move(layer));
  return model.layers.back().name;
}

void check_imported(const ImportedModel& m) {
  try {
    build_model_spec(imported_config(m, ""));
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: imported, the model does not work in halotrain: {}", m.source, e.what()));
  }
}

ImportedModel import_keras_file(const std::string& path, const ImportOptions& options) {
  if (!is_hdf5(path)) return import_keras_json(read_text(path), path, options);
  h5::quiet();
  std::string text;
  try {
    h5::Hid f = h5::open_file(path);
    if (!h5::has_attr(f, "model_config"))
      throw ConfigError(fmt::format("{}: an HDF5 file without a model_config attribute; expected a Keras "
                                    "model.save() file (a weights-only file holds no model)",
                                    path));
    text = h5::read_attr_string(f, "model_config");
  } catch (const h5::H5Error& e) {
    throw ConfigError(fmt::format("{}: cannot read it as a Keras model file: {}", path, e.reason()));
  }
  ImportedModel m = import_keras_json(text, path, options);
  m.has_weights = KerasWeightsFile(path).is_model_file();
  return m;
}

std::string imported_config_yaml(const ImportedModel& m, const std::string& init_weights) {
  const Config c = imported_config(m, init_weights);
  std::string head = fmt::format(
      "# Imported from {} by `halotrain import`: {} halotrain layers, Keras names kept.\n", m.source,
      m.model.layers.size());
  for (const std::string& n : m.notes) head += "# Note: " + n + ".\n";
  head +=
      "# The model section is the imported model. data (synthetic images of the model's input\n"
      "# size: replace data.train and data.targets with your file and remove data.synthesize),\n"
      "# training and parallel are defaults to edit; `halotrain plan` checks the result.\n";
  const std::string text = head + to_yaml(c);
  // What is written must read back and plan.
  build_model_spec(parse_config(text, m.source + " (imported config)"));
  return text;
}

namespace {

// The weights of a model.save() file's model_weights, for the model's weighted layers, in
// the shapes of the layers that hold them (a Dense on a map is a 1x1 conv).
std::vector<ImportedWeights> keras_file_weights(const ImportedModel& m) {
  const KerasWeightsFile in(m.source);
  const std::vector<std::string>& stored = in.layer_names();
  const ModelSpec spec = build_model_spec(imported_config(m, ""));
  std::vector<ImportedWeights> out;
  for (const std::string& ours_name : m.weighted_layers) {
    auto renamed = m.keras_names.find(ours_name);
    const std::string& name = renamed == m.keras_names.end() ? ours_name : renamed->second;
    if (std::find(stored.begin(), stored.end(), name) == stored.end())
      throw ConfigError(fmt::format("{}: the model_weights hold no weights of layer '{}'", m.source, name));
    ImportedWeights w;
    w.layer = ours_name;
    const LayerSpec* ours = nullptr;
    for (const LayerSpec& l : spec.layers)
      if (l.config.name == ours_name) ours = &l;
    for (const std::string& stored_name : in.weight_names(name)) {
      const size_t k = w.names.size();
      w.names.push_back(stored_name.substr(stored_name.rfind('/') + 1));
      w.shapes.push_back(in.shape(name, stored_name));
      w.values.emplace_back(size_t(h5::element_count(w.shapes.back())));
      in.read(name, stored_name, w.values.back().data());
      if (ours && k < ours->weights.size() && ours->weights[k].elements() == h5::element_count(w.shapes.back()))
        w.shapes.back() = ours->weights[k].keras_shape;
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

void set_input_channels(ImportedModel& m, int channels) {
  if (channels == m.model.channels) return;
  const std::vector<LayerConfig>& layers = m.model.layers;
  // The layer that reads tensor `name`, through padding and cropping, must be one conv2d.
  auto readers_of = [&](const std::string& name) {
    std::vector<size_t> out;
    for (size_t j = 0; j < layers.size(); ++j) {
      const std::vector<std::string>& in = layers[j].inputs;
      const std::string& before = j == 0 ? std::string("input") : layers[j - 1].name;
      if (in.empty() ? before == name : std::find(in.begin(), in.end(), name) != in.end()) out.push_back(j);
    }
    return out;
  };
  const std::string fail = fmt::format("{}: --channels {}: halotrain changes the channels of a first conv2d (groups "
                                       "1) that reads the image, through padding or cropping only; ",
                                       m.source, channels);
  std::string name = "input";
  const LayerConfig* conv = nullptr;
  while (!conv) {
    const std::vector<size_t> readers = readers_of(name);
    if (readers.size() != 1)
      throw ConfigError(fail + fmt::format("'{}' is read by {} layers", name, readers.size()));
    const LayerConfig& l = layers[readers[0]];
    if (l.type() == "conv2d" && l.integer("groups") == 1)
      conv = &l;
    else if (l.type() == "zero_padding2d" || l.type() == "cropping2d")
      name = l.name;
    else
      throw ConfigError(fail + fmt::format("'{}' reads it, a {}", l.name, l.type()));
  }
  const int from = m.model.channels;
  if (m.has_weights) {
    if (m.weights.empty()) m.weights = keras_file_weights(m);
    for (ImportedWeights& w : m.weights) {
      if (w.layer != conv->name) continue;
      // The kernel, Keras layout (kh, kw, cin, cout): summed over cin for one channel (as timm
      // does), else cin's kernels repeated and scaled by cin / channels.
      const std::vector<int64_t>& shape = w.shapes.at(0);
      const int64_t taps = shape[0] * shape[1], cout = shape[3];
      const std::vector<float>& k = w.values[0];
      std::vector<float> out(size_t(taps * channels * cout), 0.f);
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t o = 0; o < cout; ++o) {
          if (channels == 1) {
            double sum = 0;
            for (int64_t c = 0; c < from; ++c) sum += k[size_t((t * from + c) * cout + o)];
            out[size_t(t * cout + o)] = float(sum);
          } else {
            for (int64_t c = 0; c < channels; ++c)
              out[size_t((t * channels + c) * cout + o)] =
                  float(double(k[size_t((t * from + c % from) * cout + o)]) * from / channels);
          }
        }
      w.values[0] = std::move(out);
      w.shapes[0][2] = channels;
    }
  }
  m.model.channels = channels;
  m.notes.push_back(fmt::format("--channels {}: the image has {} channel{}; conv2d '{}' takes them{}", channels,
                                channels, channels == 1 ? "" : "s", conv->name,
                                !m.has_weights ? ""
                                : channels == 1
                                    ? fmt::format(", its kernel summed over its {} input channels", from)
                                    : fmt::format(", its kernel's {} input channels repeated and scaled by {}/{}",
                                                  from, from, channels)));
}

void write_imported_weights(const ImportedModel& m, const std::string& path) {
  const std::vector<ImportedWeights> weights = m.weights.empty() ? keras_file_weights(m) : m.weights;
  std::vector<std::string> names;
  for (const LayerConfig& l : m.model.layers) names.push_back(l.name);
  const std::string temp = h5::temp_path(path);
  try {
    {
      h5::Hid f = h5::create_file(temp);
      h5::write_attr_strings(f, "layer_names", names);
      h5::write_attr_string(f, "backend", "tensorflow");
      h5::write_attr_string(f, "keras_version", "2.1.6");
      for (const std::string& name : names) {
        h5::Hid g = h5::create_group(f, name);
        std::vector<std::string> weight_names;
        for (const ImportedWeights& w : weights) {
          if (w.layer != name) continue;
          for (size_t i = 0; i < w.names.size(); ++i) {
            h5::write_dataset(g, name + "/" + w.names[i], w.shapes[i], w.values[i].data());
            weight_names.push_back(name + "/" + w.names[i]);
          }
        }
        h5::write_attr_strings(g, "weight_names", weight_names);
      }
    }
    h5::commit_file(temp, path);
  } catch (const h5::H5Error& e) {
    std::remove(temp.c_str());
    throw ConfigError(fmt::format("{}: writing the weights failed: {}", path, e.reason()));
  } catch (...) {
    std::remove(temp.c_str());
    throw;
  }
}

int run_import(const std::string& model_path, std::string config_path, std::string weights_path,
               const ImportOptions& options, std::ostream& out) {
  const bool onnx = std::filesystem::path(model_path).extension() == ".onnx";
  ImportedModel m = onnx ? import_onnx_file(model_path, options) : import_keras_file(model_path, options);
  if (options.channels) set_input_channels(m, options.channels);
  if (config_path.empty()) config_path = stem(model_path) + ".yaml";
  if (m.has_weights && weights_path.empty()) weights_path = stem(model_path) + "-init.h5";
  if (!m.has_weights) weights_path.clear();
  const std::string text = imported_config_yaml(m, weights_path);
  if (!weights_path.empty()) write_imported_weights(m, weights_path);
  const std::string temp = config_path + ".tmp";
  {
    std::ofstream f(temp, std::ios::trunc);
    f << text;
    if (!f.flush()) throw ConfigError(fmt::format("{}: cannot write the config", config_path));
  }
  std::filesystem::rename(temp, config_path);
  out << fmt::format("imported {} ({} layers) into {}{}\n", model_path, m.model.layers.size(), config_path,
                     weights_path.empty() ? "" : " and its weights into " + weights_path);
  for (const std::string& n : m.notes) out << "note: " << n << "\n";
  return 0;
}

}  // namespace ht
