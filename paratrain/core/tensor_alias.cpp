// alias_of(): see tensor_alias.h.
#include "paratrain/core/tensor_alias.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <vector>

namespace paratrain {

at::Tensor alias_of(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  TORCH_CHECK(base.defined() && base.has_storage(), "alias_of: base has no storage");
  TORCH_CHECK(offset >= 0, "alias_of: offset ", offset, " < 0");
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  int64_t numel = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    TORCH_CHECK(shape[d] >= 0, "alias_of: negative size in ", shape);
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
    numel *= shape[d];
  }
  const int64_t start = base.storage_offset() + offset;
  TORCH_CHECK((start + numel) * static_cast<int64_t>(base.element_size()) <=
                  static_cast<int64_t>(base.storage().nbytes()),
              "alias_of: elements [", start, ", ", start + numel, ") lie outside the base's storage of ",
              base.storage().nbytes() / base.element_size(), " elements");
  at::NoGradGuard no_grad;  // set_ on a fresh tensor: not recorded by autograd
  at::Tensor t = at::empty({0}, base.options());
  t.set_(base.storage(), start, shape, strides);
  return t;
}

}  // namespace paratrain
