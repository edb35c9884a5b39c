// Every rank writes its name into the store and waits for all others, so a
// rank that never starts is reported by number instead of as a generic hang
// inside the backend's own connection setup. Whoever sees a rank die first
// (the launcher) can end the wait for everyone with abort_check_in().
#pragma once

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "paratrain/core/error.h"

namespace c10d {
class Store;
}

namespace paratrain::comm {

/// The launcher ended the rendezvous (abort_check_in) because a rank died
/// before the world was built: thrown by check_in() and by the blocking
/// calls of a store from ending_with_check_in().
class CheckInEnded : public CommError {
 public:
  using CommError::CommError;
};

// Throws TimeoutError listing the ranks that did not check in within
// `timeout` (the first few, then how many more), and CommError with the
// reason when abort_check_in() ended the check-in first. `where` describes
// the store for the message (host:port). `key_prefix` separates successive
// check-ins on the same store.
void check_in(c10d::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
              const std::string& where, const std::string& key_prefix = "paratrain/checkin");

// Ends the check-in under `key_prefix` on `store`: every rank waiting in it,
// and every rank that arrives later, throws CommError saying `reason` (e.g.
// "the launcher saw rank 1 (pid 42) killed by SIGKILL"), and so does every
// rank still setting up its connections on a store from
// ending_with_check_in(). Inert once the world is built. See Note [Ending a
// check-in] in store_checkin.cpp.
void abort_check_in(c10d::Store& store, const std::string& reason,
                    const std::string& key_prefix = "paratrain/checkin");

// Whether abort_check_in() ended the check-in under `key_prefix` on `store`.
bool check_in_ended(c10d::Store& store, const std::string& key_prefix = "paratrain/checkin");

// `store` (the job's, where check_in ran) as the backends' connection setup
// should see it: a blocking get() or wait() also ends, with CommError saying
// the reason, once abort_check_in() ended the check-in, so a rank that died
// after checking in but before publishing its address does not hold the
// others for `timeout` (Note [Ending a check-in]). Other calls pass through.
c10::intrusive_ptr<c10d::Store> ending_with_check_in(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                     std::string where,
                                                     const std::string& key_prefix = "paratrain/checkin");

// abort_check_in() for the launcher, which knows the job and generation but
// not the rendezvous's keys: ends the check-in of generation `restart_count`
// of job `run_id` (TORCHELASTIC_RUN_ID) in `store`, the agent store itself.
void end_check_in(const c10::intrusive_ptr<c10d::Store>& store, const std::string& run_id, int restart_count,
                  const std::string& reason);

}  // namespace paratrain::comm
