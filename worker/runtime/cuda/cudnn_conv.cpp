// Convolutions through cuDNN's legacy API (cudnnConvolutionForward / BackwardData /
// BackwardFilter), present in cuDNN 8 and 9, so one source serves CUDA 11.x on K80 and
// CUDA 12/13 on current GPUs.
//
// Asymmetric padding: cuDNN pads both sides of an axis equally. We give cuDNN the smaller
// pad m = min(top, bottom) and make the rest explicit: the input is copied into a zeroed
// buffer with (top - m) extra rows above and (bottom - m) below (likewise for columns).
// cuDNN then sees exactly the requested window positions and output size; backward data
// runs on the padded shape and the interior is cropped out. Symmetric layers skip the copy.
#include <cudnn.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch.hpp"
#include "worker/runtime/cuda/cuda_backend.hpp"

static_assert(CUDNN_MAJOR >= 8, "halotrain needs cuDNN 8 or 9 (legacy convolution API, FMA math mode)");

namespace ht::cuda {

struct CudnnContext {
  cudnnHandle_t handle = nullptr;
};

CudnnContext* create_cudnn_context() {
  auto ctx = std::make_unique<CudnnContext>();
  CUDNN_CHECK(cudnnCreate(&ctx->handle));  // bound to the current device and stream 0
  return ctx.release();
}

void destroy_cudnn_context(CudnnContext* ctx) {
  if (!ctx) return;
  (void)cudnnDestroy(ctx->handle);
  delete ctx;
}

namespace {

std::string describe(const ConvGeom& g) {
  auto s = [](int v) { return std::to_string(v); };
  return "conv [" + s(g.n) + "," + s(g.cin) + "," + s(g.hin) + "," + s(g.win) + "] -> " + s(g.cout) + " k" +
         s(g.kh) + "x" + s(g.kw) + " s" + s(g.stride_h) + "x" + s(g.stride_w) + " d" + s(g.dil_h) + "x" +
         s(g.dil_w) + " pad t" + s(g.pad_top) + " b" + s(g.pad_bottom) + " l" + s(g.pad_left) + " r" +
         s(g.pad_right) + (g.groups > 1 ? " groups " + s(g.groups) : "");
}

void validate(const ConvGeom& g) {
  const bool ok = g.n > 0 && g.cin > 0 && g.hin > 0 && g.win > 0 && g.cout > 0 && g.kh > 0 && g.kw > 0 &&
                  g.stride_h > 0 && g.stride_w > 0 && g.dil_h > 0 && g.dil_w > 0 && g.pad_top >= 0 &&
                  g.pad_bottom >= 0 && g.pad_left >= 0 && g.pad_right >= 0 && g.hout() > 0 && g.wout() > 0 &&
                  g.groups > 0 && g.cin % g.groups == 0 && g.cout % g.groups == 0;
  if (!ok) throw std::invalid_argument("cuda " + describe(g) + ": invalid geometry");
}

// cuDNN's legacy descriptors take int sizes: larger tensors must be split by a larger grid.
void check_int_size(const ConvGeom& g, long long elements, const char* what) {
  if (elements > INT_MAX)
    throw std::runtime_error("cuda " + describe(g) + ": the " + what + " has " + std::to_string(elements) +
                             " elements, over cuDNN's 2^31 limit per tensor; use a larger parallel.grid");
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { (void)cudnnDestroyTensorDescriptor(d); }
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { CUDNN_CHECK(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { (void)cudnnDestroyFilterDescriptor(d); }
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(d); }
};

struct Choice {
  int algo;
  size_t workspace;
};

// Heuristic order, deterministic algorithms first (same bits every run), each with the
// workspace cuDNN reports for this descriptor, within the limit.
template <class Perf, class SizeOf>
std::vector<Choice> rank(const std::vector<Perf>& perf, int returned, SizeOf size_of) {
  std::vector<Choice> det, other;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    size_t bytes = 0;
    if (!size_of(perf[i].algo, &bytes) || bytes > kConvWorkspaceLimit) continue;
    (perf[i].determinism == CUDNN_DETERMINISTIC ? det : other).push_back({int(perf[i].algo), bytes});
  }
  det.insert(det.end(), other.begin(), other.end());
  return det;
}

class CudnnConv final : public ConvKernel {
 public:
  CudnnConv(CudaBackend& backend, const ConvGeom& g);
  void forward(const float* x, const float* w, const float* bias, float* y) override;
  void backward_data(const float* dy, const float* w, float* dx) override;
  void backward_weights(const float* x, const float* dy, float* dw, float* db) override;

