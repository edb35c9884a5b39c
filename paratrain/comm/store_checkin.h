// Every rank writes its name into the store and waits for all others, so a
// rank that never starts is reported by number instead of as a generic hang
// inside the backend's own connection setup.
#pragma once

#include <chrono>
#include <string>

namespace c10d {
class Store;
}

namespace paratrain::comm {

// Throws TimeoutError listing the ranks that did not check in within
// `timeout`. `where` describes the store for the message (host:port).
// `key_prefix` separates successive check-ins on the same store.
void check_in(c10d::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
              const std::string& where, const std::string& key_prefix = "paratrain/checkin");

}  // namespace paratrain::comm
