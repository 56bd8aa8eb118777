// DnnlConv2d: oneDNN convolution with cached primitive descriptors. The caller's tensors
// are plain NCHW/OIHW; oneDNN is asked for its preferred layout (format_tag::any) and
// data is reordered through a per-thread scratch area when that layout differs. Measured
// on 1x16x512x512, 3x3, 16->16, one thread (AVX-512): blocked + reorders 47 ms for
// forward + both backwards, plain-NCHW primitives 174 ms (they fall back to im2col GEMM
// with a 144 MiB scratchpad); the reorders are ~25% of the blocked time.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/conv.hpp"
#include "kernels/cpu/conv_small.hpp"
#include "kernels/cpu/conv_winograd.hpp"
#include "kernels/cpu/dnnl_port.hpp"
#include "kernels/cpu/norm.hpp"

namespace ht::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

}  // namespace

struct DnnlConv2d::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  ScratchArena* arena;
  dnnl::stream strm{eng};
  int nthr = -1;
  memory::desc x_md, w_md, b_md, y_md;
  memory::dims strides, dilates, pad_l, pad_r;
  // The data gradient's problem: the forward's, or framed (frame_data_gradient).
  memory::desc dx_md, dy_md;
  memory::dims bpad_l, bpad_r;
  memory::dims frame, dx_frame;  // dy's and dx's offsets in the problem's tensors; empty: not framed

  struct Fwd {
    dnnl::convolution_forward prim;
    DnnlPort x, w, y;
    size_t pad = 0;
  };
  struct BwdData {
    dnnl::convolution_backward_data prim;
    DnnlPort dy, w, dx;
    size_t pad = 0;
  };
  struct BwdWeights {
    dnnl::convolution_backward_weights prim;
    DnnlPort x, dy, dw;
    size_t pad = 0;
  };
  unsigned winograd = 0;        // the passes to build on oneDNN's Winograd kernels where it has them
  unsigned on_winograd = 0;     // the passes whose primitives are built on them
  std::optional<dnnl::convolution_forward::primitive_desc> hint, data_hint;
  std::optional<Fwd> fwd[2][2];  // [with bias][with ReLU]
  std::optional<BwdData> bwd_data;
  std::optional<BwdWeights> bwd_w[2];

  Impl(const ConvGeom& g, ScratchArena* a) : arena(a ? a : &thread_scratch()) {
    x_md = memory::desc({g.n, g.cin, g.hin, g.win}, dt::f32, tag::nchw);
    // A grouped weight [cout][cin/groups][kh][kw] is goihw with the groups outermost.
    w_md = g.groups == 1 ? memory::desc({g.cout, g.cin, g.kh, g.kw}, dt::f32, tag::oihw)
                         : memory::desc({g.groups, g.cout_per_group(), g.cin_per_group(), g.kh, g.kw}, dt::f32,
                                        tag::goihw);
    b_md = memory::desc({g.cout}, dt::f32, tag::x);
    y_md = memory::desc({g.n, g.cout, g.hout(), g.wout()}, dt::f32, tag::nchw);
    strides = {g.stride_h, g.stride_w};
    dilates = {g.dil_h - 1, g.dil_w - 1};  // oneDNN counts the gap, not the step
    pad_l = {g.pad_top, g.pad_left};
    pad_r = {g.pad_bottom, g.pad_right};
    dx_md = x_md, dy_md = y_md, bpad_l = pad_l, bpad_r = pad_r;
  }

  // oneDNN's Winograd keeps its transforms in the cache, its scratchpad a few MiB, except
  // where it decides to transform whole tensors: 2x32x741x591 32 -> 64 asked for 770 MB, 14x
  // its input (the seed case at full resolution, 2 threads). There the direct kernels run:
  // at most an eighth of the pass's tensors, or 16 MiB.
  size_t winograd_pad_limit() const {
    return std::max<size_t>(size_t(16) << 20, (x_md.get_size() + y_md.get_size()) / 8);
  }

  // The data gradient on winograd_data_problem's convolution p: dy framed in its output,
  // dx its dx's top-left corner.
  void frame_data_gradient(const ConvGeom& g, const ConvGeom& p) {
    const bool grown = p.hin != g.hin || p.win != g.win;
    if (!grown && p.pad_top == g.pad_top && p.pad_bottom == g.pad_bottom && p.pad_left == g.pad_left &&
        p.pad_right == g.pad_right)
      return;
    dx_md = memory::desc({p.n, p.cin, p.hin, p.win}, dt::f32, tag::nchw);
    dy_md = memory::desc({p.n, p.cout, p.hout(), p.wout()}, dt::f32, tag::nchw);
    bpad_l = {p.pad_top, p.pad_left}, bpad_r = {p.pad_bottom, p.pad_right};
    frame = {0, 0, p.pad_top - g.pad_top, p.pad_left - g.pad_left};
    if (grown) dx_frame = {0, 0, 0, 0};
  }
  // The data gradient on the direct kernels after all: the exact problem, not framed.
  void unframe_data_gradient() {
    winograd &= ~unsigned(kConvBackwardData);
    dx_md = x_md, dy_md = y_md, bpad_l = pad_l, bpad_r = pad_r;
    frame.clear(), dx_frame.clear();
    data_hint.reset();
  }

  static memory::desc any(const memory::desc& d) {
    return memory::desc(d.dims(), dt::f32, tag::any);
  }
  // An activation in 8-channel blocks when `eight` and its channels allow, else oneDNN's
  // choice. AVX-512 kernels block by 16 and pad a tensor of 8 mod 16 channels to the next
  // 16: twice the bytes, and a slow padded reorder back to NCHW. Measured, one thread,
  // 4x1x1024x768 3x3 1->8: forward 31-40 ms with 16-blocks, 16-21 ms with 8-blocks (AVX2
  // kernel); 4x8x256x192 8->16 backward data 8.2-10.5 ms vs 7.1-8.2. Backward weights is
  // faster with 16-blocks (27 vs 63 ms), so it keeps oneDNN's choice.
  static bool eight_mod_sixteen(int c) { return c % 16 == 8; }
  static memory::desc act(const memory::desc& d, bool eight) {
    if (eight && d.dims()[1] % 8 == 0) return memory::desc(d.dims(), dt::f32, tag::aBcd8b);
    return any(d);
  }
  // make(true) (activations in 8-channel blocks) where `channels` is 8 mod 16 and this CPU
  // has such kernels, else make(false).
  template <class Make>
  static auto eight_or_plain(int channels, Make make) {
    if (eight_mod_sixteen(channels)) {
      try {
        return make(true);
      } catch (const dnnl::error&) {  // no 8-block kernel on this CPU
      }
    }
    return make(false);
  }

  // `relu`: a ReLU on the output, in the pass that writes it: oneDNN's eltwise post-op,
  // x > 0 ? x : alpha * x on most kernels. With alpha -0 a negative x becomes +0 as in
  // relu_forward (alpha +0 makes -0); an x of -0 becomes +0 where relu_forward keeps it, and
  // some kernels turn a NaN into 0.
  static dnnl::primitive_attr attr(bool relu = false) {
    dnnl::primitive_attr a;
    a.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // the scratchpad lives in the arena
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, -0.f, 0.f);
      a.set_post_ops(ops);
    }
    return a;
  }

  // oneDNN sizes its thread partitioning when a primitive is created, so primitives are
  // rebuilt when the caller's OpenMP thread count changes.
  void sync_threads() {
    const int t = omp_get_max_threads();
    if (t == nthr) return;
    nthr = t;
    hint.reset(), data_hint.reset();
    on_winograd = 0;  // the rebuilt passes decide again (the scratchpad limit follows the threads)
    for (auto& f : fwd) f[0].reset(), f[1].reset();
    bwd_data.reset();
    bwd_w[0].reset(), bwd_w[1].reset();
  }

  // make(algorithm) with Winograd where `pass` asks for it, oneDNN builds it (f32
  // Winograd is AVX-512 only) and its scratchpad is at most winograd_pad_limit(), else with
  // the direct kernels. `hint`: a forward made only to hint a backward pass's descriptor.
  template <class Make>
  auto with_algorithm(unsigned pass, Make make, bool hint = false) {
    if (winograd & pass) {
      try {
        auto pd = make(dnnl::algorithm::convolution_winograd);
        if (pd.scratchpad_desc().get_size() <= winograd_pad_limit()) {
          if (!hint) on_winograd |= pass;
          return pd;
        }
      } catch (const dnnl::error&) {
      }
    }
    return make(dnnl::algorithm::convolution_direct);
  }

  // A forward of the forward's problem, or of the data gradient's (the hint for its).
  dnnl::convolution_forward::primitive_desc fwd_pd(bool bias, bool eight, dnnl::algorithm alg, bool data_problem,
                                                  bool relu) {
    const auto pk = dnnl::prop_kind::forward_training;
    const memory::desc x = act(data_problem ? dx_md : x_md, eight), y = act(data_problem ? dy_md : y_md, eight);
    const memory::dims& pl = data_problem ? bpad_l : pad_l;
    const memory::dims& pr = data_problem ? bpad_r : pad_r;
    auto d = bias ? dnnl::convolution_forward::desc(pk, alg, x, any(w_md), b_md, y, strides, dilates, pl, pr)
                  : dnnl::convolution_forward::desc(pk, alg, x, any(w_md), y, strides, dilates, pl, pr);
    return dnnl::convolution_forward::primitive_desc(d, attr(relu), eng);
  }
  // `hint`: made only to hint a backward pass's descriptor.
  dnnl::convolution_forward::primitive_desc fwd_pd(bool bias, bool data_problem = false, bool hint = false,
                                                   bool relu = false) {
    return with_algorithm(data_problem ? kConvBackwardData : kConvForward,
                          [&](dnnl::algorithm alg) {
                            return eight_or_plain(int(y_md.dims()[1]), [&](bool eight) {
                              return fwd_pd(bias, eight, alg, data_problem, relu);
                            });
                          },
                          hint);
  }
  // The forward a backward pass's descriptor is hinted with: the weight gradient's the
  // forward's problem, the data gradient's its own.
  const dnnl::convolution_forward::primitive_desc& get_hint(bool data_gradient) {
    auto& h = data_gradient ? data_hint : hint;
    if (!h) h = fwd_pd(false, data_gradient, true);
    return *h;
  }

  Fwd& get_fwd(bool bias, bool relu) {
    sync_threads();
    auto& f = fwd[bias][relu];
    if (!f) {
      auto pd = fwd_pd(bias, false, false, relu);
      f.emplace(Fwd{dnnl::convolution_forward(pd), {}, {}, {}, pd.scratchpad_desc().get_size()});
      f->x.init(eng, x_md, pd.src_desc(), false);
      f->w.init(eng, w_md, pd.weights_desc(), false);
      f->y.init(eng, y_md, pd.dst_desc(), true);
    }
    return *f;
  }

  BwdData& get_bwd_data() {
    sync_threads();
    if (!bwd_data) {
      auto make_pd = [&] {
        return with_algorithm(kConvBackwardData, [&](dnnl::algorithm alg) {
          return eight_or_plain(int(x_md.dims()[1]), [&](bool eight) {
            dnnl::convolution_backward_data::desc d(alg, act(dx_md, eight), any(w_md), act(dy_md, eight), strides,
                                                    dilates, bpad_l, bpad_r);
            return dnnl::convolution_backward_data::primitive_desc(d, attr(), eng, get_hint(true));
          });
        });
      };
      auto pd = make_pd();
      if (!frame.empty() && !(on_winograd & kConvBackwardData)) {  // the frame served Winograd only
        unframe_data_gradient();
        pd = make_pd();
      }
      bwd_data.emplace(BwdData{
          dnnl::convolution_backward_data(pd), {}, {}, {}, pd.scratchpad_desc().get_size()});
      bwd_data->dy.init(eng, y_md, pd.diff_dst_desc(), false, frame);
      bwd_data->w.init(eng, w_md, pd.weights_desc(), false);
      bwd_data->dx.init(eng, x_md, pd.diff_src_desc(), true, dx_frame);
    }
    return *bwd_data;
  }

  BwdWeights& get_bwd_weights(bool bias) {
    sync_threads();
    auto& b = bwd_w[bias];
    if (!b) {
      const auto pd = with_algorithm(kConvBackwardWeights, [&](dnnl::algorithm alg) {
        auto d = bias ? dnnl::convolution_backward_weights::desc(alg, any(x_md), any(w_md), b_md, any(y_md),
                                                                 strides, dilates, pad_l, pad_r)
                      : dnnl::convolution_backward_weights::desc(alg, any(x_md), any(w_md), any(y_md), strides,
                                                                 dilates, pad_l, pad_r);
        return dnnl::convolution_backward_weights::primitive_desc(d, attr(), eng, get_hint(false));
      });
      b.emplace(BwdWeights{
          dnnl::convolution_backward_weights(pd), {}, {}, {}, pd.scratchpad_desc().get_size()});
      b->x.init(eng, x_md, pd.src_desc(), false);
      b->dy.init(eng, y_md, pd.diff_dst_desc(), false);
      b->dw.init(eng, w_md, pd.diff_weights_desc(), true);
    }
    return *b;
  }

  // The small-channel kernels' padded bands (conv_small.hpp), in the first reorder slot.
  float* small_scratch(const ConvGeom& g, unsigned pass) {
    const size_t bytes = sizeof(float) * small_conv_scratch_floats(g, pass, omp_get_max_threads());
    return static_cast<float*>(arena->get(kScratchA, bytes));
  }

  memory pad_mem(size_t bytes) {
    return memory({{static_cast<memory::dim>(bytes)}, dt::u8, tag::x}, eng, arena->get(kScratchPad, bytes));
  }

  // The oneDNN passes. dy sits in slot B in both backward ones (x in A for the weights, w
  // for the data), so the weight gradient's reorder of dy, returned, can serve the data's.
  memory run_bwd_weights(const float* x, const float* dy, float* dw, float* dbias) {
    auto& b = get_bwd_weights(dbias != nullptr);
    auto xm = b.x.in(eng, strm, x, *arena, kScratchA);
    auto dym = b.dy.in(eng, strm, dy, *arena, kScratchB);
    auto dwm = b.dw.out(eng, dw, *arena, kScratchC);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, xm},
                                         {DNNL_ARG_DIFF_DST, dym},
                                         {DNNL_ARG_DIFF_WEIGHTS, dwm},
                                         {DNNL_ARG_SCRATCHPAD, pad_mem(b.pad)}};
    if (dbias) args.emplace(DNNL_ARG_DIFF_BIAS, memory(b_md, eng, dbias));
    b.prim.execute(strm, args);
    b.dw.finish(eng, strm, dwm, dw);
    strm.wait();
    return dym;
  }
  void run_bwd_data(const memory& dym, const float* w, float* dx) {
    auto& b = get_bwd_data();
    auto wm = b.w.in(eng, strm, w, *arena, kScratchA);
    auto dxm = b.dx.out(eng, dx, *arena, kScratchC);
    b.prim.execute(strm, {{DNNL_ARG_DIFF_DST, dym},
                          {DNNL_ARG_WEIGHTS, wm},
                          {DNNL_ARG_DIFF_SRC, dxm},
                          {DNNL_ARG_SCRATCHPAD, pad_mem(b.pad)}});
    b.dx.finish(eng, strm, dxm, dx);
    strm.wait();
  }
};

