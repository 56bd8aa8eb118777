// oneDNN's convolution on this machine, in GFLOP/s, through kernels/cpu's DnnlConv2d (the
// kernel the CPU backend trains with) on plain NCHW tensors, 3x3 'same', with the caller's
// OpenMP threads. `bench/speed.py` holds halotrain's training step against both figures:
//   - the ceiling: the forward conv alone at channel counts where oneDNN's blocked direct
//     kernels are at their best (one JSON object per geometry); beside it the same conv on
//     the kernel the step runs (at these channel counts oneDNN's Winograd, where the CPU has
//     it), in GFLOP/s of the direct convolution's flops;
//   - with --conv, a model's own convs: each conv's training passes (forward, backward
//     data unless it is the first layer, backward weights) timed on their own, best call
//     of each, summed (one JSON object "convs"): what the step would take if everything
//     but the convs cost nothing;
//   - with --passes, each pass of one conv on the kernels the step runs (ConvKernels::
//     Fastest: for few channels kernels/cpu/conv_small.hpp's) against oneDNN's alone, in 7
//     interleaved pairs, each side the best of 3 calls (one JSON object per pass: the median
//     times and the median of the pairs' ratios).
//
// usage: halotrain_conv_throughput [--seconds S] [--conv N,CIN,COUT,H,W,FIRST ...]
//                                  [--passes N,CIN,COUT,H,W]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --passes: each pass on the step's kernels against oneDNN's alone.
void compare_passes(const ht::ConvGeom& g) {
  std::vector<float> x(g.x_size()), w(g.w_size()), b(size_t(g.cout), 0.1f), y(g.y_size()), dy(g.y_size()),
      dx(g.x_size()), dw(g.w_size()), db(size_t(g.cout));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) / 17 - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 7) / 70 - 0.05f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(i % 13) / 13 - 0.5f;
  ht::cpu::DnnlConv2d ours(g), onednn(g, nullptr, ht::cpu::ConvKernels::OneDnnOnly);
  using Pass = std::function<void(ht::cpu::DnnlConv2d&)>;
  const std::pair<const char*, Pass> passes[] = {
      {"forward", [&](ht::cpu::DnnlConv2d& c) { c.forward(x.data(), w.data(), b.data(), y.data()); }},
      {"backward_data", [&](ht::cpu::DnnlConv2d& c) { c.backward_data(dy.data(), w.data(), dx.data()); }},
      {"backward_weights", [&](ht::cpu::DnnlConv2d& c) { c.backward_weights(x.data(), dy.data(), dw.data(), db.data()); }},
  };
  for (const auto& [name, pass] : passes) {
    auto best_of_3 = [&](ht::cpu::DnnlConv2d& c) {
      double best = 1e30;
      for (int i = 0; i < 3; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        pass(c);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return best;
    };
    pass(ours), pass(onednn);  // primitive creation, first touch
    std::vector<double> a, o, ratio;
    for (int pair = 0; pair < 7; ++pair) {
      a.push_back(best_of_3(ours));
      o.push_back(best_of_3(onednn));
      ratio.push_back(a.back() / o.back());
    }
    std::printf("{\"n\": %d, \"cin\": %d, \"cout\": %d, \"height\": %d, \"width\": %d, \"threads\": %d, "
                "\"pass\": \"%s\", \"ours_seconds\": %.6f, \"onednn_seconds\": %.6f, \"ratio\": %.3f}\n",
                g.n, g.cin, g.cout, g.hin, g.win, omp_get_max_threads(), name, median(a), median(o), median(ratio));
  }
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
    } else if (std::strcmp(argv[i], "--passes") == 0) {
      int n, cin, cout, h, w;
      if (std::sscanf(argv[++i], "%d,%d,%d,%d,%d", &n, &cin, &cout, &h, &w) != 5) {
        std::fprintf(stderr, "--passes wants N,CIN,COUT,H,W, got '%s'\n", argv[i]);
        return 2;
      }
      compare_passes(same3x3(n, cin, cout, h, w));
      return 0;
    }
  }
  if (model.empty()) {
    struct Case {
      int n, c, h, w;
    };
    for (const Case& k : {Case{2, 64, 256, 256}, Case{2, 128, 128, 128}, Case{2, 128, 256, 256}}) {
      const ht::ConvGeom g = same3x3(k.n, k.c, k.c, k.h, k.w);
      std::vector<float> x(g.x_size(), 0.5f), w(g.w_size(), 0.01f), b(size_t(g.cout), 0.1f), y(g.y_size());
      ht::cpu::DnnlConv2d direct(g, nullptr, ht::cpu::ConvKernels::OneDnnOnly), step(g);
      const double best = best_seconds(seconds, [&] { direct.forward(x.data(), w.data(), b.data(), y.data()); });
      const double on_step = best_seconds(seconds, [&] { step.forward(x.data(), w.data(), b.data(), y.data()); });
      std::printf("{\"n\": %d, \"channels\": %d, \"height\": %d, \"width\": %d, \"threads\": %d, "
                  "\"best_seconds\": %.6f, \"gflops\": %.2f, \"step_kernel_gflops\": %.2f, \"winograd\": %s}\n",
                  g.n, g.cin, g.hin, g.win, omp_get_max_threads(), best, conv_flops(g) / best / 1e9,
                  conv_flops(g) / on_step / 1e9, step.on_winograd() ? "true" : "false");
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
