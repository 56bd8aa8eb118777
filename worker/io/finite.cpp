#include "worker/io/finite.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ht {

size_t first_non_finite(const float* data, size_t n) {
  // NaN and Inf have an exponent of all ones. Blocks are OR-reduced (the compiler
  // vectorises that) and only a block with a hit is searched.
  auto bad = [data](size_t i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
  };
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    bool hit = false;
    for (size_t i = b; i < e; ++i) hit |= bad(i);
    if (!hit) continue;
    for (size_t i = b; i < e; ++i)
      if (bad(i)) return i;
  }
  return n;
}

const char* non_finite_name(float value) {
  if (std::isnan(value)) return "NaN";
  return value > 0 ? "+inf" : "-inf";
}

}  // namespace ht