DnnlConv2d::DnnlConv2d(const ConvGeom& g, ScratchArena* arena, ConvKernels kernels) : g_(g), kernels_(kernels) {
  validate(g);
  impl_ = std::make_unique<Impl>(g, arena);
  if (kernels == ConvKernels::Fastest) {
    small_ = small_conv_passes(g);
    impl_->winograd = winograd_passes(g) & ~small_;
    if (impl_->winograd & kConvBackwardData) impl_->frame_data_gradient(g, *winograd_data_problem(g));
  }
}
DnnlConv2d::~DnnlConv2d() = default;
unsigned DnnlConv2d::on_winograd() const { return impl_->on_winograd; }
DnnlConv2d::DnnlConv2d(DnnlConv2d&&) noexcept = default;
DnnlConv2d& DnnlConv2d::operator=(DnnlConv2d&&) noexcept = default;

void DnnlConv2d::forward(const float* x, const float* w, const float* bias, float* y) {
  run_forward(x, w, bias, y, false);
}

void DnnlConv2d::forward_relu(const float* x, const float* w, const float* bias, float* y) {
  run_forward(x, w, bias, y, true);
}

void DnnlConv2d::run_forward(const float* x, const float* w, const float* bias, float* y, bool relu) {
  // Few input channels (3x3, stride 1): the register-blocked kernels write NCHW directly,
  // where oneDNN pads the channels to its blocks and reorders x and y through scratches as
  // large as them (conv_small.hpp; measured in bench/RESULTS.md).
  Impl& m = *impl_;
  if (small_ & kConvForward) {
    small_conv_forward(g_, x, w, bias, y, m.small_scratch(g_, kConvForward), nullptr, relu);
    return;
  }
  auto& f = m.get_fwd(bias != nullptr, relu);
  auto xm = f.x.in(m.eng, m.strm, x, *m.arena, kScratchA);
  auto wm = f.w.in(m.eng, m.strm, w, *m.arena, kScratchB);
  auto ym = f.y.out(m.eng, y, *m.arena, kScratchC);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, xm},
                                       {DNNL_ARG_WEIGHTS, wm},
                                       {DNNL_ARG_DST, ym},
                                       {DNNL_ARG_SCRATCHPAD, m.pad_mem(f.pad)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(m.b_md, m.eng, const_cast<float*>(bias)));
  f.prim.execute(m.strm, args);
  f.y.finish(m.eng, m.strm, ym, y);
  m.strm.wait();
}