 private:
  size_t padded_count() const { return size_t(g_.n) * g_.cin * hp_ * wp_; }
  const float* padded_input(const float* x);
  template <class Run>
  void with_workspace(const std::vector<Choice>& choices, Run run);

  CudaBackend& backend_;
  ConvGeom g_;
  int extra_top_, extra_left_, hp_, wp_;
  bool padded_;
  TensorDesc x_desc_, y_desc_;
  FilterDesc w_desc_;
  ConvDesc conv_desc_;
  std::vector<Choice> fwd_, bwd_data_, bwd_filter_;
};

CudnnConv::CudnnConv(CudaBackend& backend, const ConvGeom& g) : backend_(backend), g_(g) {
  validate(g);
  const int mh = std::min(g.pad_top, g.pad_bottom), mw = std::min(g.pad_left, g.pad_right);
  extra_top_ = g.pad_top - mh;
  extra_left_ = g.pad_left - mw;
  hp_ = g.hin + extra_top_ + (g.pad_bottom - mh);
  wp_ = g.win + extra_left_ + (g.pad_right - mw);
  padded_ = hp_ != g.hin || wp_ != g.win;
  const int ho = g.hout(), wo = g.wout();
  check_int_size(g, 1LL * g.n * g.cin * hp_ * wp_, "input");
  check_int_size(g, 1LL * g.n * g.cout * ho * wo, "output");

  cudnnHandle_t h = backend.cudnn().handle;
  CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(x_desc_.d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.n, g.cin, hp_, wp_));
  CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(y_desc_.d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.n, g.cout, ho, wo));
  CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(w_desc_.d, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, g.cout, g.cin_per_group(), g.kh, g.kw));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_desc_.d, mh, mw, g.stride_h, g.stride_w, g.dil_h, g.dil_w,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // FP32 FMA kernels only: the default math mode lets Ampere and later use TF32 tensor
  // cores, whose 10-bit mantissa would break the float32-vs-reference tolerance.
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_.d, CUDNN_FMA_MATH));
  CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_desc_.d, g.groups));  // depthwise: groups = cin

  int n = 0, c = 0, oh = 0, ow = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_.d, x_desc_.d, w_desc_.d, &n, &c, &oh, &ow));
  if (n != g.n || c != g.cout || oh != ho || ow != wo)
    throw std::logic_error("cuda " + describe(g) + ": cuDNN output " + std::to_string(oh) + "x" +
                           std::to_string(ow) + " differs from the geometry's");

  int max_count = 0, returned = 0;
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(max_count);
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_desc_.d, w_desc_.d, conv_desc_.d, y_desc_.d,
                                                     max_count, &returned, fwd.data()));
  fwd_ = rank(fwd, returned, [&](cudnnConvolutionFwdAlgo_t a, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, x_desc_.d, w_desc_.d, conv_desc_.d, y_desc_.d, a,
                                                   bytes) == CUDNN_STATUS_SUCCESS;
  });

  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd_data(max_count);
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_desc_.d, y_desc_.d, conv_desc_.d, x_desc_.d,
                                                          max_count, &returned, bwd_data.data()));
  bwd_data_ = rank(bwd_data, returned, [&](cudnnConvolutionBwdDataAlgo_t a, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_desc_.d, y_desc_.d, conv_desc_.d, x_desc_.d, a,
                                                        bytes) == CUDNN_STATUS_SUCCESS;
  });

  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwd_filter(max_count);
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_desc_.d, y_desc_.d, conv_desc_.d, w_desc_.d,
                                                            max_count, &returned, bwd_filter.data()));
  bwd_filter_ = rank(bwd_filter, returned, [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_desc_.d, y_desc_.d, conv_desc_.d, w_desc_.d, a,
                                                          bytes) == CUDNN_STATUS_SUCCESS;
  });

  if (fwd_.empty() || bwd_data_.empty() || bwd_filter_.empty())
    throw std::runtime_error("cuda " + describe(g) + ": cuDNN offers no FP32 algorithm within the " +
                             std::to_string(kConvWorkspaceLimit >> 20) + " MiB workspace limit");
}

