// Losses computed in double whatever T is: they are cheap and feed the reported loss.
#include "kernels/cpu/loss.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace ht::cpu {

template <class T>
double softmax_xent(int n, int k, const T* logits, const int32_t* labels, double grad_scale,
                    T* grad, const LossWeights& w) {
  for (int i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= k)
      throw std::out_of_range("softmax_xent: label " + std::to_string(labels[i]) + " of sample " +
                              std::to_string(i) + " outside [0, " + std::to_string(k) + ")");
  double total = 0;
  for (int i = 0; i < n; ++i) {
    const T* z = logits + size_t(i) * k;
    double m = z[0];
    for (int j = 1; j < k; ++j) m = std::fmax(m, double(z[j]));
    double se = 0;
    for (int j = 0; j < k; ++j) se += std::exp(double(z[j]) - m);
    const double lse = m + std::log(se), c = w.of_class(labels[i]);
    total += c * (lse - double(z[labels[i]]));
    if (grad)
      for (int j = 0; j < k; ++j) {
        const double p = std::exp(double(z[j]) - lse);
        grad[size_t(i) * k + j] = T(c * (p - (j == labels[i] ? 1.0 : 0.0)) * grad_scale);
      }
  }
  return total;
}

template <class T>
double softmax_xent_pixels(int n, int k, int64_t hw, const T* logits, const T* classes, double grad_scale,
                           T* grad, const LossWeights& w) {
  for (int64_t e = 0; e < int64_t(n) * hw; ++e) {
    const T c = classes[e];
    if (!(c >= 0 && c < k) || c != T(int(c)))
      throw std::out_of_range("softmax_xent_pixels: class " + std::to_string(double(c)) + " at element " +
                              std::to_string(e) + " outside [0, " + std::to_string(k) + ")");
  }
  double total = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p) {
      const T* z = logits + size_t(i) * k * hw + p;  // channel j at z[j * hw]
      const int label = int(classes[size_t(i) * hw + p]);
      double m = z[0];
      for (int j = 1; j < k; ++j) m = std::fmax(m, double(z[j * hw]));
      double se = 0;
      for (int j = 0; j < k; ++j) se += std::exp(double(z[j * hw]) - m);
      const double lse = m + std::log(se), c = w.of_class(label);
      total += c * (lse - double(z[label * hw]));
      if (grad)
        for (int j = 0; j < k; ++j) {
          const double prob = std::exp(double(z[j * hw]) - lse);
          grad[size_t(i) * k * hw + size_t(j) * hw + p] = T(c * (prob - (j == label ? 1.0 : 0.0)) * grad_scale);
        }
    }
  return total;
}

template <class T>
double sigmoid_bce(size_t count, const T* logits, const T* targets, double grad_scale, T* grad,
                   const LossWeights& w) {
  const double p = w.pos_weight;
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (count > 16384)
  for (size_t i = 0; i < count; ++i) {
    const double x = logits[i], t = targets[i], e = std::exp(-std::fabs(x)), c = w.of_target(t);
    // p t softplus(-x) + (1 - t) softplus(x) = softplus(x) - x t + (p - 1) t softplus(-x),
    // softplus(x) = max(x, 0) + log1p(exp(-|x|)), softplus(-x) = softplus(x) - x: exactly
    // the unweighted terms when p = 1.
    const double sp = std::fmax(x, 0.0) + std::log1p(e);
    total += c * (std::fmax(x, 0.0) - x * t + std::log1p(e) + (p - 1.0) * t * (sp - x));
    if (grad) {
      const double s = x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);  // sigmoid without overflow
      grad[i] = T(c * ((s - t) + (p - 1.0) * t * (s - 1.0)) * grad_scale);
    }
  }
  return total;
}

template <class T>
double mse(size_t count, const T* pred, const T* target, double grad_scale, T* grad) {
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (count > 16384)
  for (size_t i = 0; i < count; ++i) {
    const double d = double(pred[i]) - double(target[i]);
    total += d * d;
    if (grad) grad[i] = T(2.0 * d * grad_scale);
  }
  return total;
}

#define HT_LOSS_INST(T)                                                                                       \
  template double softmax_xent<T>(int, int, const T*, const int32_t*, double, T*, const LossWeights&);        \
  template double sigmoid_bce<T>(size_t, const T*, const T*, double, T*, const LossWeights&);                 \
  template double softmax_xent_pixels<T>(int, int, int64_t, const T*, const T*, double, T*, const LossWeights&); \
  template double mse<T>(size_t, const T*, const T*, double, T*);
HT_LOSS_INST(float)
HT_LOSS_INST(double)
#undef HT_LOSS_INST

}  // namespace ht::cpu
