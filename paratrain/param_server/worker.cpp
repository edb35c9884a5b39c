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

Worker::Worker(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, const BucketPlan& buckets,
               std::vector<at::Tensor> params, WorkerOptions options)
    : world_(world), roles_(roles), options_(options), buckets_(buckets.buckets), slots_(params.size()),
      params_(std::move(params)), versions_(roles.servers, 0), pushed_(params_.size(), false),
      staged_(roles.servers), replies_(roles.servers) {
  TORCH_CHECK(!roles.is_server(world.rank()), "Worker built on rank ", world.rank(), ", a server");
  TORCH_CHECK(static_cast<int>(buckets_.size()) == roles.servers, "Worker: a bucket plan for ", buckets_.size(),
              " servers, not ", roles.servers);
  for (int s = 0; s < roles.servers; ++s) {
    ranges_.push_back(plan.ranges_of(s));
    const auto& ranges = ranges_.back();
    TORCH_CHECK(buckets.bucket_of.at(s).size() == ranges.size(), "Worker: the bucket plan of server ", s, " has ",
                buckets.bucket_of.at(s).size(), " ranges, the key-range plan ", ranges.size());
    int64_t offset = 0;
    for (size_t k = 0; k < ranges.size(); ++k) {
      const int b = buckets.bucket_of[s][k];
      if (static_cast<int>(k) == buckets_[s][b].first) offset = 0;
      slots_.at(ranges[k].tensor).push_back({s, b, offset, ranges[k]});
      offset += ranges[k].numel();
    }
    staged_[s].resize(buckets_[s].size());
    replies_[s].resize(buckets_[s].size());
  }
}

// The first push of a step posts the receives of its answers: before any
// push leaves, so a server's reply never waits for this worker to get round
// to receiving it.
void Worker::open_step() {
  if (open_) return;
  ++clock_;
  due_ = 0;
  messages_due_ = 0;
  staleness_ = 0;
  for (int s = 0; s < roles_.servers; ++s) {
    for (size_t b = 0; b < buckets_[s].size(); ++b) {
      const auto& bucket = buckets_[s][b];
      auto& in = replies_[s][b];
      in.message = torch::empty({kHeader + bucket.numel}, torch::kFloat);
      in.work = world_.recv(in.message, roles_.server_rank(s), reply_tag(static_cast<int64_t>(b)));
      in.arrived = false;
      due_ += bucket.size();
      ++messages_due_;
      staged_[s][b] = {torch::empty({bucket.numel}, torch::kFloat), bucket.size()};
    }
  }
  std::fill(pushed_.begin(), pushed_.end(), false);
  open_ = true;
}

void Worker::stage(const Slot& slot, const at::Tensor& grad_of_tensor, bool early) {
  const auto& r = slot.range;
  auto& bucket = staged_[slot.server][slot.bucket];
  TORCH_CHECK(bucket.missing > 0, "Worker: bucket ", slot.bucket, " of server ", slot.server, " staged twice");
  bucket.payload.slice(0, slot.offset, slot.offset + r.numel())
      .copy_(grad_of_tensor.detach().reshape(-1).slice(0, r.begin, r.end));
  if (--bucket.missing == 0) send(slot.server, slot.bucket, early);
}

void Worker::send(int server, int bucket, bool early) {
  auto& staged = staged_[server][bucket];
  auto message = encode_push(clock_, versions_[server], staged.payload, options_.push_dtype, last_);
  staged.payload = at::Tensor();
  bytes_ += message.numel() * static_cast<int64_t>(sizeof(float));
  const int ranges = buckets_[server][bucket].size();
  (early ? early_ : late_) += ranges;
  ++(early ? messages_early_ : messages_late_);
  comm::WorkHandle work;
  try {
    // May run inside backward (a gradient hook): an error here leaves
    // backward with this message.
    work = world_.send(message, roles_.server_rank(server), push_tag(bucket));
  } catch (const CommError&) {
    fail(server);
  }
  sends_.push_back({message, work, server});
}

void Worker::push_tensor(int tensor, const at::Tensor& grad) {
  open_step();
  TORCH_CHECK(!pushed_.at(tensor), "Worker::push_tensor: tensor ", tensor, " pushed twice in clock ", clock_);
  pushed_[tensor] = true;
  for (const auto& slot : slots_[tensor]) stage(slot, grad, true);
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
    for (const auto& slot : slots_[t]) stage(slot, grad, false);
  }
  // Every range was staged once, so every bucket has left.
  for (int s = 0; s < roles_.servers; ++s) {
    for (size_t b = 0; b < staged_[s].size(); ++b) {
      TORCH_CHECK(staged_[s][b].missing == 0, "Worker::push: bucket ", b, " of server ", s, " still misses ",
                  staged_[s][b].missing, " ranges");
    }
  }
  open_ = false;
  pulling_ = true;
}

int64_t Worker::pull() {
  TORCH_CHECK(pulling_, "Worker::pull: nothing was pushed since the last pull");
  for (int s = 0; s < roles_.servers; ++s) {
    for (size_t b = 0; b < replies_[s].size(); ++b) receive(s, static_cast<int>(b));
  }
  return staleness_;
}

void Worker::pull_tensor(int tensor) {
  if (!pulling_) return;
  for (const auto& slot : slots_.at(tensor)) receive(slot.server, slot.bucket);
}

int64_t Worker::assigned_item() {
  // Every bucket of server 0's answer carries the item: the first will do.
  if (pulling_) receive(0, 0);
  return assigned_;
}

void Worker::receive(int server, int bucket) {
  auto& in = replies_[server][bucket];
  if (in.arrived) return;
  try {
    in.work->wait(options_.timeout);
  } catch (const CommError&) {
    fail(server);
  }
  in.arrived = true;
  ++messages_pulled_;
  const auto header = in.message.slice(0, 0, kHeader);
  versions_[server] = static_cast<int64_t>(header[0].item<float>());
  staleness_ = std::max(staleness_, static_cast<int64_t>(header[1].item<float>()));
  if (server == 0) assigned_ = static_cast<int64_t>(header[2].item<float>());
  const auto& b = buckets_[server][bucket];
  const std::vector<KeyRange> ranges(ranges_[server].begin() + b.first, ranges_[server].begin() + b.last);
  unpack_ranges(in.message.slice(0, kHeader), params_, ranges);
  in.message = at::Tensor();
  due_ -= b.size();
  if (--messages_due_ > 0) return;
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
