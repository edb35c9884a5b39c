// What a worker is started with: its environment (the launcher's own plus
// torchrun's variables) and the resolved path of the program. Pure functions
// of the options, so they are tested without starting processes.
#pragma once

#include <string>
#include <vector>

#include "paratrain/launch/launcher.h"

namespace paratrain::launch {

// The variables torchrun sets, in the order they are added.
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// NODE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID; plus OMP_NUM_THREADS=1 and
// OPENBLAS_NUM_THREADS=1 when nproc_per_node > 1 and the launcher's
// environment does not set them (N ranks with a BLAS thread per core each
// oversubscribe the machine; an explicit value wins, as with torchrun);
// plus PARATRAIN_LAUNCH_ID when launch_id is set, PARATRAIN_JOB_TOKEN when
// job_token is set, PARATRAIN_PS_SERVERS when num_servers > 0,
// PARATRAIN_BACKEND when backend is set, and PARATRAIN_HEARTBEAT_DIR when
// heartbeat_dir is set.
// `options` must be resolved: master_addr non-empty and master_port > 0.
// `base` is a NULL-terminated "KEY=VALUE" array (the launcher's environ);
// entries for the variables above are replaced, TORCHELASTIC_USE_AGENT_STORE
// is dropped (no agent store here), the others kept in order.
std::vector<std::string> worker_environment(const LaunchOptions& options, int local_rank,
                                            const char* const* base);

// Finds the program to exec: a name with '/' is used as is, else the first
// executable match on `path_env` (PATH; an empty entry means the current
// directory). Throws ConfigError saying which of "not found", "is a
// directory", "not executable" applies, and what to do.
std::string resolve_program(const std::string& name, const char* path_env);

}  // namespace paratrain::launch
