// ShmAllReduce: see shm_allreduce.h. A benchmark prototype, not library code.
#include "bench/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"

namespace paratrain_bench {
namespace {

namespace comm = paratrain::comm;
constexpr size_t kAlign = 64;

// The segment: a barrier counter, then one slot of capacity floats per rank.
struct Header {
  alignas(kAlign) std::atomic<uint32_t> arrived{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

size_t slot_bytes(int64_t capacity) {
  const size_t b = static_cast<size_t>(capacity) * sizeof(float);
  return (b + kAlign - 1) / kAlign * kAlign;
}

class FutureWork final : public comm::Work {
 public:
  explicit FutureWork(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait(std::chrono::milliseconds timeout) override {
    if (done_.wait_for(timeout) != std::future_status::ready) {
      throw paratrain::TimeoutError(fmt::format("shm all-reduce did not finish in {} ms", timeout.count()));
    }
    done_.get();  // rethrows the worker's failure
  }
  bool is_completed() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
};

}  // namespace

struct ShmAllReduce::Impl {
  int rank = 0;
  int world = 1;
  int64_t capacity = 0;
  void* base = nullptr;
  size_t bytes = 0;
  uint32_t barriers = 0;  // barriers passed by this rank (same count on every rank)

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<at::Tensor, std::promise<void>>> queue;
  bool stop = false;
  std::thread worker;

  Header& header() { return *static_cast<Header*>(base); }
  float* slot(int r) {
    return reinterpret_cast<float*>(static_cast<char*>(base) + kAlign + r * slot_bytes(capacity));
  }

  void barrier();
  void all_reduce(at::Tensor& t);
  void run();
};

// Waits until every rank arrived. The counter only grows: barrier k is passed
// when it reaches world * k. Sleeps in the kernel (futex on the shared word)
// instead of spinning, because on a machine with as many ranks as cores a
// spinning thread takes the core its own rank computes on.
void ShmAllReduce::Impl::barrier() {
  const uint32_t target = static_cast<uint32_t>(world) * ++barriers;
  auto* word = reinterpret_cast<uint32_t*>(&header().arrived);
  const uint32_t now = header().arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now == target) {
    syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    return;
  }
  for (uint32_t seen = now; static_cast<int32_t>(seen - target) < 0;
       seen = header().arrived.load(std::memory_order_acquire)) {
    syscall(SYS_futex, word, FUTEX_WAIT, seen, nullptr, nullptr, 0);
  }
}

// Reduce-scatter then all-gather through the segment, one memory pass each:
//   1. every rank copies its tensor into its slot;            barrier
//   2. rank r sums chunk r of all slots into slot 0, chunk r;  barrier
//   3. every rank copies slot 0 (the full sum) back;           barrier
// The last barrier keeps a fast rank's next step 1 from overwriting slot 0
// while a slow one still copies out. Per rank that is ~3 passes over the
// tensor at memory speed instead of Gloo's TCP loopback.
void ShmAllReduce::Impl::all_reduce(at::Tensor& t) {
  const int64_t n = t.numel();
  auto view = [&](int r, int64_t from, int64_t len) {
    return torch::from_blob(slot(r) + from, {len}, torch::kFloat);
  };
  view(rank, 0, n).copy_(t.view({n}));
  barrier();
  const int64_t from = n * rank / world;
  const int64_t len = n * (rank + 1) / world - from;
  if (len > 0) {
    at::Tensor acc = view(0, from, len);
    for (int r = 1; r < world; ++r) acc.add_(view(r, from, len));
  }
  barrier();
  t.view({n}).copy_(view(0, 0, n));
  barrier();
}

void ShmAllReduce::Impl::run() {
  for (;;) {
    std::pair<at::Tensor, std::promise<void>> job;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      job = std::move(queue.front());
      queue.pop_front();
    }
    try {
      torch::NoGradGuard no_grad;
      all_reduce(job.first);
      job.second.set_value();
    } catch (...) {
      job.second.set_exception(std::current_exception());
    }
  }
}

ShmAllReduce::ShmAllReduce(comm::ProcessGroup& group, ShmAllReduceOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.rank = group.rank();
  s.world = group.size();
  s.capacity = options.capacity_numel;
  TORCH_CHECK(s.capacity > 0, "ShmAllReduceOptions.capacity_numel must be > 0");
  s.bytes = kAlign + s.world * slot_bytes(s.capacity);

  // Rank 0 picks a fresh name and tells the others through the group.
  at::Tensor token = torch::zeros({1}, torch::kLong);
  if (s.rank == 0) token.fill_(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));
  group.broadcast(token, 0)->wait();
  const std::string name = fmt::format("/paratrain-bench-shm-{}", token.item<int64_t>());
  int fd = -1;
  if (s.rank == 0) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(s.bytes)) != 0) {
      close(fd);
      fd = -1;
    }
  }
  group.barrier()->wait();
  if (s.rank != 0) fd = shm_open(name.c_str(), O_RDWR, 0600);
  const int err = errno;
  if (fd >= 0) {
    s.base = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s.base == MAP_FAILED) s.base = nullptr;
  }
  group.barrier()->wait();  // everyone mapped it (or failed): the name can go
  if (s.rank == 0) shm_unlink(name.c_str());
  if (s.base == nullptr) {
    throw paratrain::CommError(fmt::format("rank {}: cannot map shared memory {} ({} bytes): {}",
                                           s.rank, name, s.bytes, std::strerror(err)));
  }
  if (s.rank == 0) new (s.base) Header();
  group.barrier()->wait();
  s.worker = std::thread([&s] { s.run(); });
}

ShmAllReduce::~ShmAllReduce() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
  if (impl_->base != nullptr) munmap(impl_->base, impl_->bytes);
}

comm::WorkHandle ShmAllReduce::all_reduce_sum(at::Tensor& tensor) {
  TORCH_CHECK(tensor.scalar_type() == at::kFloat && tensor.is_contiguous() && tensor.is_cpu(),
              "shm all-reduce: needs a contiguous float32 CPU tensor");
  TORCH_CHECK(tensor.numel() <= impl_->capacity, "shm all-reduce: ", tensor.numel(),
              " elements exceed the capacity of ", impl_->capacity);
  std::promise<void> done;
  auto future = done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->queue.emplace_back(tensor, std::move(done));
  }
  impl_->cv.notify_one();
  return std::make_shared<FutureWork>(std::move(future));
}

}  // namespace paratrain_bench
