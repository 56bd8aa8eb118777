// oneDNN's convolution on this machine, in GFLOP/s, through kernels/cpu's DnnlConv2d (the
// kernel the CPU backend trains with) on plain NCHW tensors, 3x3 'same', with the caller's
// OpenMP threads. `bench/speed.py` holds halotrain's training step against both figures:
//   - the ceiling: the forward conv alone at channel counts where oneDNN's blocked kernels
//     are at their best (one JSON object per geometry);
//   - with --conv, a model's own convs: each conv's training passes (forward, backward
//     data unless it is the first layer, backward weights) timed on their own, best call
//     of each, summed (one JSON object "convs"): what the step would take if everything
//     but the convs cost nothing.
//
// usage: halotrain_conv_throughput [--seconds S] [--conv N,CIN,COUT,H,W,FIRST ...]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cpu/conv.hpp"

namespace {

ht::ConvGeom same3x3(int n, int cin, int cout, int h, int w) {
  ht::ConvGeom g;
  g.n = n;
  g.cin = cin;
  g.cout = cout;
  g.hin = h;
  g.win = w;
  g.kh = g.kw = 3;
  g.pad_top = g.pad_bottom = g.pad_left = g.pad_right = 1;
  return g;
}

double conv_flops(const ht::ConvGeom& g) {
  return 2.0 * g.n * g.cout * g.hout() * g.wout() * g.cin * g.kh * g.kw;
}

// The fastest of repeated calls of f, after one untimed call (primitive creation, first touch).
double best_seconds(double seconds, const std::function<void()>& f) {
  f();
  double best = 1e30;
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  while (calls < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ++calls;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  struct ModelConv {
    int n, cin, cout, h, w, first;
  };
  std::vector<ModelConv> model;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--conv") == 0) {
      ModelConv m{};
      if (std::sscanf(argv[++i], "%d,%d,%d,%d,%d,%d", &m.n, &m.cin, &m.cout, &m.h, &m.w, &m.first) != 6) {
        std::fprintf(stderr, "--conv wants N,CIN,COUT,H,W,FIRST, got '%s'\n", argv[i]);
        return 2;
      }
      model.push_back(m);
    }
  }
  if (model.empty()) {
    struct Case {
      int n, c, h, w;
    };
    for (const Case& k : {Case{2, 64, 256, 256}, Case{2, 128, 128, 128}, Case{2, 128, 256, 256}}) {
      const ht::ConvGeom g = same3x3(k.n, k.c, k.c, k.h, k.w);
      std::vector<float> x(g.x_size(), 0.5f), w(g.w_size(), 0.01f), b(size_t(g.cout), 0.1f), y(g.y_size());
      ht::cpu::DnnlConv2d conv(g);
      const double best = best_seconds(seconds, [&] { conv.forward(x.data(), w.data(), b.data(), y.data()); });
      std::printf("{\"n\": %d, \"channels\": %d, \"height\": %d, \"width\": %d, \"threads\": %d, "
                  "\"best_seconds\": %.6f, \"gflops\": %.2f}\n",
                  g.n, g.cin, g.hin, g.win, omp_get_max_threads(), best, conv_flops(g) / best / 1e9);
    }
    return 0;
  }
  double total_seconds = 0, total_flops = 0;
  for (const ModelConv& m : model) {
    const ht::ConvGeom g = same3x3(m.n, m.cin, m.cout, m.h, m.w);
    std::vector<float> x(g.x_size(), 0.5f), w(g.w_size(), 0.01f), b(size_t(g.cout), 0.1f), y(g.y_size(), 0.1f),
        dx(g.x_size()), dw(g.w_size()), db(size_t(g.cout));
    ht::cpu::DnnlConv2d conv(g);
    const double passes = m.first ? 2 : 3;
    total_seconds += best_seconds(seconds / model.size(), [&] {
      conv.forward(x.data(), w.data(), b.data(), y.data());
      if (!m.first) conv.backward_data(y.data(), w.data(), dx.data());
      conv.backward_weights(x.data(), y.data(), dw.data(), db.data());
    });
    total_flops += passes * conv_flops(g);
  }
  std::printf("{\"convs\": %zu, \"threads\": %d, \"seconds\": %.6f, \"gflops\": %.2f}\n", model.size(),
              omp_get_max_threads(), total_seconds, total_flops / total_seconds / 1e9);
  return 0;
}
