// The subgraphs exporters write for one layer, found before translation so that their
// inner nodes are never read on their own: SiLU (x * Sigmoid(x)), HardSwish before opset 14
// (x * HardSigmoid(x)), GELU in its erf and tanh forms, LayerNorm before opset 17 (its
// epsilon an Add constant), torch's GroupNorm (Reshape, InstanceNormalization, Reshape,
// Mul, Add) and ShuffleNet's channel shuffle (Reshape, Transpose, Reshape). Every inner node
// must feed only the next one, so nothing else reads what the layer replaces. Instance norm
// with running statistics is recognised to be refused by name.
#include <fmt/format.h>

#include <cmath>

#include "importer/onnx_translator.hpp"

namespace ht::onnx_import {

namespace {

class GraphIndex {
 public:
  GraphIndex(const onnx::GraphProto& g, const std::map<std::string, Constant>& initializers)
      : g_(g), constants_(initializers) {
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      for (const std::string& out : n.output()) producer_[out] = i;
      for (const std::string& in : n.input())
        if (!in.empty()) consumers_[in].push_back(i);
      if (n.op_type() == "Constant" && n.attribute_size() == 1 && n.attribute(0).has_t()) {
        try {
          constants_[n.output(0)] = constant_of(n.attribute(0).t(), "");
        } catch (const ConfigError&) {  // the translation says what is wrong with it
        }
      }
    }
  }
  const onnx::NodeProto& node(int i) const { return g_.node(i); }
  int size() const { return g_.node_size(); }
  // The one node reading tensor t, or -1.
  int only_reader(const std::string& t) const {
    auto it = consumers_.find(t);
    return it != consumers_.end() && it->second.size() == 1 ? it->second[0] : -1;
  }
  const std::vector<int>& readers(const std::string& t) const {
    static const std::vector<int> none;
    auto it = consumers_.find(t);
    return it == consumers_.end() ? none : it->second;
  }
  int producer(const std::string& t) const {
    auto it = producer_.find(t);
    return it == producer_.end() ? -1 : it->second;
  }
  const Constant* constant(const std::string& t) const {
    auto it = constants_.find(t);
    return it == constants_.end() ? nullptr : &it->second;
  }
  bool scalar(const std::string& t, double v, double tol = 1e-6) const {
    const Constant* c = constant(t);
    return c && c->values.size() == 1 && std::fabs(c->values[0] - v) <= tol * std::max(1.0, std::fabs(v));
  }
  // Node i is `op` with inputs {a, b} in either order; `other` gets the one that is not a.
  bool binary(int i, const char* op, const std::string& a, std::string* other = nullptr) const {
    if (i < 0 || node(i).op_type() != op || node(i).input_size() != 2) return false;
    const onnx::NodeProto& n = node(i);
    if (n.input(0) != a && n.input(1) != a) return false;
    if (other) *other = n.input(0) == a ? n.input(1) : n.input(0);
    return true;
  }
  // The one reader of node i's first output, when it is a binary `op` with it and a
  // constant scalar v.
  int next_with_scalar(int i, const char* op, double v) const {
    const int j = i < 0 ? -1 : only_reader(node(i).output(0));
    std::string k;
    return binary(j, op, node(i).output(0), &k) && scalar(k, v) ? j : -1;
  }

