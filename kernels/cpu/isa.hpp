// The vector width the plain-loop kernels run at (internal to kernels/cpu). The build
// targets baseline x86-64 (SSE2: 4 floats); hot float loops also exist compiled for AVX2
// and AVX-512 (functions marked HT_AVX2 / HT_AVX512 around an always-inlined body), and
// the widest this CPU has is picked once.
#pragma once

namespace ht::cpu {

enum class Isa { Baseline, Avx2, Avx512 };

inline Isa cpu_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
      return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
    return Isa::Baseline;
  }();
  return isa;
}

// Of one function built three ways, the one for the widest ISA this CPU has.
template <class F>
F for_this_cpu(F baseline, F avx2, F avx512) {
  switch (cpu_isa()) {
    case Isa::Avx512: return avx512;
    case Isa::Avx2: return avx2;
    default: return baseline;
  }
}

}  // namespace ht::cpu

#define HT_AVX2 __attribute__((target("avx2,fma")))
#define HT_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