bool DnnlConv2d::forward_with_moments(const float* x, const float* w, const float* bias, float* y, double* mean,
                                      double* m2) {
  if (!(small_ & kConvForward) || !small_conv_moments_in_pass(g_)) {
    forward(x, w, bias, y);
    return false;
  }
  MomentsByBlocks moments(g_.n, g_.cout, long(g_.hout()) * g_.wout(), y);
  small_conv_forward(g_, x, w, bias, y, impl_->small_scratch(g_, kConvForward), &moments);
  moments.finish(mean, m2);
  return true;
}

void DnnlConv2d::backward_data(const float* dy, const float* w, float* dx) {
  Impl& m = *impl_;
  if (small_ & kConvBackwardData) {
    small_conv_backward_data(g_, dy, w, dx, m.small_scratch(g_, kConvBackwardData));
    return;
  }
  auto& b = m.get_bwd_data();
  m.run_bwd_data(b.dy.in(m.eng, m.strm, dy, *m.arena, kScratchB), w, dx);
}

// One input channel (the first layer on grey images, at full resolution): the loop
// kernel reads dy once as NCHW, where oneDNN first reorders it into padded blocks.
// Measured, 4x1x1024x768 3x3 1->8, two threads: oneDNN 16.7-23.5 ms, loops 8.3 ms with
// AVX-512 (16.2 ms AVX2, 18.9 ms SSE2 vs 19.1 ms).
bool DnnlConv2d::weights_on_loops() const { return g_.cin == 1 && kernels_ == ConvKernels::Fastest; }