// Tries the ranked algorithms until one's workspace can be had under the device budget;
// the last failure (a DeviceMemoryError naming the workspace) propagates.
template <class Run>
void CudnnConv::with_workspace(const std::vector<Choice>& choices, Run run) {
  for (size_t i = 0; i < choices.size(); ++i) {
    void* ws = nullptr;
    if (choices[i].workspace) {
      try {
        ws = backend_.conv_workspace().get(choices[i].workspace);
      } catch (const DeviceMemoryError&) {
        if (i + 1 == choices.size()) throw;
        continue;
      }
    }
    run(choices[i].algo, ws, choices[i].workspace);
    return;
  }
}

const float* CudnnConv::padded_input(const float* x) {
  if (!padded_) return x;
  float* xp = backend_.conv_padded().get_as<float>(padded_count());
  CUDA_CHECK(cudaMemsetAsync(xp, 0, padded_count() * sizeof(float), 0));
  launch_unpack_rect(x, g_.n * g_.cin, hp_, wp_, extra_top_, extra_left_, g_.hin, g_.win, xp, false);
  return xp;
}

void CudnnConv::forward(const float* x, const float* w, const float* bias, float* y) {
  backend_.bind();
  cudnnHandle_t h = backend_.cudnn().handle;
  const float* in = padded_input(x);
  const float one = 1.f, zero = 0.f;
  with_workspace(fwd_, [&](int algo, void* ws, size_t bytes) {
    CUDNN_CHECK(cudnnConvolutionForward(h, &one, x_desc_.d, in, w_desc_.d, w, conv_desc_.d,
                                        cudnnConvolutionFwdAlgo_t(algo), ws, bytes, &zero, y_desc_.d, y));
  });
  if (bias) launch_add_channel_bias(g_.n, g_.cout, int64_t(g_.hout()) * g_.wout(), bias, y);
}

void CudnnConv::backward_data(const float* dy, const float* w, float* dx) {
  backend_.bind();
  cudnnHandle_t h = backend_.cudnn().handle;
  float* out = padded_ ? backend_.conv_padded().get_as<float>(padded_count()) : dx;
  const float one = 1.f, zero = 0.f;
  with_workspace(bwd_data_, [&](int algo, void* ws, size_t bytes) {
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, w_desc_.d, w, y_desc_.d, dy, conv_desc_.d,
                                             cudnnConvolutionBwdDataAlgo_t(algo), ws, bytes, &zero, x_desc_.d,
                                             out));
  });
  // The gradient of the explicit padding is dropped: those pixels are not inputs.
  if (padded_) launch_pack_rect(out, g_.n * g_.cin, hp_, wp_, extra_top_, extra_left_, g_.hin, g_.win, dx);
}

void CudnnConv::backward_weights(const float* x, const float* dy, float* dw, float* db) {
  backend_.bind();
  if (dw) {
    cudnnHandle_t h = backend_.cudnn().handle;
    const float* in = padded_input(x);
    const float one = 1.f, zero = 0.f;
    with_workspace(bwd_filter_, [&](int algo, void* ws, size_t bytes) {
      CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, x_desc_.d, in, y_desc_.d, dy, conv_desc_.d,
                                                 cudnnConvolutionBwdFilterAlgo_t(algo), ws, bytes, &zero,
                                                 w_desc_.d, dw));
    });
  }
  if (db) {
    // Our own fixed-shape reduction rather than cudnnConvolutionBackwardBias: deterministic.
    const int64_t hw = int64_t(g_.hout()) * g_.wout();
    const int blocks = reduce_blocks(int64_t(g_.n) * hw);
    double* part = backend_.partials().get_as<double>(size_t(g_.cout) * blocks);
    launch_channel_sum(g_.n, g_.cout, hw, dy, blocks, part);
    launch_finish_sums(g_.cout, blocks, part, db);
  }
}

}  // namespace

std::unique_ptr<ConvKernel> make_cudnn_conv(CudaBackend& backend, const ConvGeom& geom) {
  return std::make_unique<CudnnConv>(backend, geom);
}

}  // namespace ht::cuda
