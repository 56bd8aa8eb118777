// Halo-exchange invariants shared by the thread-based gtest and the mpirun program: one
// rank's side of each check; the caller runs it on every rank of a comm.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <string>

#include "orchestrator/layer_kind.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/comm/halo_exchange.hpp"
#include "worker/runtime/backend.hpp"

namespace ht::testing {

// A model with several windowed layers whose halos differ per side.
inline ModelSpec halo_model(int h, int w) {
  Config c;
  c.source_path = "halo-test";
  c.model.height = h;
  c.model.width = w;
  c.model.channels = 2;
  c.model.loss = LossType::SigmoidBCE;
  auto conv = [](int filters, int k, int s, int d, Padding p) {
    return make_layer_config("conv2d", {{"filters", int64_t(filters)},
                                        {"kernel", int64_t(k)},
                                        {"stride", int64_t(s)},
                                        {"dilation", int64_t(d)},
                                        {"padding", p}});
  };
  c.model.layers = {conv(2, 3, 1, 1, {PaddingMode::Same, 0}), conv(3, 5, 2, 1, {PaddingMode::Explicit, 1}),
                    conv(3, 3, 1, 2, {PaddingMode::Valid, 0})};
  c.model.layers.push_back(make_layer_config(
      "max_pool2d", {{"pool", int64_t(3)}, {"stride", int64_t(2)}, {"padding", Padding{PaddingMode::Same, 0}}}));
  LayerConfig last = conv(1, 1, 1, 1, {PaddingMode::Valid, 0});
  c.model.layers.push_back(last);
  // The windows that read by image coordinates, and a depthwise conv.
  c.model.layers.push_back(make_layer_config(
      "upsampling2d", {{"size", std::vector<int64_t>{2, 2}}, {"interpolation", std::string("bilinear")}}));
  c.model.layers.push_back(make_layer_config("conv2d_transpose", {{"filters", int64_t(2)},
                                                                  {"kernel", int64_t(3)},
                                                                  {"stride", int64_t(2)},
                                                                  {"padding", Padding{PaddingMode::Same, 0}}}));
  c.model.layers.push_back(make_layer_config("zero_padding2d", {{"padding", std::vector<int64_t>{1, 2, 2, 0}}}));
  c.model.layers.push_back(make_layer_config("cropping2d", {{"cropping", std::vector<int64_t>{2, 0, 1, 1}}}));
  c.model.layers.push_back(make_layer_config(
      "depthwise_conv2d", {{"kernel", int64_t(3)}, {"padding", Padding{PaddingMode::Same, 0}}}));
  // Windows that are not square: InceptionV3's 1x7 and 7x1 (strided along one axis, padded
  // per side), a dilation along one axis, a 3x1 pool with stride [2, 1].
  auto pair = [](int64_t a, int64_t b) { return std::vector<int64_t>{a, b}; };
  c.model.layers.push_back(make_layer_config(
      "conv2d", {{"filters", int64_t(2)}, {"kernel", pair(1, 7)}, {"padding", Padding{PaddingMode::Same, 0}}}));
  c.model.layers.push_back(make_layer_config("conv2d", {{"filters", int64_t(2)},
                                                        {"kernel", pair(7, 1)},
                                                        {"stride", pair(2, 1)},
                                                        {"padding", Padding{PaddingMode::Explicit, 3, 2, 0, 1}}}));
  c.model.layers.push_back(make_layer_config("conv2d", {{"filters", int64_t(2)},
                                                        {"kernel", pair(3, 3)},
                                                        {"dilation", pair(2, 1)},
                                                        {"padding", Padding{PaddingMode::Same, 0}}}));
  c.model.layers.push_back(make_layer_config("max_pool2d", {{"pool", pair(3, 1)},
                                                            {"stride", pair(2, 1)},
                                                            {"padding", Padding{PaddingMode::Explicit, 1, 1, 0, 0}}}));
  // The output is smaller than the input: fine for exchange tests, never trained.
  ModelSpec m;
  m.input = {2, h, w};
  Shape3 s = m.input;
  for (auto& l : c.model.layers) {
    LayerSpec ls;
    ls.config = l;
    ls.config.name = fmt::format("layer{}", m.layers.size());
    ls.inputs = {int(m.layers.size())};
    ls.ins = {s};
    ls.in = s;
    l.kind->shape(ls);  // the kind's own windows, shapes and weights
    s = ls.out;
    m.layers.push_back(ls);
  }
  m.readers.resize(m.layers.size() + 1);
  for (size_t l = 0; l < m.layers.size(); ++l) m.readers[l] = {int(l)};
  return m;
}

inline float cell_id(int plane, int row, int col) { return float(plane * 100000 + row * 300 + col + 1); }

// Every cell of the owned input holds its global index; after gather every cell of the
// extended tensor must hold the index of the global cell it stands for. Returns "" or the
// first mismatch.
inline std::string check_gather_indices(const ShardPlan& plan, int layer, int rank, Comm& comm,
                                        ComputeBackend& backend) {
  HaloExchange halo(plan, layer, rank, comm, backend);
  const Rect own = halo.owned(), need = halo.needed();
  const int n = 2, c = plan.model.layers[layer].in.c;
  Tensor x(backend.allocator(), n, c, own.rows.size(), own.cols.size(), "x");
  for (int p = 0; p < n * c; ++p)
    for (int r = 0; r < own.rows.size(); ++r)
      for (int q = 0; q < own.cols.size(); ++q)
        x.data()[(size_t(p) * own.rows.size() + r) * own.cols.size() + q] = cell_id(p, own.rows.lo + r, own.cols.lo + q);
  Tensor ext = halo.gather(x, "ext");
  for (int p = 0; p < n * c; ++p)
    for (int r = 0; r < need.rows.size(); ++r)
      for (int q = 0; q < need.cols.size(); ++q) {
        const float got = ext.data()[(size_t(p) * need.rows.size() + r) * need.cols.size() + q];
        const float want = cell_id(p, need.rows.lo + r, need.cols.lo + q);
        if (got != want)
          return fmt::format("layer {} rank {}: extended cell (plane {}, row {}, col {}) holds {}, expected {}",
                             layer, rank, p, need.rows.lo + r, need.cols.lo + q, got, want);
      }
  return "";
}

// Adjoint test: <gather(x), y> summed over ranks == <x, scatter_add(y)> summed over ranks.
// Returns the relative difference of the two sums.
inline double adjoint_gap(const ShardPlan& plan, int layer, int rank, Comm& comm, ComputeBackend& backend) {
  HaloExchange halo(plan, layer, rank, comm, backend);
  const Rect own = halo.owned(), need = halo.needed();
  const int n = 2, c = plan.model.layers[layer].in.c;
  std::mt19937 rng(1000 + rank * 7 + layer);
  std::uniform_real_distribution<float> u(-1, 1);
  Tensor x(backend.allocator(), n, c, own.rows.size(), own.cols.size(), "x");
  Tensor y(backend.allocator(), n, c, need.rows.size(), need.cols.size(), "y");
  for (size_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  for (size_t i = 0; i < y.size(); ++i) y.data()[i] = u(rng);
  Tensor fx = halo.gather(x, "fx");
  Tensor fty = halo.scatter_add(y, "fty");
  double sums[2] = {0, 0};
  for (size_t i = 0; i < fx.size(); ++i) sums[0] += double(fx.data()[i]) * y.data()[i];
  for (size_t i = 0; i < x.size(); ++i) sums[1] += double(x.data()[i]) * fty.data()[i];
  comm.allreduce_sum_host(sums, 2);
  return std::abs(sums[0] - sums[1]) / std::max(1.0, std::abs(sums[0]));
}

}  // namespace ht::testing
