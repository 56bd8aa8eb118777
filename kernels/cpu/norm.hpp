// Batch-norm pieces. Statistics span the batch and every shard of an image, so the caller
// reduces the partial sums across ranks between the pieces:
//   forward : channel_moments -> (allreduce the sums) mean -> each rank's squared
//             deviations about it from its own moments -> (allreduce) invstd =
//             1/sqrt(var + eps) -> bn_forward_apply. One pass over x; channel_sum and
//             channel_sq_dev_sum are the two-pass form (CUDA).
//   backward: bn_backward_sums -> (allreduce) -> bn_backward_apply
// Sums are double and accumulate (+=) so a caller can add several tensors into one.
#pragma once

#include <memory>

namespace ht::cpu {

// The moments of each channel of x in one pass: mean[c] and m2[c] = sum of (x - mean[c])^2
// over n, hw (overwritten). Blocks of a plane small enough for L1 are read twice (a centre
// near their mean, then the deviations from it), and blocks, then planes in plane order,
// are merged by Chan's formula in double: exact for pixels around 1e4 with a small
// spread, and the same for any thread count.
template <class T>
void channel_moments(int n, int c, long hw, const T* x, double* mean, double* m2);

// The elements of a plane that channel_moments sums in float before going to double: its
// blocks start at the plane's first element.
constexpr long kMomentsBlock = 1024;

// channel_moments of float x made while x is being written, by whoever writes it: the
// blocks of a plane that lie wholly within a range its writer has just written are summed
// there (while the range is in cache), finish() sums the rest and merges them all as
// channel_moments does, with the same bits. add_range is safe from several threads on
// disjoint ranges.
class MomentsByBlocks {
 public:
  MomentsByBlocks(int n, int c, long hw, const float* x);
  ~MomentsByBlocks();
  // Elements [from, to) of plane (image, channel), written.
  void add_range(int image, int channel, long from, long to);
  void finish(double* mean, double* m2);

 private:
  struct Blocks;
  std::unique_ptr<Blocks> blocks_;
};

// sum[c] += sum over n, hw of x.
template <class T>
void channel_sum(int n, int c, long hw, const T* x, double* sum);
// out[c] += sum over n, hw of (x - mean[c])^2 (two-pass variance: no cancellation).
template <class T>
void channel_sq_dev_sum(int n, int c, long hw, const T* x, const double* mean, double* out);
// y = (x - mean) * invstd * gamma + beta; a null gamma is 1, a null beta 0 (batch norm
// without scale or center).
template <class T>
void bn_forward_apply(int n, int c, long hw, const T* x, const double* mean, const double* invstd,
                      const T* gamma, const T* beta, T* y);
// y = relu((x - mean) * invstd * gamma + beta): the bits of bn_forward_apply, then
// relu_forward (elementwise.hpp), in one pass (the step schedule's batch norm + ReLU chain).
template <class T>
void bn_relu_forward(int n, int c, long hw, const T* x, const double* mean, const double* invstd, const T* gamma,
                     const T* beta, T* y);
// sum_dy[c] += sum dy; sum_dy_xhat[c] += sum dy * (x - mean) * invstd.
template <class T>
void bn_backward_sums(int n, int c, long hw, const T* dy, const T* x, const double* mean,
                      const double* invstd, double* sum_dy, double* sum_dy_xhat);
// dx = gamma*invstd*(dy - sum_dy/count - xhat*sum_dy_xhat/count); count = global N*H*W.
// dgamma = sum_dy_xhat and dbeta = sum_dy (after the reduction) are the caller's.
template <class T>
void bn_backward_apply(int n, int c, long hw, const T* dy, const T* x, const double* mean,
                       const double* invstd, const T* gamma, const double* sum_dy,
                       const double* sum_dy_xhat, double count, T* dx);
// The batch norm's backward under a ReLU (the step schedule's batch norm + ReLU chain): the
// two above for the gradient relu_backward(y, dy) passes down, y the ReLU's output, with
// the same bits, without writing that gradient. dx may be dy.
template <class T>
void bn_relu_backward_sums(int n, int c, long hw, const T* dy, const T* y, const T* x, const double* mean,
                           const double* invstd, double* sum_dy, double* sum_dy_xhat);
template <class T>
void bn_relu_backward_apply(int n, int c, long hw, const T* dy, const T* y, const T* x, const double* mean,
                            const double* invstd, const T* gamma, const double* sum_dy, const double* sum_dy_xhat,
                            double count, T* dx);

// The same pieces per (image, channel) plane p < n * c, for the normalisations whose
// statistics are per image (instance and group norm); the caller turns plane sums into
// group statistics and per-plane coefficients. Sums are overwritten.
// out[p] = sum over plane p of (x - mean[p])^2.
template <class T>
void plane_sq_dev_sum(int n, int c, long hw, const T* x, const double* mean, double* out);
// y = (x - mean[p]) * scale[p] + shift[p].
template <class T>
void plane_affine(int n, int c, long hw, const T* x, const double* mean, const double* scale, const double* shift,
                  T* y);
// sum_dy[p] = sum dy; sum_dy_dev[p] = sum dy * (x - mean[p]).
template <class T>
void plane_backward_sums(int n, int c, long hw, const T* dy, const T* x, const double* mean, double* sum_dy,
                         double* sum_dy_dev);
// dx = k[p] * dy + a[p] * (x - mean[p]) + b[p].
template <class T>
void plane_backward_apply(int n, int c, long hw, const T* dy, const T* x, const double* mean, const double* k,
                          const double* a, const double* b, T* dx);

}  // namespace ht::cpu
