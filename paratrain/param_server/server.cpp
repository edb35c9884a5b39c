// A parameter server's rounds: see server.h and Note [Parameter-server modes].
#include "paratrain/param_server/server.h"

#include <torch/optim/optimizer.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/error.h"
#include "paratrain/core/running_deadline.h"

namespace paratrain::param_server {

using Clock = std::chrono::steady_clock;

// The comm layer has no receive from any source, and a posted receive only
// completes inside wait() (c10d's point-to-point work has no future to poll),
// so each posted push gets a thread that waits on it and signals arrived_.
struct Server::Inbox {
  Push push;
  std::thread waiter;
  bool done = false;  // under Server::mu_
  std::exception_ptr error;
};

namespace {

constexpr const char* kWorkerHint = "the worker process probably died or stalled: check its log";

}  // namespace

at::Tensor pack_ranges(const std::vector<at::Tensor>& tensors, const std::vector<KeyRange>& ranges) {
  std::vector<at::Tensor> parts;
  parts.reserve(ranges.size());
  for (const auto& r : ranges) parts.push_back(tensors.at(r.tensor).detach().reshape(-1).slice(0, r.begin, r.end));
  if (parts.empty()) return torch::empty({0}, torch::kFloat);
  return torch::cat(parts);
}

void unpack_ranges(const at::Tensor& flat, const std::vector<at::Tensor>& tensors,
                   const std::vector<KeyRange>& ranges) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& r : ranges) {
    auto target = tensors.at(r.tensor);
    TORCH_CHECK(target.is_contiguous(), "unpack_ranges: tensor ", r.tensor, " is not contiguous");
    target.view(-1).slice(0, r.begin, r.end).copy_(flat.slice(0, offset, offset + r.numel()));
    offset += r.numel();
  }
  TORCH_CHECK(offset == flat.numel(), "unpack_ranges: ", flat.numel(), " elements for ranges of ", offset);
}

Server::Server(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, const BucketPlan& buckets,
               const std::vector<at::Tensor>& params, ServerOptions options)
    : world_(world), roles_(roles), index_(roles.server_index(world.rank())), options_(options),
      ranges_(plan.ranges_of(roles.server_index(world.rank()))), clocks_(roles.workers, 0),
      remaining_(roles.workers, 0), inbox_(roles.workers) {
  TORCH_CHECK(roles.is_server(world.rank()), "Server built on rank ", world.rank(), ", a worker");
  if (ranges_.empty()) {
    // Its pushes would be empty: nothing to carry the workers' clocks.
    throw ConfigError(fmt::format("parameter server {} (rank {}) owns no parameter element: the model has fewer "
                                  "bytes than there are servers ({}); use fewer ps.servers",
                                  index_, world.rank(), roles.servers));
  }
  TORCH_CHECK(static_cast<int>(buckets.buckets.size()) == roles.servers, "Server: a bucket plan for ",
              buckets.buckets.size(), " servers, not ", roles.servers);
  buckets_ = buckets.buckets[index_];
  TORCH_CHECK(!buckets_.empty() && buckets_.back().last == static_cast<int>(ranges_.size()),
              "Server: the bucket plan does not cover the ", ranges_.size(), " ranges of server ", index_);
  torch::NoGradGuard no_grad;
  for (const auto& r : ranges_) {
    const auto& p = params.at(r.tensor);
    TORCH_CHECK(p.scalar_type() == at::kFloat, "parameter servers carry float32 parameters; tensor ", r.tensor,
                " is ", p.scalar_type());
    // In host memory whatever the model's device (Note [Parameter servers
    // on the GPU]): a new tensor even when the model is on the CPU.
    pieces_.push_back(p.detach().reshape(-1).slice(0, r.begin, r.end).to(at::kCPU, /*non_blocking=*/false,
                                                                        /*copy=*/true));
    numel_ += r.numel();
  }
}

Server::~Server() {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& inbox : inbox_) pending = pending || (inbox && !inbox->done);
  }
  if (pending) world_.abort();
  for (auto& inbox : inbox_) {
    if (inbox && inbox->waiter.joinable()) inbox->waiter.join();
  }
}

void Server::expect_pushes(int64_t pushes) { std::fill(remaining_.begin(), remaining_.end(), pushes); }

void Server::begin_window(int64_t first_item, int64_t rounds) {
  TORCH_CHECK(options_.mode == Mode::kAsync, "Server::begin_window: dynamic batches are for async mode");
  TORCH_CHECK(rounds >= 1, "Server::begin_window: ", rounds, " rounds");
  // Each worker pushes until its push marked last: far more than it can.
  std::fill(remaining_.begin(), remaining_.end(), std::numeric_limits<int64_t>::max() / 2);
  next_item_ = first_item + 2 * roles_.workers;
  end_item_ = first_item + roles_.workers * rounds;
}

