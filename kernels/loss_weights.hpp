// What weighs the training loss (SPEC section 14): Keras's class_weight, each image's (or
// pixel's) loss times its class's weight before the plain mean, and torch's
// BCEWithLogitsLoss(pos_weight), the positive term of the BCE times pos_weight. Passed by
// value to the CPU and CUDA kernels alike (a CUDA kernel parameter: hence the fixed size).
#pragma once

#if defined(__CUDACC__)
#define HT_LOSS_HD __host__ __device__
#else
#define HT_LOSS_HD
#endif

namespace ht {

struct LossWeights {
  static constexpr int kMaxClasses = 256;
  int classes = 0;  // 0: every class weighs 1
  float class_weight[kMaxClasses] = {};
  float pos_weight = 1.f;

  // The weight of class c (softmax cross-entropy: a label or a class map's pixel).
  HT_LOSS_HD double of_class(int c) const { return classes ? double(class_weight[c]) : 1.0; }
  // The weight of a BCE target t in [0, 1]: class 0's and class 1's, in proportion.
  HT_LOSS_HD double of_target(double t) const {
    return classes ? (1.0 - t) * double(class_weight[0]) + t * double(class_weight[1]) : 1.0;
  }
};

}  // namespace ht
