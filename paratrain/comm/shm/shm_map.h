// Creating, opening and unlinking the /dev/shm mappings of the shm backend
// (the group's segment, shm_segment.h, and its symmetric blocks,
// shm_symmetric.h): the POSIX calls and their errors, written once.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace paratrain::comm::shm_detail {

// Rank 0's side: creates /dev/shm/<name> (it must not exist), sizes it to
// `bytes` (zero-filled) and maps it. On failure nothing is left behind and
// CommError says what to do (/dev/shm too small, not writable).
void* create_mapping(const std::string& name, std::size_t bytes);

// Another rank's side: maps the existing /dev/shm/<name> of `bytes`, created
// by rank 0. CommError when it cannot (another host, /dev/shm not shared).
void* open_mapping(const std::string& name, std::size_t bytes, int rank);

// Rank 0, after creating: waits until all_mapped() (polling), then unlinks
// the name; a mapping outlives its name, so from then on a crash leaves
// nothing in /dev/shm. At `deadline` unlinks anyway and throws TimeoutError
// with missing()'s text ("ranks [1] did not map ...").
void unlink_once_mapped(const std::string& name, const std::function<bool()>& all_mapped,
                        std::chrono::steady_clock::time_point deadline, const std::function<std::string()>& missing);

}  // namespace paratrain::comm::shm_detail