void Server::serve_round(torch::optim::Optimizer& optimizer) {
  if (options_.mode == Mode::kSync) {
    serve_sync(optimizer);
  } else {
    serve_unordered(optimizer);
  }
  drain_replies();
}

Server::Push Server::post_push(int worker) {
  Push push;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    push.messages.push_back(torch::empty({push_message_numel(buckets_[b].numel, options_.push_dtype)}, torch::kFloat));
    push.works.push_back(world_.recv(push.messages.back(), worker, push_tag(static_cast<int64_t>(b))));
  }
  return push;
}

at::Tensor Server::gradient_of(const Push& push) const {
  // Buckets hold the ranges in order: their payloads back to back are the
  // ranges back to back, whatever the buckets.
  std::vector<at::Tensor> parts;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    parts.push_back(decode_push(push.messages[b], buckets_[b].numel, options_.push_dtype));
  }
  return parts.empty() ? torch::empty({0}, torch::kFloat) : torch::cat(parts);
}

void Server::serve_sync(torch::optim::Optimizer& optimizer) {
  std::vector<Push> pushes;
  for (int w = 0; w < roles_.workers; ++w) pushes.push_back(post_push(w));
  // Summed in worker order: every run adds the same floats the same way.
  at::Tensor sum;
  for (int w = 0; w < roles_.workers; ++w) {
    try {
      for (auto& work : pushes[w].works) work->wait(options_.timeout);
    } catch (const CommError&) {
      rethrow_naming(fmt::format("parameter server {} (rank {}): receiving the gradients of worker {} (rank {})",
                                 index_, world_.rank(), w, w), kWorkerHint);
    }
    ++clocks_[w];
    auto grad = gradient_of(pushes[w]);
    sum = w == 0 ? grad.clone() : sum.add_(grad);
  }
  apply(sum.div_(roles_.workers), optimizer);
  ++version_;
  for (int w = 0; w < roles_.workers; ++w) reply(w, 0);
}

void Server::post(int worker) {
  auto inbox = std::make_unique<Inbox>();
  inbox->push = post_push(worker);
  Inbox* raw = inbox.get();
  // Fails by itself at the timeout: a waiter never outlives it for long.
  inbox->waiter = std::thread([this, raw] {
    std::exception_ptr error;
    try {
      for (auto& work : raw->push.works) work->wait(options_.timeout);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      raw->done = true;
      raw->error = error;
    }
    arrived_.notify_all();
  });
  inbox_[worker] = std::move(inbox);
  --remaining_[worker];
}

// One posted receive per worker at a time, never beyond its last push (a
// receive left posted would outlive the run); pushes are handled in the
// order they are found complete, lowest worker first among those.
void Server::serve_unordered(torch::optim::Optimizer& optimizer) {
  int handled = 0;
  while (handled < roles_.workers) {
    bool any_posted = false;
    for (int w = 0; w < roles_.workers; ++w) {
      if (!inbox_[w] && remaining_[w] > 0) post(w);
      any_posted = any_posted || inbox_[w] != nullptr;
    }
    if (!any_posted) {
      throw Error(fmt::format("parameter server {} (rank {}): a round needs {} more pushes but every worker has "
                              "sent all it announced (expect_pushes); the strategy and the servers disagree on "
                              "the number of steps",
                              index_, world_.rank(), roles_.workers - handled));
    }
    std::vector<int> ready;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto collect = [&] {
        ready.clear();
        for (int w = 0; w < roles_.workers; ++w)
          if (inbox_[w] && inbox_[w]->done) ready.push_back(w);
        return !ready.empty();
      };
      // Each waiter gives up at the timeout itself; the margin only covers
      // its wake-up. Running time (Note [Deadlines that stop with the process]).
      RunningDeadline deadline(options_.timeout + std::chrono::seconds(5));
      while (!collect()) {
        if (deadline.passed())
          throw TimeoutError(fmt::format("parameter server {} (rank {}): no worker pushed for {} ms (clocks {}); a "
                                         "worker process may have died: check the workers' logs",
                                         index_, world_.rank(), options_.timeout.count(), fmt::join(clocks_, ", ")));
        arrived_.wait_until(lock, deadline.next_look());
      }
    }
    for (int w : ready) {
      if (handled == roles_.workers) break;  // the rest waits for the next round
      auto inbox = std::move(inbox_[w]);
      inbox->waiter.join();
      if (inbox->error) {
        try {
          std::rethrow_exception(inbox->error);
        } catch (const CommError&) {
          rethrow_naming(fmt::format("parameter server {} (rank {}): receiving a push of worker {} (rank {})",
                                     index_, world_.rank(), w, w), kWorkerHint);
        }
      }
      handle_push(w, inbox->push, optimizer);
      ++handled;
    }
  }
}

