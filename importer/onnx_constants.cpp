// Constant folding: exporters compute operands (Pad's pads, Resize's sizes, a channel
// split's bounds) in small subgraphs of constants and of the shapes of feature maps, which
// halotrain knows statically. Whatever the constant-folding setting of the export, these
// are evaluated here, op by op.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "importer/onnx_translator.hpp"

namespace ht::onnx_import {

namespace {

int64_t count(const std::vector<int64_t>& dims) {
  int64_t c = 1;
  for (int64_t d : dims) c *= d;
  return c;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = int(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

// Calls f(multi-index) for every element of `dims` in row-major order.
template <class F>
void each_index(const std::vector<int64_t>& dims, F f) {
  std::vector<int64_t> at(dims.size(), 0);
  for (int64_t e = 0, n = count(dims); e < n; ++e) {
    f(at);
    for (int d = int(dims.size()) - 1; d >= 0; --d) {
      if (++at[d] < dims[d]) break;
      at[d] = 0;
    }
  }
}

int64_t axis_of(int64_t axis, size_t rank) { return axis < 0 ? axis + int64_t(rank) : axis; }

template <class T>
std::vector<double> read_raw(const std::string& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return {v.begin(), v.end()};
}

// What one op computes from its constant inputs `in` (null when this node's form of it is
// not one halotrain evaluates).
using Evaluator = std::function<bool(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in,
                                     Constant& out)>;

bool eval_constant(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>&, Constant& out) {
  const onnx::AttributeProto* v = t.attr(n, "value");
  if (v) {
    out = constant_of(v->t(), "");
    return true;
  }
  if (const onnx::AttributeProto* f = t.attr(n, "value_float")) out = {{}, {double(f->f())}, false};
  else if (const onnx::AttributeProto* i = t.attr(n, "value_int")) out = {{}, {double(i->i())}, true};
  else if (const onnx::AttributeProto* fs = t.attr(n, "value_floats"))
    out = {{int64_t(fs->floats_size())}, {fs->floats().begin(), fs->floats().end()}, false};
  else if (const onnx::AttributeProto* is = t.attr(n, "value_ints"))
    out = {{int64_t(is->ints_size())}, {is->ints().begin(), is->ints().end()}, true};
  else
    t.unsupported(n, "has no value halotrain reads (value, value_float(s), value_int(s))");
  return true;
}

bool eval_constant_of_shape(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in,
                            Constant& out) {
  const onnx::AttributeProto* v = t.attr(n, "value");
  const Constant fill = v ? constant_of(v->t(), "") : Constant{{}, {0.0}, false};
  out.dims.assign(in[0]->values.begin(), in[0]->values.end());
  if (double(count(out.dims)) > double(kMaxElements) || std::any_of(out.dims.begin(), out.dims.end(),
                                                                     [](int64_t d) { return d < 0; }))
    t.unsupported(n, fmt::format("makes a constant of shape [{}]", fmt::join(out.dims, ", ")));
  out.values.assign(size_t(count(out.dims)), fill.values.empty() ? 0.0 : fill.values[0]);
  out.integral = fill.integral;
  return true;
}

bool eval_identity(Translator&, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  out = *in[0];
  if (n.op_type() == "Cast") out.integral = false;  // the target type decides; integer shapes stay exact
  return true;
}

bool eval_concat(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  const size_t rank = in[0]->dims.size();
  const int64_t axis = axis_of(t.integer(n, "axis", 0), rank);
  out.dims = in[0]->dims;
  out.dims[axis] = 0;
  out.integral = true;
  for (const Constant* c : in) {
    out.dims[axis] += c->dims[axis];
    out.integral = out.integral && c->integral;
  }
  out.values.resize(size_t(count(out.dims)));
  const std::vector<int64_t> so = strides_of(out.dims);
  int64_t offset = 0;
  for (const Constant* c : in) {
    size_t e = 0;
    each_index(c->dims, [&](const std::vector<int64_t>& at) {
      int64_t o = 0;
      for (size_t d = 0; d < rank; ++d) o += (at[d] + (int64_t(d) == axis ? offset : 0)) * so[d];
      out.values[size_t(o)] = c->values[e++];
    });
    offset += c->dims[axis];
  }
  return true;
}

bool eval_reshape(Translator&, const onnx::NodeProto&, const std::vector<const Constant*>& in, Constant& out) {
  out.values = in[0]->values;
  out.integral = in[0]->integral;
  const int64_t total = int64_t(out.values.size());
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < in[1]->values.size(); ++d) {
    int64_t v = int64_t(in[1]->values[d]);
    if (v == 0) v = in[0]->dims.at(d);
    if (v == -1) infer = int64_t(d);
    else known *= v;
    out.dims.push_back(v);
  }
  if (infer >= 0) out.dims[infer] = known ? total / known : 0;
  return count(out.dims) == total;
}

bool eval_transpose(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  const Constant& c = *in[0];
  std::vector<int64_t> perm = t.ints(n, "perm");
  if (perm.empty())
    for (int64_t d = int64_t(c.dims.size()) - 1; d >= 0; --d) perm.push_back(d);
  for (int64_t p : perm) out.dims.push_back(c.dims.at(p));
  out.values.resize(c.values.size());
  out.integral = c.integral;
  const std::vector<int64_t> sc = strides_of(c.dims);
  size_t e = 0;
  each_index(out.dims, [&](const std::vector<int64_t>& at) {
    int64_t o = 0;
    for (size_t d = 0; d < perm.size(); ++d) o += at[d] * sc[perm[d]];
    out.values[e++] = c.values[size_t(o)];
  });
  return true;
}

bool eval_slice(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  const Constant& c = *in[0];
  const size_t rank = c.dims.size();
  std::vector<int64_t> lo(rank, 0), step(rank, 1), hi = c.dims;
  const std::vector<double>& starts = in[1]->values;
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t axis = in.size() > 3 && in[3] ? axis_of(int64_t(in[3]->values[k]), rank) : int64_t(k);
    const int64_t dim = c.dims.at(axis);
    const int64_t s = in.size() > 4 && in[4] ? int64_t(in[4]->values[k]) : 1;
    // ONNX's clamping: a start in [0, dim] ([0, dim - 1] stepping back), an end in [0, dim]
    // ([-1, dim - 1] stepping back); INT64 extremes mean "to the end".
    auto index = [&](double v) {
      const int64_t x = v <= -9.2e18 ? -dim - 1 : v >= 9.2e18 ? dim : int64_t(v);
      return x < 0 ? x + dim : x;
    };
    lo[axis] = std::clamp<int64_t>(index(starts[k]), 0, s > 0 ? dim : dim - 1);
    hi[axis] = std::clamp<int64_t>(index(in[2]->values[k]), s > 0 ? 0 : -1, s > 0 ? dim : dim - 1);
    step[axis] = s;
  }
  for (size_t d = 0; d < rank; ++d) {
    const int64_t len =
        step[d] > 0 ? (hi[d] - lo[d] + step[d] - 1) / step[d] : (lo[d] - hi[d] - step[d] - 1) / -step[d];
    out.dims.push_back(std::max<int64_t>(len, 0));
  }
  out.integral = c.integral;
  const std::vector<int64_t> sc = strides_of(c.dims);
  each_index(out.dims, [&](const std::vector<int64_t>& at) {
    int64_t o = 0;
    for (size_t d = 0; d < rank; ++d) o += (lo[d] + at[d] * step[d]) * sc[d];
    out.values.push_back(c.values[size_t(o)]);
  });
  return true;
}

bool eval_squeeze(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  out = *in[0];
  std::vector<int64_t> axes = t.ints(n, "axes");
  if (axes.empty() && in.size() > 1 && in[1]) axes.assign(in[1]->values.begin(), in[1]->values.end());
  if (n.op_type() == "Unsqueeze") {
    const size_t rank = out.dims.size() + axes.size();
    for (int64_t& a : axes) a = axis_of(a, rank);
    std::sort(axes.begin(), axes.end());
    for (int64_t a : axes) out.dims.insert(out.dims.begin() + a, 1);
    return true;
  }
  std::vector<int64_t> kept;
  for (size_t d = 0; d < out.dims.size(); ++d) {
    const bool named = std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end() ||
                       std::find(axes.begin(), axes.end(), int64_t(d) - int64_t(out.dims.size())) != axes.end();
    if (!(axes.empty() ? out.dims[d] == 1 : named)) kept.push_back(out.dims[d]);
  }
  out.dims = kept;
  return true;
}

bool eval_gather(Translator& t, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  const Constant &c = *in[0], &idx = *in[1];
  if (c.dims.size() != 1 || axis_of(t.integer(n, "axis", 0), 1) != 0) return false;
  out.dims = idx.dims;
  out.integral = c.integral;
  for (double i : idx.values) {
    const int64_t k = int64_t(i < 0 ? i + double(c.dims[0]) : i);
    if (k < 0 || k >= c.dims[0]) t.unsupported(n, fmt::format("gathers index {} of {} values", int64_t(i), c.dims[0]));
    out.values.push_back(c.values[size_t(k)]);
  }
  return true;
}

// Mul, Add, Sub, Div, Pow, Max, Min: equal shapes or a scalar; integer Div truncates.
bool eval_arithmetic(Translator&, const onnx::NodeProto& n, const std::vector<const Constant*>& in, Constant& out) {
  const Constant &a = *in[0], &b = *in[1];
  if (a.values.size() != b.values.size() && a.values.size() != 1 && b.values.size() != 1) return false;
  out.dims = a.values.size() >= b.values.size() ? a.dims : b.dims;
  out.integral = a.integral && b.integral;
  const std::string& op = n.op_type();
  const size_t len = std::max(a.values.size(), b.values.size());
  for (size_t i = 0; i < len; ++i) {
    const double x = a.values[a.values.size() == 1 ? 0 : i], y = b.values[b.values.size() == 1 ? 0 : i];
    double v = op == "Mul" ? x * y : op == "Add" ? x + y : op == "Sub" ? x - y : op == "Pow" ? std::pow(x, y)
               : op == "Max" ? std::max(x, y) : op == "Min" ? std::min(x, y) : x / y;
    if (out.integral && op == "Div") v = std::trunc(v);
    out.values.push_back(v);
  }
  return true;
}

bool eval_sqrt(Translator&, const onnx::NodeProto&, const std::vector<const Constant*>& in, Constant& out) {
  out = *in[0];
  for (double& v : out.values) v = std::sqrt(v);
  return true;
}

const std::map<std::string, Evaluator>& evaluators() {
  static const std::map<std::string, Evaluator> table = {
      {"Constant", eval_constant},   {"ConstantOfShape", eval_constant_of_shape},
      {"Cast", eval_identity},       {"Identity", eval_identity},
      {"Concat", eval_concat},       {"Reshape", eval_reshape},
      {"Transpose", eval_transpose}, {"Slice", eval_slice},
      {"Squeeze", eval_squeeze},     {"Unsqueeze", eval_squeeze},
      {"Gather", eval_gather},       {"Mul", eval_arithmetic},
      {"Add", eval_arithmetic},      {"Sub", eval_arithmetic},
      {"Div", eval_arithmetic},      {"Pow", eval_arithmetic},
      {"Max", eval_arithmetic},      {"Min", eval_arithmetic},
      {"Sqrt", eval_sqrt}};
  return table;
}

}  // namespace

Constant constant_of(const onnx::TensorProto& t, const std::string& source) {
  auto fail = [&](const std::string& why) -> Constant {
    throw ConfigError(fmt::format("{}initializer '{}' {}", source.empty() ? "" : source + ": ", t.name(), why));
  };
  Constant c;
  c.dims.assign(t.dims().begin(), t.dims().end());
  double expected = 1;
  for (int64_t d : c.dims) {
    if (d < 0) return fail(fmt::format("has a negative dimension in [{}]", fmt::join(c.dims, ", ")));
    expected *= double(d);
  }
  if (expected > double(kMaxElements))
    return fail(fmt::format("of shape [{}] holds more than {} values", fmt::join(c.dims, ", "), kMaxElements));
  const std::string& raw = t.raw_data();
  using TP = onnx::TensorProto;
  switch (t.data_type()) {
    case TP::FLOAT: c.values = raw.empty() ? std::vector<double>(t.float_data().begin(), t.float_data().end())
                                           : read_raw<float>(raw); break;
    case TP::DOUBLE: c.values = raw.empty() ? std::vector<double>(t.double_data().begin(), t.double_data().end())
                                            : read_raw<double>(raw); break;
    case TP::INT64: c.values = raw.empty() ? std::vector<double>(t.int64_data().begin(), t.int64_data().end())
                                           : read_raw<int64_t>(raw); c.integral = true; break;
    case TP::INT32: c.values = raw.empty() ? std::vector<double>(t.int32_data().begin(), t.int32_data().end())
                                           : read_raw<int32_t>(raw); c.integral = true; break;
    case TP::INT8: c.values = raw.empty() ? std::vector<double>(t.int32_data().begin(), t.int32_data().end())
                                          : read_raw<int8_t>(raw); c.integral = true; break;
    case TP::UINT8:
    case TP::BOOL: c.values = raw.empty() ? std::vector<double>(t.int32_data().begin(), t.int32_data().end())
                                          : read_raw<uint8_t>(raw); c.integral = true; break;
    default:
      return fail(fmt::format("has data type {}; halotrain reads float, double, int64, int32, int8, uint8 and bool",
                              t.data_type()));
  }
  if (double(c.values.size()) != expected)
    return fail(fmt::format("holds {} values but its shape [{}] says {}", c.values.size(), fmt::join(c.dims, ", "),
                            expected));
  return c;
}

bool Translator::fold_constants(const onnx::NodeProto& n) {
  const std::string& op = n.op_type();
  // The static shape of a feature map, whatever the export folded.
  if (op == "Shape" && n.input_size() == 1 && !is_constant(n.input(0))) {
    const Value& v = value(n.input(0));
    bind_constant(n.output(0), Constant{{int64_t(v.dims.size())}, {v.dims.begin(), v.dims.end()}, true});
    return true;
  }
  auto it = evaluators().find(op);
  if (it == evaluators().end()) return false;
  std::vector<const Constant*> in;
  for (const std::string& name : n.input()) {
    if (name.empty()) {
      in.push_back(nullptr);
      continue;
    }
    if (!is_constant(name)) return false;
    in.push_back(&constant(n, int(in.size())));
  }
  if (op != "Constant" && (in.empty() || !in[0])) return false;
  Constant out;
  if (!it->second(*this, n, in, out)) return false;
  bind_constant(n.output(0), std::move(out));
  return true;
}

}  // namespace ht::onnx_import
