// init_from_env and World (world.h): the rendezvous plus the process setup
// that `paratrain train` does before it (logging, thread count).
#include "paratrain/api/world.h"

#include <ATen/Parallel.h>

#include "paratrain/core/env.h"
#include "paratrain/core/logging.h"

namespace paratrain {

World::World(comm::WorldInfo info, std::shared_ptr<comm::ProcessGroup> group)
    : info_(std::move(info)), group_(std::move(group)) {}

void World::barrier() const { group_->barrier()->wait(); }

World init_from_env(const InitOptions& options) {
  auto info = comm::world_from_env();
  init_logging(info.rank, options.log_level, "InitOptions::log_level");
  if (options.one_thread_per_local_rank && !env::get("OMP_NUM_THREADS") && info.local_world_size > 1)
    at::set_num_threads(1);
  comm::InitOptions init;
  init.timeout = options.timeout;
  init.backend = !options.backend.empty() ? options.backend : env::get_or("PARATRAIN_BACKEND", "gloo");
  auto group = comm::init_process_group(info, init);
  return World(std::move(info), std::move(group));
}

}  // namespace paratrain
