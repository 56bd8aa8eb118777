// CudaBackend's normalisations: batch norm's per-channel statistics and elementwise
// halves, the fused batch norm + ReLU + tiling max pool, and instance and group norm's
// per-plane pieces. Per-channel values travel as host doubles (upload, finish_on_host).
#include <stdexcept>

#include "kernels/cuda/launch.hpp"
#include "worker/runtime/cuda/cuda_backend.hpp"

namespace ht::cuda {
namespace {

void check_norm_pool(const NormPoolShape& s) {
  if (!s.valid())
    throw std::invalid_argument("cuda bn_relu_max_pool: bad shape (sizes >= 1, kh * kw < 255, a window per plane)");
}

}  // namespace

void CudaBackend::channel_sum(int n, int c, int64_t hw, const float* x, double* host_sum) {
  bind();
  const int blocks = reduce_blocks(int64_t(n) * hw);
  double* part = partials_.get_as<double>(size_t(c) * blocks);
  launch_channel_sum(n, c, hw, x, blocks, part);
  finish_on_host(part, c, blocks, host_sum);
}

void CudaBackend::channel_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* host_mean,
                                     double* host_out) {
  bind();
  const auto dev = upload({{host_mean, size_t(c)}});
  const int blocks = reduce_blocks(int64_t(n) * hw);
  double* part = partials_.get_as<double>(size_t(c) * blocks);
  launch_channel_sq_dev_sum(n, c, hw, x, dev[0], blocks, part);
  finish_on_host(part, c, blocks, host_out);
}

void CudaBackend::bn_forward_apply(int n, int c, int64_t hw, const float* x, const double* host_mean,
                                   const double* host_invstd, const float* gamma, const float* beta,
                                   float* y) {
  bind();
  const auto dev = upload({{host_mean, size_t(c)}, {host_invstd, size_t(c)}});
  launch_bn_forward_apply(n, c, hw, x, dev[0], dev[1], gamma, beta, y);
}

void CudaBackend::bn_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x,
                                   const double* host_mean, const double* host_invstd, double* host_sum_dy,
                                   double* host_sum_dy_xhat) {
  bind();
  const auto dev = upload({{host_mean, size_t(c)}, {host_invstd, size_t(c)}});
  const int blocks = reduce_blocks(int64_t(n) * hw);
  double* part = partials_.get_as<double>(size_t(2) * c * blocks);
  launch_bn_backward_sums(n, c, hw, dy, x, dev[0], dev[1], blocks, part);
  finish_on_host(part, c, blocks, host_sum_dy);
  finish_on_host(part + size_t(c) * blocks, c, blocks, host_sum_dy_xhat);
}

void CudaBackend::bn_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x,
                                    const double* host_mean, const double* host_invstd, const float* gamma,
                                    const double* host_sum_dy, const double* host_sum_dy_xhat, double count,
                                    float* dx) {
  if (!(count > 0)) throw std::invalid_argument("cuda bn_backward_apply: count must be > 0");
  bind();
  const size_t cc = size_t(c);
  const auto dev = upload({{host_mean, cc}, {host_invstd, cc}, {host_sum_dy, cc}, {host_sum_dy_xhat, cc}});
  launch_bn_backward_apply(n, c, hw, dy, x, dev[0], dev[1], gamma, dev[2], dev[3], count, dx);
}

void CudaBackend::bn_relu_max_pool_forward(const NormPoolShape& s, const float* x, const double* host_mean,
                                           const double* host_invstd, const float* gamma, const float* beta,
                                           float* y, uint8_t* argmax) {
  check_norm_pool(s);
  bind();
  const auto dev = upload({{host_mean, size_t(s.c)}, {host_invstd, size_t(s.c)}});
  launch_bn_relu_max_pool_forward(s, x, dev[0], dev[1], gamma, beta, y, argmax);
}

