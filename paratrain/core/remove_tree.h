// remove_tree(): std::filesystem::remove_all without std::filesystem. Header
// only and torch-free, so the launcher (no LibTorch) shares it with the
// checkpoint code.
//
// Why not remove_all: a PyTorch wheel's libtorch.so carries and exports its
// own copy of parts of libstdc++'s <filesystem>, and a program linked against
// it binds std::filesystem::remove_all to that copy, which jumps through a
// null pointer (SIGSEGV; seen with LibTorch 2.11.0+cu130 on 2026-11-25,
// docs/cuda.md). Debian's LibTorch does not, but one code path serves both.
#pragma once

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace paratrain::core {

/// Deletes `root` and everything under it, never following symbolic links.
/// A missing `root` is no error. On failure `ec` holds the first error met;
/// what could be deleted is deleted.
inline void remove_tree(const std::filesystem::path& root, std::error_code& ec) {
  ec.clear();
  struct stat st;
  if (::lstat(root.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return;
  }
  // nftw's callback takes no user pointer; one walk per thread at a time.
  static thread_local int first_error;
  first_error = 0;
  auto visit = [](const char* path, const struct stat*, int kind, struct FTW*) -> int {
    // Children come before their directory (FTW_DEPTH): FTW_DP is a directory
    // whose contents are gone; everything else is a file or a link.
    const int rc = kind == FTW_DP || kind == FTW_DNR ? ::rmdir(path) : ::unlink(path);
    if (rc != 0 && errno != ENOENT && first_error == 0) first_error = errno;
    return 0;  // keep going: delete what can be deleted
  };
  if (::nftw(root.c_str(), visit, 16, FTW_DEPTH | FTW_PHYS) != 0 && first_error == 0) first_error = errno;
  if (first_error != 0) ec.assign(first_error, std::generic_category());
}

}  // namespace paratrain::core
