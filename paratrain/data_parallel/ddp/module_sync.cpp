// verify_same_tensors() and broadcast_coalesced(): see module_sync.h.
#include "paratrain/data_parallel/ddp/module_sync.h"

#include <torch/torch.h>

#include <cstdint>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

constexpr int64_t kBroadcastChunkBytes = 32LL * 1024 * 1024;

// FNV-1a over the names, shapes and dtypes: equal lists give equal hashes on
// every rank (no pointers or addresses go in).
int64_t fingerprint(const std::vector<NamedTensor>& tensors) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ULL;
    }
  };
  for (const auto& t : tensors) {
    mix(t.name);
    mix(fmt::format("|{}|{}|", fmt::join(t.tensor.sizes(), "x"), c10::toString(t.tensor.scalar_type())));
  }
  return static_cast<int64_t>(h);
}

// Tensors sharing dtype and device, consecutive in the caller's order, up to
// the chunk size (a single larger tensor gets its own chunk).
std::vector<std::vector<at::Tensor>> chunk(const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<at::Tensor>> chunks;
  std::vector<int64_t> bytes;
  for (const at::Tensor& t : tensors) {
    std::size_t c = 0;
    for (; c < chunks.size(); ++c) {
      const at::Tensor& head = chunks[c].front();
      if (head.scalar_type() == t.scalar_type() && head.device() == t.device() &&
          bytes[c] + static_cast<int64_t>(t.nbytes()) <= kBroadcastChunkBytes) {
        break;
      }
    }
    if (c == chunks.size()) {
      chunks.emplace_back();
      bytes.push_back(0);
    }
    chunks[c].push_back(t);
    bytes[c] += static_cast<int64_t>(t.nbytes());
  }
  return chunks;
}

}  // namespace

void verify_same_tensors(comm::ProcessGroup& group, const std::vector<NamedTensor>& tensors,
                         std::string_view what, std::chrono::milliseconds timeout) {
  int64_t numel = 0;
  for (const auto& t : tensors) numel += t.tensor.numel();
  at::Tensor mine = torch::tensor(std::vector<int64_t>{static_cast<int64_t>(tensors.size()), numel,
                                                       fingerprint(tensors)});
  if (!tensors.empty()) mine = mine.to(tensors.front().tensor.device());
  at::Tensor all = at::zeros({group.size() * 3}, mine.options());
  group.all_gather(all, mine)->wait(timeout);
  all = all.cpu();
  const int64_t* v = all.data_ptr<int64_t>();
  std::string diffs;
  for (int r = 1; r < group.size(); ++r) {
    const int64_t* o = v + 3 * r;
    if (o[0] != v[0] || o[1] != v[1] || o[2] != v[2]) {
      diffs += fmt::format("; rank {} has {} {} with {} elements{}", r, o[0], what, o[1],
                           o[0] == v[0] && o[1] == v[1] ? " but different names, shapes or dtypes" : "");
    }
  }
  if (!diffs.empty()) {
    throw ConfigError(fmt::format(
        "rank {}: ranks hold different models: rank 0 has {} {} with {} elements{}. Every rank "
        "must build the same model (same options, same code) before wrapping it",
        group.rank(), v[0], what, v[1], diffs));
  }
}

void broadcast_coalesced(comm::ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                         std::chrono::milliseconds timeout) {
  if (group.size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  for (const auto& part : chunk(tensors)) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : part) flat_parts.push_back(t.detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    // A broadcast only copies bits, and Gloo has no bf16 kernels: send bf16
    // as fp16 words of the same storage.
    at::Tensor wire = flat.scalar_type() == at::kBFloat16 ? flat.view(at::kHalf) : flat;
    group.broadcast(wire, root)->wait(timeout);
    int64_t offset = 0;
    for (const at::Tensor& t : part) {
      const int64_t n = t.numel();
      t.detach().copy_(flat.narrow(0, offset, n).view(t.sizes()));
      offset += n;
    }
  }
}

}  // namespace paratrain::ddp
