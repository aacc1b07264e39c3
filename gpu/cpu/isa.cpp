#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "gpu/cpu/isa_kernels.hpp"

namespace tireless::cpu {

std::string_view name(isa i) {
  switch (i) {
    case isa::generic: return "generic";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "?";
}

#if defined(__x86_64__)
namespace {
// CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
}  // namespace
#endif

bool cpu_supports(isa i) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  switch (i) {
    case isa::generic: return true;
    case isa::avx2: return avx2;
    case isa::avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return i == isa::generic;
#endif
}

const isa_kernels& kernels_for(isa i) {
#if defined(__x86_64__)
  if (i == isa::avx512) return avx512_kernels();
  if (i == isa::avx2) return avx2_kernels();
#endif
  (void)i;
  return generic_kernels();
}

namespace {

const isa_kernels& choose() {
  if (const char* forced = std::getenv("TIRELESS_CPU_ISA"); forced && *forced) {
    for (isa i : {isa::generic, isa::avx2, isa::avx512}) {
      if (name(i) == forced) {
        if (!cpu_supports(i))
          throw std::runtime_error(std::string("TIRELESS_CPU_ISA=") + forced +
                                   " but this CPU lacks that instruction set");
        return kernels_for(i);
      }
    }
    throw std::runtime_error(std::string("TIRELESS_CPU_ISA=") + forced +
                             " is not one of generic, avx2, avx512");
  }
  for (isa i : {isa::avx512, isa::avx2}) {
    if (cpu_supports(i)) return kernels_for(i);
  }
  return generic_kernels();
}

}  // namespace

const isa_kernels& best_kernels() {
  static const isa_kernels& k = choose();
  return k;
}

}  // namespace tireless::cpu
