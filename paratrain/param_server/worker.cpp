// A parameter-server worker's push and pull: see worker.h.
#include "paratrain/param_server/worker.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/param_server/server.h"

namespace paratrain::param_server {
namespace {

constexpr const char* kServerHint =
    "the parameter server probably died or stalled: check its log, then restart the job (train.resume = auto "
    "continues from the last checkpoint)";

}  // namespace

Worker::Worker(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, std::vector<at::Tensor> params,
               WorkerOptions options)
    : world_(world), roles_(roles), options_(options), slots_(params.size()), params_(std::move(params)),
      versions_(roles.servers, 0), pushed_(params_.size(), false), replies_(roles.servers) {
  TORCH_CHECK(!roles.is_server(world.rank()), "Worker built on rank ", world.rank(), ", a server");
  for (int s = 0; s < roles.servers; ++s) {
    ranges_.push_back(plan.ranges_of(s));
    for (size_t k = 0; k < ranges_.back().size(); ++k) {
      const auto& r = ranges_.back()[k];
      slots_.at(r.tensor).push_back({s, static_cast<int>(k), r});
    }
    replies_[s].resize(ranges_[s].size());
  }
}

// The first push of a step posts the receives of its answers: before any
// push leaves, so a server's reply never waits for this worker to get round
// to receiving it.
void Worker::open_step() {
  if (open_) return;
  ++clock_;
  due_ = 0;
  staleness_ = 0;
  for (int s = 0; s < roles_.servers; ++s) {
    for (size_t k = 0; k < ranges_[s].size(); ++k) {
      auto& in = replies_[s][k];
      in.message = torch::empty({kHeader + ranges_[s][k].numel()}, torch::kFloat);
      in.work = world_.recv(in.message, roles_.server_rank(s), reply_tag(static_cast<int64_t>(k)));
      in.arrived = false;
      ++due_;
    }
  }
  std::fill(pushed_.begin(), pushed_.end(), false);
  open_ = true;
}

void Worker::send(const Slot& slot, const at::Tensor& grad_of_tensor) {
  const auto& r = slot.range;
  auto message = encode_push(clock_, versions_[slot.server], grad_of_tensor.reshape(-1).slice(0, r.begin, r.end),
                             options_.push_dtype, last_);
  bytes_ += message.numel() * static_cast<int64_t>(sizeof(float));
  comm::WorkHandle work;
  try {
    // May run inside backward (a gradient hook): an error here leaves
    // backward with this message.
    work = world_.send(message, roles_.server_rank(slot.server), push_tag(slot.index));
  } catch (const CommError&) {
    fail(slot.server);
  }
  sends_.push_back({message, work, slot.server});
}

void Worker::push_tensor(int tensor, const at::Tensor& grad) {
  open_step();
  TORCH_CHECK(!pushed_.at(tensor), "Worker::push_tensor: tensor ", tensor, " pushed twice in clock ", clock_);
  pushed_[tensor] = true;
  for (const auto& slot : slots_[tensor]) {
    send(slot, grad);
    ++early_;
  }
}

void Worker::fail(int server) const {
  rethrow_naming(fmt::format("worker {} (rank {}): push/pull of clock {} with parameter server {} (rank {})",
                             world_.rank(), world_.rank(), clock_, server, roles_.server_rank(server)),
                 kServerHint);
}

int64_t Worker::push_pull() {
  push();
  return pull();
}

void Worker::push() {
  TORCH_CHECK(!pulling_, "Worker::push: the pull of clock ", clock_, " was not waited for (pull())");
  open_step();
  for (size_t t = 0; t < params_.size(); ++t) {
    if (pushed_[t]) continue;
    const auto& p = params_[t];
    const auto grad = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    for (const auto& slot : slots_[t]) {
      send(slot, grad);
      ++late_;
    }
  }
  open_ = false;
  pulling_ = true;
}

int64_t Worker::pull() {
  TORCH_CHECK(pulling_, "Worker::pull: nothing was pushed since the last pull");
  for (int s = 0; s < roles_.servers; ++s) {
    for (size_t k = 0; k < replies_[s].size(); ++k) receive(s, static_cast<int>(k));
  }
  return staleness_;
}

void Worker::pull_tensor(int tensor) {
  if (!pulling_) return;
  for (const auto& slot : slots_.at(tensor)) receive(slot.server, slot.index);
}

int64_t Worker::assigned_item() {
  // Every range of server 0's answer carries the item: the first will do.
  if (pulling_) receive(0, 0);
  return assigned_;
}

void Worker::receive(int server, int index) {
  auto& in = replies_[server][index];
  if (in.arrived) return;
  try {
    in.work->wait(options_.timeout);
  } catch (const CommError&) {
    fail(server);
  }
  in.arrived = true;
  const auto header = in.message.slice(0, 0, kHeader);
  versions_[server] = static_cast<int64_t>(header[0].item<float>());
  staleness_ = std::max(staleness_, static_cast<int64_t>(header[1].item<float>()));
  if (server == 0) assigned_ = static_cast<int64_t>(header[2].item<float>());
  unpack_ranges(in.message.slice(0, kHeader), params_, {ranges_[server][index]});
  in.message = at::Tensor();
  if (--due_ > 0) return;
  // The last answer: the pushes it answers were received long ago, their
  // sends only need collecting.
  auto sends = std::move(sends_);
  sends_.clear();
  for (auto& out : sends) {
    try {
      out.work->wait(options_.timeout);
    } catch (const CommError&) {
      fail(out.server);
    }
  }
  pulling_ = false;
  ++histogram_[staleness_];
}

void refresh_parameters(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan,
                        const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& own_pieces,
                        std::chrono::milliseconds timeout) {
  const int me = world.rank();
  std::vector<std::pair<at::Tensor, comm::WorkHandle>> sends;
  if (roles.is_server(me)) {
    auto flat = own_pieces.empty() ? torch::empty({0}, torch::kFloat) : torch::cat(own_pieces);
    unpack_ranges(flat, params, plan.ranges_of(roles.server_index(me)));
    for (int r = 0; r < world.size(); ++r) {
      if (r != me) sends.emplace_back(flat, world.send(flat, r, kRefreshTag));
    }
  }
  for (int s = 0; s < roles.servers; ++s) {
    const int rank = roles.server_rank(s);
    if (rank == me) continue;
    const auto ranges = plan.ranges_of(s);
    int64_t n = 0;
    for (const auto& r : ranges) n += r.numel();
    auto flat = torch::empty({n}, torch::kFloat);
    try {
      world.recv(flat, rank, kRefreshTag)->wait(timeout);
    } catch (const CommError&) {
      rethrow_naming(fmt::format("rank {}: pulling the parameters of parameter server {} (rank {})", me, s, rank),
                     kServerHint);
    }
    unpack_ranges(flat, params, ranges);
  }
  for (auto& [tensor, work] : sends) work->wait(timeout);
}

}  // namespace paratrain::param_server
