// The element-wise activations besides ReLU (which has kernels of its own): what each
// computes, forward and backward, written once for the CPU and CUDA kernels. PyTorch's
// definitions (the oracle), including where a derivative at a kink is taken.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define HT_ACT_HD __host__ __device__
#else
#define HT_ACT_HD
#endif

namespace ht {

enum class Activation {
  LeakyReLU,    // x > 0 ? x : alpha * x (alpha >= 0)
  Sigmoid,      // 1 / (1 + exp(-x))
  Tanh,
  ReLU6,        // F.relu6 = hardtanh(x, 0, 6): the gradient passes where 0 < x < 6
  Clip,         // torch.clamp(x, alpha, beta): the gradient passes where alpha <= x <= beta
  SiLU,         // x * sigmoid(x) (Keras swish)
  HardSigmoid,  // clamp(alpha * x + beta, 0, 1), as a clamp (Keras 0.2, 0.5; torch 1/6, 0.5)
  HardSwish,    // x * relu6(x + 3) / 6 (torch's gradient: 0 below -3, x / 3 + 0.5 up to 3, 1 above)
  GELU,         // x * Phi(x), Phi the normal CDF (erf)
  GELUTanh,     // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
};

// The parameters an activation takes: LeakyReLU's slope (alpha), Clip's bounds and
// HardSigmoid's line (alpha, beta).
struct ActivationArgs {
  float alpha = 0.f, beta = 0.f;
};

namespace act {

// The C math functions by type, the same functions on the host (std::exp(float) is expf)
// and on the device.
HT_ACT_HD inline float exp(float x) { return expf(x); }
HT_ACT_HD inline double exp(double x) { return ::exp(x); }
HT_ACT_HD inline float fabs(float x) { return fabsf(x); }
HT_ACT_HD inline double fabs(double x) { return ::fabs(x); }
HT_ACT_HD inline float tanh(float x) { return tanhf(x); }
HT_ACT_HD inline double tanh(double x) { return ::tanh(x); }
HT_ACT_HD inline float erf(float x) { return erff(x); }
HT_ACT_HD inline double erf(double x) { return ::erf(x); }

template <class T>
HT_ACT_HD inline T sigmoid(T x) {
  // exp of a non-positive argument only: no overflow for large |x|.
  const T e = exp(-fabs(x));
  return x >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
}

template <class T>
HT_ACT_HD inline T gelu_tanh_inner(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2 / pi)
  return k * (x + T(0.044715) * x * x * x);
}

}  // namespace act

template <class T>
HT_ACT_HD inline T activation_value(Activation f, ActivationArgs a, T x) {
  switch (f) {
    case Activation::LeakyReLU: return x > T(0) ? x : T(a.alpha) * x;
    case Activation::Sigmoid: return act::sigmoid(x);
    case Activation::Tanh: return act::tanh(x);
    case Activation::ReLU6: return x < T(0) ? T(0) : (x > T(6) ? T(6) : x);
    case Activation::Clip: return x < T(a.alpha) ? T(a.alpha) : (x > T(a.beta) ? T(a.beta) : x);
    case Activation::SiLU: return x * act::sigmoid(x);
    case Activation::HardSigmoid: {
      const T z = T(a.alpha) * x + T(a.beta);
      return z < T(0) ? T(0) : (z > T(1) ? T(1) : z);
    }
    case Activation::HardSwish: {
      const T r = x + T(3);
      return x * (r < T(0) ? T(0) : (r > T(6) ? T(6) : r)) / T(6);
    }
    case Activation::GELU: return T(0.5) * x * (T(1) + act::erf(x * T(0.7071067811865476)));
    case Activation::GELUTanh: return T(0.5) * x * (T(1) + act::tanh(act::gelu_tanh_inner(x)));
  }
  return x;
}

// What activation_gradient reads besides dy: the input x, the output y. Where it reads one
// only, the other may be gone by the backward (LayerTraits::backward_reads_inputs,
// backward_reads_output) and any pointer of the right size stands for it.
struct ActivationReads {
  bool input = true, output = true;
};
constexpr ActivationReads gradient_reads(Activation f) {
  switch (f) {
    case Activation::LeakyReLU:  // the sign of y is the sign of x (alpha >= 0)
    case Activation::Sigmoid:
    case Activation::Tanh: return {false, true};
    default: return {true, false};
  }
}

// dy * f'(x), from the input x and the output y = f(x).
template <class T>
HT_ACT_HD inline T activation_gradient(Activation f, ActivationArgs a, T x, T y, T dy) {
  switch (f) {
    case Activation::LeakyReLU: return y > T(0) ? dy : T(a.alpha) * dy;  // as torch, alpha at 0
    case Activation::Sigmoid: return dy * y * (T(1) - y);
    case Activation::Tanh: return dy * (T(1) - y * y);
    case Activation::ReLU6: return x > T(0) && x < T(6) ? dy : T(0);
    case Activation::Clip: return x >= T(a.alpha) && x <= T(a.beta) ? dy : T(0);
    case Activation::SiLU: {
      const T s = act::sigmoid(x);
      return dy * s * (T(1) + x * (T(1) - s));
    }
    case Activation::HardSigmoid: {
      const T z = T(a.alpha) * x + T(a.beta);
      return z >= T(0) && z <= T(1) ? dy * T(a.alpha) : T(0);
    }
    case Activation::HardSwish:
      return x < T(-3) ? T(0) : (x <= T(3) ? dy * (x / T(3) + T(0.5)) : dy);
    case Activation::GELU: {
      const T cdf = T(0.5) * (T(1) + act::erf(x * T(0.7071067811865476)));
      const T pdf = act::exp(T(-0.5) * x * x) * T(0.3989422804014327);  // 1 / sqrt(2 pi)
      return dy * (cdf + x * pdf);
    }
    case Activation::GELUTanh: {
      const T k = T(0.7978845608028654), t = act::tanh(act::gelu_tanh_inner(x));
      const T inner_grad = k * (T(1) + T(3) * T(0.044715) * x * x);
      return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * inner_grad);
    }
  }
  return dy;
}

}  // namespace ht
