// Replacing a file whole: readers see the old file or the new one, never half
// of one. Used for run metadata (config.toml), traces and data caches; the
// checkpoint tensors have their own writer (checkpoint/safetensors.h).
#pragma once

#include <filesystem>
#include <string_view>

namespace paratrain {

struct AtomicWriteOptions {
  // fsync the file and its folder, so a power loss never leaves an empty
  // file in place. Off for files that are cheap to regenerate (traces).
  bool sync = true;
};

// Writes `bytes` to a sibling temporary file, then renames it over `path`
// (atomic within one folder). Creates missing parent folders. Throws Error
// naming the file and the reason; the temporary file is removed on failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                           AtomicWriteOptions options = {});

}  // namespace paratrain
