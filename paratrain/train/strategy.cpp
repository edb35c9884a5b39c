// The GradientSync implementations over ddp/: adapters, no algorithms here.
#include "paratrain/train/strategy.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/naive.h"

namespace paratrain::train {
namespace {

class BucketedSync final : public GradientSync {
 public:
  BucketedSync(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& group, ddp::DdpOptions options)
      : ddp_(std::move(model), group, std::move(options)) {}
  std::string name() const override { return "ddp (bucketed)"; }
  void before_forward() override { ddp_.prepare_forward(); }
  void after_backward() override {}  // backward itself reduced the gradients
  SyncStats last_stats() const override {
    auto s = ddp_.last_step_stats();
    return {s.backward_ms, s.comm_ms(), s.hidden_share(), s.wait_ms};
  }

 private:
  ddp::DistributedDataParallel ddp_;
};

class NaiveSync final : public GradientSync {
 public:
  NaiveSync(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& group, ddp::NaiveOptions options)
      : naive_(std::move(model), group, options) {}
  std::string name() const override { return "ddp (naive)"; }
  void before_forward() override { naive_.prepare_forward(); }
  void after_backward() override { naive_.sync_gradients(); }

 private:
  ddp::NaiveDataParallel naive_;
};

class LocalOnly final : public GradientSync {
 public:
  std::string name() const override { return "none (single process)"; }
  void before_forward() override {}
  void after_backward() override {}
};

}  // namespace

std::unique_ptr<GradientSync> make_gradient_sync(const TrainConfig& config,
                                                 std::shared_ptr<torch::nn::Module> model,
                                                 comm::ProcessGroup& group) {
  const auto timeout = std::chrono::milliseconds(config.world.timeout_s * 1000);
  const auto& d = config.ddp;
  if (d.mode == "bucketed") {
    ddp::DdpOptions options;
    options.broadcast_buffers = d.broadcast_buffers;
    options.reducer.buckets.bucket_cap_bytes = static_cast<int64_t>(d.bucket_cap_mb * 1024 * 1024);
    options.reducer.buckets.first_bucket_cap_bytes = static_cast<int64_t>(d.first_bucket_cap_mb * 1024 * 1024);
    options.reducer.find_unused_parameters = d.find_unused_parameters;
    options.reducer.timeout = timeout;
    return std::make_unique<BucketedSync>(std::move(model), group, std::move(options));
  }
  if (d.mode == "naive") {
    ddp::NaiveOptions options;
    options.broadcast_buffers = d.broadcast_buffers;
    options.timeout = timeout;
    return std::make_unique<NaiveSync>(std::move(model), group, options);
  }
  if (d.mode == "none") {
    if (group.size() != 1) {
      throw ConfigError(fmt::format("ddp.mode = \"none\" trains each of the {} ranks on its own; "
                                    "use \"bucketed\" or \"naive\", or run one process",
                                    group.size()));
    }
    return std::make_unique<LocalOnly>();
  }
  throw ConfigError(fmt::format("ddp.mode = \"{}\": allowed values are \"bucketed\", \"naive\", \"none\"", d.mode));
}

}  // namespace paratrain::train