void CudaBackend::bn_relu_max_pool_backward_sums(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                                 const float* x, const double* host_mean,
                                                 const double* host_invstd, double* host_sum_dy,
                                                 double* host_sum_dy_xhat) {
  check_norm_pool(s);
  bind();
  const auto dev = upload({{host_mean, size_t(s.c)}, {host_invstd, size_t(s.c)}});
  const int blocks = reduce_blocks(int64_t(s.n) * s.ho() * s.wo());
  double* part = partials_.get_as<double>(size_t(2) * s.c * blocks);
  launch_bn_relu_max_pool_backward_sums(s, dy, argmax, x, dev[0], dev[1], blocks, part);
  finish_on_host(part, s.c, blocks, host_sum_dy);
  finish_on_host(part + size_t(s.c) * blocks, s.c, blocks, host_sum_dy_xhat);
}

void CudaBackend::bn_relu_max_pool_backward_apply(const NormPoolShape& s, const float* dy, const uint8_t* argmax,
                                                  const float* x, const double* host_mean,
                                                  const double* host_invstd, const float* gamma,
                                                  const double* host_sum_dy, const double* host_sum_dy_xhat,
                                                  double count, float* dx) {
  check_norm_pool(s);
  if (!(count > 0)) throw std::invalid_argument("cuda bn_relu_max_pool_backward_apply: count must be > 0");
  bind();
  const size_t cc = size_t(s.c);
  const auto dev = upload({{host_mean, cc}, {host_invstd, cc}, {host_sum_dy, cc}, {host_sum_dy_xhat, cc}});
  launch_bn_relu_max_pool_backward_apply(s, dy, argmax, x, dev[0], dev[1], gamma, dev[2], dev[3], count, dx);
}

void CudaBackend::plane_sq_dev_sum(int n, int c, int64_t hw, const float* x, const double* host_mean,
                                   double* host_out) {
  bind();
  const int planes = n * c, blocks = reduce_blocks(hw);
  const auto dev = upload({{host_mean, size_t(planes)}});
  double* part = partials_.get_as<double>(size_t(planes) * blocks);
  launch_plane_sq_dev_sum(planes, hw, x, dev[0], blocks, part);
  finish_on_host(part, planes, blocks, host_out);
}

void CudaBackend::plane_affine(int n, int c, int64_t hw, const float* x, const double* host_mean,
                               const double* host_scale, const double* host_shift, float* y) {
  bind();
  const int planes = n * c;
  const size_t pp = size_t(planes);
  const auto dev = upload({{host_mean, pp}, {host_scale, pp}, {host_shift, pp}});
  launch_plane_affine(planes, hw, x, dev[0], dev[1], dev[2], y);
}

void CudaBackend::plane_backward_sums(int n, int c, int64_t hw, const float* dy, const float* x,
                                      const double* host_mean, double* host_sum_dy, double* host_sum_dy_dev) {
  bind();
  const int planes = n * c, blocks = reduce_blocks(hw);
  const auto dev = upload({{host_mean, size_t(planes)}});
  double* part = partials_.get_as<double>(size_t(2) * planes * blocks);
  launch_plane_backward_sums(planes, hw, dy, x, dev[0], blocks, part);
  finish_on_host(part, planes, blocks, host_sum_dy);
  finish_on_host(part + size_t(planes) * blocks, planes, blocks, host_sum_dy_dev);
}

void CudaBackend::plane_backward_apply(int n, int c, int64_t hw, const float* dy, const float* x,
                                       const double* host_mean, const double* host_k, const double* host_a,
                                       const double* host_b, float* dx) {
  bind();
  const int planes = n * c;
  const size_t pp = size_t(planes);
  const auto dev = upload({{host_mean, pp}, {host_k, pp}, {host_a, pp}, {host_b, pp}});
  launch_plane_backward_apply(planes, hw, dy, x, dev[0], dev[1], dev[2], dev[3], dx);
}

}  // namespace ht::cuda
