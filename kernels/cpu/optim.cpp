#include "kernels/cpu/optim.hpp"

#include <cmath>
#include <stdexcept>

namespace ht::cpu {

void sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum) {
  if (momentum == 0.0f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
    return;
  }
  if (!v) throw std::invalid_argument("sgd_step: momentum needs a velocity buffer");
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    v[i] = momentum * v[i] + g[i];
    w[i] -= lr * v[i];
  }
}

void adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr, double beta1,
               double beta2, double eps, int64_t step) {
  if (step < 1) throw std::invalid_argument("adam_step: step must be >= 1");
  // Scalars are formed in double and cast to float where torch's float kernels cast them.
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2)), feps = float(eps);
  const float fb1 = float(beta1), f1b1 = float(1.0 - beta1);
  const float fb2 = float(beta2), f1b2 = float(1.0 - beta2);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    m[i] = m[i] * fb1 + f1b1 * g[i];
    v[i] = v[i] * fb2 + f1b2 * g[i] * g[i];  // addcmul_ order
    const float denom = std::sqrt(v[i]) / bc2_sqrt + feps;
    w[i] += -step_size * (m[i] / denom);
  }
}

}  // namespace ht::cpu