void DnnlConv2d::backward_weights(const float* x, const float* dy, float* dw, float* dbias) {
  if (weights_on_loops()) {
    conv2d_backward_weights<float>(g_, x, dy, dw, dbias);
    return;
  }
  Impl& m = *impl_;
  if (small_ & kConvBackwardWeights) {
    small_conv_backward_weights(g_, x, dy, dw, dbias, m.small_scratch(g_, kConvBackwardWeights));
    return;
  }
  m.run_bwd_weights(x, dy, dw, dbias);
}

void DnnlConv2d::backward(const float* x, const float* dy, const float* w, float* dw, float* dbias,
                          const std::function<float*()>& dx_buffer) {
  Impl& m = *impl_;
  const bool on_onednn = !weights_on_loops() && !(small_ & (kConvBackwardWeights | kConvBackwardData));
  if (dw && on_onednn) {
    // Both passes on oneDNN: when they take dy in the same blocked layout, the weight
    // gradient's reorder of dy (slot B) is the data gradient's too.
    const DnnlPort& weights_dy = m.get_bwd_weights(dbias != nullptr).dy;
    if (weights_dy.to_prim && weights_dy.prim == m.get_bwd_data().dy.prim) {
      const memory dym = m.run_bwd_weights(x, dy, dw, dbias);
      if (float* dx = dx_buffer()) m.run_bwd_data(dym, w, dx);
      return;
    }
  }
  if (dw) backward_weights(x, dy, dw, dbias);
  if (float* dx = dx_buffer()) backward_data(dy, w, dx);
}