 private:
  const onnx::GraphProto& g_;
  std::map<std::string, Constant> constants_;
  std::map<std::string, int> producer_;
  std::map<std::string, std::vector<int>> consumers_;
};

using Found = std::map<int, Fused>;

// x * g(x), g = Sigmoid (SiLU) or HardSigmoid(1/6, 1/2) (HardSwish), g read only by the Mul.
void gated(const GraphIndex& gi, int i, Found& out) {
  const onnx::NodeProto& n = gi.node(i);
  const bool sigmoid = n.op_type() == "Sigmoid";
  if (!sigmoid && n.op_type() != "HardSigmoid") return;
  if (!sigmoid) {
    double alpha = 0.2, beta = 0.5;
    for (const auto& a : n.attribute()) {
      if (a.name() == "alpha") alpha = a.f();
      if (a.name() == "beta") beta = a.f();
    }
    if (std::fabs(alpha - 1.0 / 6) > 1e-6 || std::fabs(beta - 0.5) > 1e-6) return;
  }
  const std::string& x = n.input(0);
  const int mul = gi.only_reader(n.output(0));
  std::string other;
  if (!gi.binary(mul, "Mul", n.output(0), &other) || other != x) return;
  out[mul] = Fused{sigmoid ? "silu" : "hard_swish", x, {}, {}, {i}};
}

// GELU, erf form: 0.5 * (x * (Erf(x / sqrt(2)) + 1)).
void gelu_erf(const GraphIndex& gi, int i, Found& out) {
  if (gi.node(i).op_type() != "Erf") return;
  const int d = gi.producer(gi.node(i).input(0));
  if (d < 0) return;
  const onnx::NodeProto& dn = gi.node(d);
  std::string k;
  const bool div = dn.op_type() == "Div" && gi.scalar(dn.input(1), std::sqrt(2.0), 1e-5);
  const bool mul = gi.binary(d, "Mul", dn.input(0), &k) && gi.scalar(k, 1 / std::sqrt(2.0), 1e-5);
  if (!div && !mul) return;
  const std::string& x = dn.input(0);
  if (gi.only_reader(dn.output(0)) != i) return;
  const int plus = gi.next_with_scalar(i, "Add", 1.0);
  const int times_x = plus < 0 ? -1 : gi.only_reader(gi.node(plus).output(0));
  std::string other;
  if (!gi.binary(times_x, "Mul", gi.node(plus).output(0), &other) || other != x) return;
  const int half = gi.next_with_scalar(times_x, "Mul", 0.5);
  if (half < 0) return;
  out[half] = Fused{"gelu", x, {{"approximate", std::string("none")}}, {}, {d, i, plus, times_x}};
}

// GELU, tanh form: 0.5 * (x * (1 + Tanh(0.79788 * (x + 0.044715 * (x * (x * x)))))).
void gelu_tanh(const GraphIndex& gi, int i, Found& out) {
  if (gi.node(i).op_type() != "Tanh") return;
  const int scaled = gi.producer(gi.node(i).input(0));
  std::string k, inner, cube, x;
  if (scaled < 0 || gi.node(scaled).op_type() != "Mul") return;
  const onnx::NodeProto& sn = gi.node(scaled);
  inner = gi.scalar(sn.input(0), 0.7978845608, 1e-5) ? sn.input(1) : sn.input(0);
  if (!gi.scalar(inner == sn.input(1) ? sn.input(0) : sn.input(1), 0.7978845608, 1e-5)) return;
  const int sum = gi.producer(inner);
  if (sum < 0 || gi.node(sum).op_type() != "Add") return;
  for (int side = 0; side < 2; ++side) {  // x + c * x^3, either order
    const int c = gi.producer(gi.node(sum).input(side));
    if (c < 0 || gi.node(c).op_type() != "Mul") continue;
    const onnx::NodeProto& cn = gi.node(c);
    const int cube_at = gi.scalar(cn.input(0), 0.044715, 1e-4) ? 1 : gi.scalar(cn.input(1), 0.044715, 1e-4) ? 0 : -1;
    if (cube_at < 0) continue;
    x = gi.node(sum).input(1 - side);
    const int v = gi.producer(cn.input(cube_at));
    std::string sq;
    if (!gi.binary(v, "Mul", x, &sq)) return;
    const int w = gi.producer(sq);
    if (w < 0 || gi.node(w).op_type() != "Mul" || gi.node(w).input(0) != x || gi.node(w).input(1) != x) return;
    const int plus = gi.next_with_scalar(i, "Add", 1.0);
    const int times_x = plus < 0 ? -1 : gi.only_reader(gi.node(plus).output(0));
    std::string other;
    if (!gi.binary(times_x, "Mul", gi.node(plus).output(0), &other) || other != x) return;
    const int half = gi.next_with_scalar(times_x, "Mul", 0.5);
    if (half < 0) return;
    for (int inside : {w, v, c, sum, scaled})
      if (gi.only_reader(gi.node(inside).output(0)) < 0) return;
    out[half] = Fused{"gelu", x, {{"approximate", std::string("tanh")}}, {}, {w, v, c, sum, scaled, i, plus, times_x}};
    return;
  }
}

// The axes of a ReduceMean: its attribute, or (opset 18) its constant second input.
std::vector<int64_t> reduce_axes(const GraphIndex& gi, const onnx::NodeProto& n) {
  for (const auto& a : n.attribute())
    if (a.name() == "axes") return {a.ints().begin(), a.ints().end()};
  if (n.input_size() > 1 && gi.constant(n.input(1)))
    return {gi.constant(n.input(1))->values.begin(), gi.constant(n.input(1))->values.end()};
  return {};
}

// A norm's optional affine tail after node `root`: `* gamma`, then `+ beta`, each a
// constant of at least `min_values` values read only from the node before. They join f
// (its gamma and beta, its scale and center keys); returns the layer's last node.
int absorb_affine(const GraphIndex& gi, int root, size_t min_values, Fused& f) {
  std::string k;
  auto affine = [&](int node, const char* op) {
    return gi.binary(node, op, gi.node(root).output(0), &k) && gi.constant(k) &&
           gi.constant(k)->values.size() >= min_values;
  };
  for (int which = 0; which < 2; ++which) {
    const int next = gi.only_reader(gi.node(root).output(0));
    if (!affine(next, which == 0 ? "Mul" : "Add")) break;
    f.gamma_beta[which] = k;
    f.absorbed.insert(root);
    root = next;
  }
  f.keys.push_back({"scale", !f.gamma_beta[0].empty()});
  f.keys.push_back({"center", !f.gamma_beta[1].empty()});
  return root;
}

// LayerNorm before opset 17, over the last axis: (x - m) / Sqrt(Mean((x - m)^2) + eps),
// m = ReduceMean(x), then optionally * gamma and + beta.
void layer_norm(const GraphIndex& gi, int i, Found& out) {
  const onnx::NodeProto& r1 = gi.node(i);
  if (r1.op_type() != "ReduceMean" || reduce_axes(gi, r1) != std::vector<int64_t>{-1}) return;
  const std::string& x = r1.input(0);
  const int sub = gi.only_reader(r1.output(0));
  if (sub < 0 || gi.node(sub).op_type() != "Sub" || gi.node(sub).input(0) != x) return;
  const std::string& d = gi.node(sub).output(0);
  int pow = -1, div = -1;
  for (int r : gi.readers(d)) (gi.node(r).op_type() == "Pow" ? pow : div) = r;
  if (gi.readers(d).size() != 2 || pow < 0 || div < 0 || gi.node(div).op_type() != "Div" ||
      !gi.scalar(gi.node(pow).input(1), 2.0))
    return;
  const int r2 = gi.only_reader(gi.node(pow).output(0));
  if (r2 < 0 || gi.node(r2).op_type() != "ReduceMean" || reduce_axes(gi, gi.node(r2)) != std::vector<int64_t>{-1}) return;
  const int eps_add = gi.only_reader(gi.node(r2).output(0));
  std::string eps;
  if (!gi.binary(eps_add, "Add", gi.node(r2).output(0), &eps) || !gi.constant(eps) || gi.constant(eps)->values.size() != 1)
    return;
  const int sqrt = gi.only_reader(gi.node(eps_add).output(0));
  if (sqrt < 0 || gi.node(sqrt).op_type() != "Sqrt" || gi.only_reader(gi.node(sqrt).output(0)) != div) return;
  Fused f{"layer_norm", x, {{"epsilon", std::stod(fmt::format("{}", float(gi.constant(eps)->values[0])))}}, {"", ""},
          {i, sub, pow, r2, eps_add, sqrt}};
  const int last = absorb_affine(gi, div, 2, f);
  out[last] = f;
}

// torch's GroupNorm: Reshape(x, [0, G, -1]) -> InstanceNormalization (ones, zeros) ->
// Reshape back -> optionally * gamma [C, 1, 1] and + beta [C, 1, 1].
void group_norm(const GraphIndex& gi, int i, Found& out) {
  const onnx::NodeProto& in = gi.node(i);
  if (in.op_type() != "InstanceNormalization") return;
  const int rs1 = gi.producer(in.input(0));
  if (rs1 < 0 || gi.node(rs1).op_type() != "Reshape" || !gi.constant(gi.node(rs1).input(1))) return;
  const std::vector<double>& to = gi.constant(gi.node(rs1).input(1))->values;
  const Constant *s = gi.constant(in.input(1)), *b = gi.constant(in.input(2));
  if (to.size() != 3 || to[2] != -1 || !s || !b || gi.only_reader(gi.node(rs1).output(0)) != i) return;
  for (double v : s->values)
    if (v != 1) return;
  for (double v : b->values)
    if (v != 0) return;
  const int rs2 = gi.only_reader(in.output(0));
  if (rs2 < 0 || gi.node(rs2).op_type() != "Reshape") return;
  double eps = 1e-5;
  for (const auto& a : in.attribute())
    if (a.name() == "epsilon") eps = a.f();
  Fused f{"group_norm", gi.node(rs1).input(0),
          {{"groups", int64_t(to[1])}, {"epsilon", std::stod(fmt::format("{}", float(eps)))}},
          {"", ""},
          {rs1, i}};
  const int shape = gi.producer(gi.node(rs2).input(1));
  if (shape >= 0 && gi.node(shape).op_type() == "Shape" && gi.only_reader(gi.node(shape).output(0)) == rs2)
    f.absorbed.insert(shape);
  const int last = absorb_affine(gi, rs2, 1, f);
  out[last] = f;
}

// ShuffleNet's channel shuffle: Reshape to [N, g, C/g, H, W], Transpose [0, 2, 1, 3, 4],
// Reshape back to four dimensions.
void channel_shuffle(const GraphIndex& gi, int i, Found& out) {
  const onnx::NodeProto& rs1 = gi.node(i);
  if (rs1.op_type() != "Reshape" || !gi.constant(rs1.input(1)) || gi.constant(rs1.input(1))->values.size() != 5) return;
  const int tr = gi.only_reader(rs1.output(0));
  if (tr < 0 || gi.node(tr).op_type() != "Transpose") return;
  const auto& perm = gi.node(tr).attribute();
  if (perm.size() != 1 || std::vector<int64_t>(perm[0].ints().begin(), perm[0].ints().end()) !=
                              std::vector<int64_t>{0, 2, 1, 3, 4})
    return;
  const int rs2 = gi.only_reader(gi.node(tr).output(0));
  if (rs2 < 0 || gi.node(rs2).op_type() != "Reshape" || !gi.constant(gi.node(rs2).input(1)) ||
      gi.constant(gi.node(rs2).input(1))->values.size() != 4)
    return;
  out[rs2] = Fused{"channel_shuffle", rs1.input(0),
                   {{"groups", int64_t(gi.constant(rs1.input(1))->values[1])}}, {}, {i, tr}};
}

// torch's instance norm with running statistics (InstanceNorm2d(track_running_stats=True))
// exports as a BatchNormalization of the input reshaped to [1, N * C, H, W], its weights
// Tiled per image: refused by name, since instance_norm keeps no moving statistics.
void instance_norm_running_stats(const GraphIndex& gi, int i, Found&) {
  const onnx::NodeProto& bn = gi.node(i);
  if (bn.op_type() != "BatchNormalization" || bn.input_size() < 2) return;
  const int reshape = gi.producer(bn.input(0)), tile = gi.producer(bn.input(1));
  if (reshape < 0 || gi.node(reshape).op_type() != "Reshape" || tile < 0 || gi.node(tile).op_type() != "Tile") return;
  throw ConfigError(fmt::format(
      "node '{}' (BatchNormalization of a Reshape, its weights Tiled per image) is torch's "
      "InstanceNorm2d(track_running_stats=True): halotrain's instance_norm keeps no running statistics "
      "(it normalises every image by its own, in training and inference); export the model with "
      "track_running_stats=False",
      bn.name()));
}

}  // namespace

std::map<int, Fused> find_patterns(const onnx::GraphProto& graph, const std::map<std::string, Constant>& constants) {
  const GraphIndex gi(graph, constants);
  Found out;
  for (int i = 0; i < gi.size(); ++i)
    for (auto match : {gated, gelu_erf, gelu_tanh, layer_norm, group_norm, channel_shuffle, instance_norm_running_stats})
      match(gi, i, out);
  return out;
}

}  // namespace ht::onnx_import
