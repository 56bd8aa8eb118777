// The element-wise activations besides ReLU (which has kernels of its own), shared by the
// CPU and CUDA kernels and the layers that run them.
#pragma once

namespace ht {

enum class Activation {
  LeakyReLU,  // x > 0 ? x : alpha * x (alpha >= 0)
  Sigmoid,    // 1 / (1 + exp(-x))
  Tanh,
};

}  // namespace ht