ConvScratch DnnlConv2d::scratch_need(unsigned passes) const {
  Impl& m = *impl_;
  ConvScratch need;
  auto add = [&need](const DnnlPort& a, const DnnlPort& b, const DnnlPort& c, size_t pad) {
    ConvScratch s;
    s.slot[kScratchA] = a.extra_bytes(), s.slot[kScratchB] = b.extra_bytes();
    s.slot[kScratchC] = c.extra_bytes(), s.slot[kScratchPad] = pad;
    need.include(s);
  };
  // Passes that run the small-channel kernels take their bands in slot A; the loop
  // kernels (the weight gradient at one input channel) take no scratch.
  const unsigned small = small_;
  for (unsigned pass : {kConvForward, kConvBackwardData, kConvBackwardWeights}) {
    if (!(passes & small & pass)) continue;
    ConvScratch s;
    s.slot[kScratchA] = sizeof(float) * small_conv_scratch_floats(g_, pass, omp_get_max_threads());
    need.include(s);
  }
  if ((passes & kConvForward) && !(small & kConvForward)) {
    for (bool bias : {false, true})
      for (bool relu : {false, true}) {  // forward_relu's primitive may ask for another scratchpad
        auto& f = m.get_fwd(bias, relu);
        add(f.x, f.w, f.y, f.pad);
      }
  }
  if ((passes & kConvBackwardData) && !(small & kConvBackwardData)) {
    auto& d = m.get_bwd_data();
    add(d.w, d.dy, d.dx, d.pad);
  }
  if ((passes & kConvBackwardWeights) && !weights_on_loops() && !(small & kConvBackwardWeights)) {
    for (bool bias : {false, true}) {
      auto& w = m.get_bwd_weights(bias);
      add(w.x, w.dy, w.dw, w.pad);
    }
  }
  return need;
}

ConvScratch dnnl_conv_scratch(const ConvGeom& g, unsigned passes, int threads) {
  using Key = std::array<int, 18>;
  const Key key{g.n,         g.cin,        g.hin,      g.win,       g.cout,   g.kh,
                g.kw,        g.stride_h,   g.stride_w, g.dil_h,     g.dil_w,  g.pad_top,
                g.pad_bottom, g.pad_left,  g.pad_right, g.groups,   int(passes), threads};
  static std::mutex mutex;
  static std::map<Key, ConvScratch> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  // oneDNN reads the thread count of the calling thread when it makes a primitive.
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  const ConvScratch need = DnnlConv2d(g).scratch_need(passes);
  omp_set_num_threads(before);
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, need).first->second;
}

}  // namespace ht::cpu
