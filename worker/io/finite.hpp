// Finding NaN and Inf in data read or written, for messages that name the value and where it is.
#pragma once

#include <cstddef>

namespace ht {

// The index of the first NaN or Inf among `n` floats; `n` when every one is finite.
size_t first_non_finite(const float* data, size_t n);

// "NaN", "+inf" or "-inf" for a value that is not finite (messages name it so).
const char* non_finite_name(float value);

}  // namespace ht
