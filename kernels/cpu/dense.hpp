// Fully connected layer, y = x W + b, W stored [in][out] as Keras.
#pragma once

namespace ht::cpu {

// x [n][in], W [in][out], b [out] (nullable), y [n][out] (overwritten).
template <class T>
void dense_forward(int n, int in, int out, const T* x, const T* W, const T* b, T* y);
// dx [n][in] (nullable: the first layer needs none), dW [in][out], db [out] (nullable);
// all overwritten.
template <class T>
void dense_backward(int n, int in, int out, const T* x, const T* W, const T* dy, T* dx, T* dW,
                    T* db);

}  // namespace ht::cpu