void Server::handle_push(int worker, const Push& push, torch::optim::Optimizer& optimizer) {
  const auto clock = static_cast<int64_t>(push.messages[0][0].item<float>());
  const auto read = static_cast<int64_t>(push.messages[0][1].item<float>());
  ++clocks_[worker];
  if (clock != clocks_[worker]) {
    throw CommError(fmt::format("parameter server {} (rank {}): worker {} sent clock {} where {} was due; workers "
                                "and servers are out of step",
                                index_, world_.rank(), worker, clock, clocks_[worker]));
  }
  auto grad = gradient_of(push);
  if (options_.mode == Mode::kAsync) {
    const int64_t staleness = version_ - read;
    apply(grad, optimizer, static_cast<double>(staleness));
    ++version_;
    const bool last = push.messages[0][2].item<float>() != 0.0f;
    if (last) remaining_[worker] = 0;  // its window is done: post nothing more for it
    int64_t item = -1;
    if (index_ == 0 && next_item_ >= 0 && next_item_ < end_item_) item = next_item_++;
    reply(worker, staleness, item);
    return;
  }
  // ssp: the gradient of clock c will be applied on top of version c - 1.
  const int64_t staleness = clock - 1 - read;
  auto& slot = pending_[clock];
  slot.sum = slot.count == 0 ? grad.clone() : slot.sum.add_(grad);
  ++slot.count;
  slot.staleness_sum += staleness;
  // Clocks complete in order: clock c needs every worker's c-th push, which
  // each worker sends after its (c-1)-th.
  for (auto it = pending_.find(version_ + 1); it != pending_.end() && it->second.count == roles_.workers;
       it = pending_.find(version_ + 1)) {
    apply(it->second.sum.div_(roles_.workers), optimizer,
          static_cast<double>(it->second.staleness_sum) / roles_.workers);
    ++version_;
    pending_.erase(it);
  }
  held_.push_back({worker, clock, staleness});
  const int64_t slowest = slowest_clock();
  std::vector<HeldReply> still;
  for (const auto& h : held_) {
    if (slowest >= h.clock - options_.staleness) {
      reply(h.worker, h.staleness);
    } else {
      still.push_back(h);
    }
  }
  held_ = std::move(still);
}

int64_t Server::slowest_clock() const { return *std::min_element(clocks_.begin(), clocks_.end()); }

// Note [Staleness-aware learning rate]
// Under async and ssp a worker's gradient was computed on parameters
// `staleness` updates older than the ones it is applied to. Stale gradients
// at the full rate are what diverges asynchronous SGD at rates synchronous
// training takes (the MLP config's lr 0.05 with momentum 0.9: NaN by step
// ~300 with 2 async workers). Zhang et al. (arXiv 1511.05950) divide the
// rate of each update by its staleness: tau versions old -> lr / max(tau, 1),
// so a fresh update keeps the full rate. Under ssp a clock's update is the
// mean of every worker's gradient for it, applied at the rate divided by the
// mean staleness of those gradients. The rate is set for this one step and
// restored: the Trainer's schedule owns it.
void Server::apply(const at::Tensor& flat_grad, torch::optim::Optimizer& optimizer, double staleness) {
  int64_t offset = 0;
  for (auto& piece : pieces_) {
    piece.mutable_grad() = flat_grad.slice(0, offset, offset + piece.numel());
    offset += piece.numel();
  }
  if (!options_.staleness_aware_lr || staleness <= 1) {
    optimizer.step();
    return;
  }
  std::vector<double> rates;
  for (auto& group : optimizer.param_groups()) {
    rates.push_back(group.options().get_lr());
    group.options().set_lr(rates.back() / staleness);
  }
  optimizer.step();
  for (size_t g = 0; g < rates.size(); ++g) optimizer.param_groups()[g].options().set_lr(rates[g]);
}

// One message per bucket, in key order: the worker can run its first
// layers while the later buckets are still on the wire.
void Server::reply(int worker, int64_t staleness, int64_t item) {
  auto header = torch::tensor({static_cast<float>(version_), static_cast<float>(staleness), static_cast<float>(item)},
                              torch::kFloat);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<at::Tensor> parts{header};
    for (int k = buckets_[b].first; k < buckets_[b].last; ++k) parts.push_back(pieces_[k].detach());
    auto message = torch::cat(parts);
    auto work = world_.send(message, worker, reply_tag(static_cast<int64_t>(b)));
    sends_.push_back({message, work, worker});
  }
}

void Server::drain_replies() {
  for (auto& s : sends_) {
    try {
      s.work->wait(options_.timeout);
    } catch (const CommError&) {
      rethrow_naming(fmt::format("parameter server {} (rank {}): sending parameters to worker {} (rank {})", index_,
                                 world_.rank(), s.worker, s.worker), kWorkerHint);
    }
  }
  sends_.clear();
}

}  // namespace paratrain::param_server
