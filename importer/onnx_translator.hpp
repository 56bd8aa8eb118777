// The ONNX reader's parts (onnx_import.cpp: the graph, values and the op table;
// onnx_constants.cpp: constant folding; onnx_ops.cpp: the ops; onnx_patterns.cpp: the
// subgraphs exporters write for one layer). Internal to the importer.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "importer/keras_import.hpp"
#include "orchestrator/model_spec.hpp"

namespace ht::onnx_import {

// A tensor whose values the file fixes: an initializer, a Constant node, or what ops on
// such tensors and on the static shapes of feature maps compute. Doubles hold int64 shapes
// exactly up to 2^53.
struct Constant {
  std::vector<int64_t> dims;
  std::vector<double> values;
  bool integral = false;  // an integer or bool type: Div truncates, as ONNX's integer Div
};

// How a non-constant tensor lays out the halotrain tensor that holds it.
enum class Layout {
  NCHW,    // a feature map [N, C, H, W], as halotrain holds it
  NHWC,    // the same map transposed to [N, H, W, C] (ConvNeXt's channels-last blocks)
  Vector,  // a per-image channel vector, [N, C] or [N, C, 1, 1]
};

struct Value {
  std::string layer;           // the halotrain tensor: "input" or a layer's name
  std::vector<int64_t> dims;   // its ONNX shape
  Layout layout = Layout::NCHW;
  // A flattened map whose features halotrain holds in Keras's (h, w, c) order while ONNX's
  // are (c, h, w): the dense layer that reads it permutes its rows.
  Shape3 flattened{};
};

// A subgraph an exporter writes for one layer (onnx_patterns.cpp): the node that makes
// its result (`root`), the nodes it absorbs, the value it reads and what it computes.
struct Fused {
  std::string type;  // the halotrain layer kind: "silu", "gelu", "layer_norm", ...
  std::string source;  // the ONNX tensor it reads
  std::vector<std::pair<std::string, LayerValue>> keys;
  std::vector<std::string> gamma_beta;  // layer_norm / group_norm: constant tensors ("" where none)
  std::set<int> absorbed;
};

// The subgraphs of `graph`, by the index of their root node.
std::map<int, Fused> find_patterns(const onnx::GraphProto& graph, const std::map<std::string, Constant>& constants);

// A tensor's values from raw_data or the typed fields, checked against its dims; throws
// ConfigError naming the tensor.
Constant constant_of(const onnx::TensorProto& t, const std::string& source);

class Translator {
 public:
  Translator(std::string source, const ImportOptions& options);
  ImportedModel run(const onnx::ModelProto& model);

  // --- for the op handlers (onnx_ops.cpp) ----------------------------------------------
  [[noreturn]] void fail(const std::string& why) const;
  [[noreturn]] void unsupported(const onnx::NodeProto& n, const std::string& what) const;
  const onnx::AttributeProto* attr(const onnx::NodeProto& n, const std::string& name) const;
  std::vector<int64_t> ints(const onnx::NodeProto& n, const std::string& name, std::vector<int64_t> def = {}) const;
  int64_t integer(const onnx::NodeProto& n, const std::string& name, int64_t def) const;
  double real(const onnx::NodeProto& n, const std::string& name, float def) const;
  std::string text(const onnx::NodeProto& n, const std::string& name, const std::string& def) const;

  bool is_constant(const std::string& name) const { return constants_.count(name) > 0; }
  bool has_input(const onnx::NodeProto& n, int i) const { return i < n.input_size() && !n.input(i).empty(); }
  const Constant& constant(const onnx::NodeProto& n, int input) const;
  const Value& value(const std::string& name) const;
  const Value& value_in(const onnx::NodeProto& n, int input) const;
  // Inputs that are not constants, in order.
  std::vector<const Value*> values_in(const onnx::NodeProto& n) const;
  void bind(const std::string& onnx_name, Value v) { values_[onnx_name] = std::move(v); }
  void bind_constant(const std::string& onnx_name, Constant c) { constants_[onnx_name] = std::move(c); }

  struct Weight {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  // Appends a halotrain layer of `type` for node `n` reading `inputs` and returns its
  // output's Value (an NCHW map or a vector, as its kind makes it); `weights` in Keras
  // layout. A shape the layer refuses is a refusal of the node.
  Value add_layer(const onnx::NodeProto& n, const std::string& type,
                  const std::vector<std::pair<std::string, LayerValue>>& keys, const std::vector<const Value*>& inputs,
                  const std::vector<Weight>& weights = {});
  // The weights of the layer holding `v`, to add a bias into (a MatMul's Add).
  ImportedWeights* weights_of(const Value& v);
  Shape3 shape_of(const Value& v) const;
  bool is_map(const Value& v) const { return shapes_.at(v.layer).second; }  // a feature map, not a channel vector
  bool final_node(const onnx::NodeProto& n) const;
  Value fold(LossType loss, const onnx::NodeProto& n, const Value& from);
  void note(const std::string& text) { out_.notes.push_back(text); }
  // How many nodes read ONNX tensor `name`.
  int readers(const std::string& name) const {
    auto it = readers_.find(name);
    return it == readers_.end() ? 0 : it->second;
  }
  // Layers made from a MatMul or Gemm, whose bias a following Add may hold.
  void note_matmul(const std::string& layer) { matmuls_.insert(layer); }
  bool from_matmul(const std::string& layer) const { return matmuls_.count(layer) > 0; }
  int64_t batch() const { return batch_; }
  int opset() const { return opset_; }

 private:
  void input(const onnx::ValueInfoProto& in);
  void translate(const onnx::NodeProto& n, int index);
  void translate_fused(const onnx::NodeProto& n, const Fused& f);
  bool fold_constants(const onnx::NodeProto& n);  // onnx_constants.cpp
  std::string name_for(const onnx::NodeProto& n);
  void default_loss();

  ImportedModel out_;
  std::map<std::string, Constant> constants_;
  std::map<std::string, Value> values_;  // ONNX tensor -> where halotrain holds it
  std::map<std::string, std::pair<Shape3, bool>> shapes_;  // halotrain tensor -> its shape, whether a map
  std::set<std::string> taken_, matmuls_;
  std::map<std::string, int> readers_;
  const ImportOptions& options_;
  std::map<int, Fused> patterns_;
  std::string output_;
  int index_ = 0;  // the node being translated
  int64_t batch_ = 1;
  int opset_ = 13;
  bool has_input_ = false, loss_set_ = false;
};

// The handler of each op halotrain reads (onnx_ops.cpp); null for an unknown op.
using OpHandler = void (*)(Translator& t, const onnx::NodeProto& n);
OpHandler op_handler(const std::string& op);
// What the handlers read, for the refusal message.
const std::vector<std::string>& supported_ops();

}  // namespace ht::onnx_import
