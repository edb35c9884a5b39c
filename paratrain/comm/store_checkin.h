// Every rank writes its name into the store and waits for all others, so a
// rank that never starts is reported by number instead of as a generic hang
// inside the backend's own connection setup. Whoever sees a rank die first
// (the launcher) can end the wait for everyone with abort_check_in().
#pragma once

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace paratrain::comm {

// Throws TimeoutError listing the ranks that did not check in within
// `timeout` (the first few, then how many more), and CommError with the
// reason when abort_check_in() ended the check-in first. `where` describes
// the store for the message (host:port). `key_prefix` separates successive
// check-ins on the same store.
void check_in(c10d::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
              const std::string& where, const std::string& key_prefix = "paratrain/checkin");

// Ends the check-in under `key_prefix` on `store`: every rank waiting in it,
// and every rank that arrives later, throws CommError saying `reason` (e.g.
// "the launcher saw rank 1 (pid 42) killed by SIGKILL"). Inert once a
// check-in completed. See Note [Ending a check-in] in store_checkin.cpp.
void abort_check_in(c10d::Store& store, const std::string& reason,
                    const std::string& key_prefix = "paratrain/checkin");

// abort_check_in() for the launcher, which knows the job and generation but
// not the rendezvous's keys: ends the check-in of generation `restart_count`
// of job `run_id` (TORCHELASTIC_RUN_ID) in `store`, the agent store itself.
void end_check_in(const c10::intrusive_ptr<c10d::Store>& store, const std::string& run_id, int restart_count,
                  const std::string& reason);

}  // namespace paratrain::comm
