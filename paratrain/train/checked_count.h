// Element and byte counts that refuse to overflow, for the memory planner
// (memory_plan.cpp, parameter_count.cpp). Internal to paratrain/train.
#pragma once

#include <cstdint>

#include "paratrain/core/error.h"

namespace paratrain::train::detail {

inline int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw ConfigError("paratrain plan: the model's size overflows a 64-bit count; check model.* widths");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw ConfigError("paratrain plan: the model's size overflows a 64-bit count; check model.* widths");
  return r;
}

}  // namespace paratrain::train::detail
