// Optimizer steps on flat float parameter arrays, matching PyTorch 1.13 (foreach=False).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ht::cpu {

// v = momentum*v + g; w -= lr*v. With momentum == 0: w -= lr*g and v may be null.
// v starts at zero, which equals torch's first-step `buf = g.clone()`.
void sgd_step(size_t n, float* w, const float* g, float* v, float lr, float momentum);

// torch.optim.Adam, single-tensor path; `step` is the 1-based count after this update.
// Hyper-parameters are double because torch holds them as Python floats: 1 - beta2 from a
// float beta2 = 0.999f would be off by 1.3e-5 relative. Bias corrections in double,
// tensor arithmetic in float, as torch.
void adam_step(size_t n, float* w, const float* g, float* m, float* v, double lr, double beta1,
               double beta2, double eps, int64_t step);

}  // namespace ht::cpu
