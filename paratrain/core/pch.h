// Precompiled header: the expensive, stable headers every torch target uses.
// Not a header to include directly; files still include what they use.
#pragma once
#include <torch/torch.h>
#include <ATen/core/Tensor.h>
#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <fmt/format.h>
