// SafetensorsFile: see safetensors_file.h.
#include "paratrain/checkpoint/safetensors_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "paratrain/checkpoint/checksum.h"
#include "paratrain/core/error.h"

namespace paratrain::checkpoint {

// Refuses anything but a regular file before it is read (safetensors.cpp;
// internal to the checkpoint module).
void require_regular_file(const std::filesystem::path& path);

namespace {

constexpr size_t kBlock = size_t{4} << 20;  // what one pass holds at a time
// Past safetensors.cpp's cap on the JSON's length the header is refused
// anyway: keep no more of a corrupt one than that.
constexpr uint64_t kHeaderCap = 100'000'001;

CheckpointError read_error(const std::filesystem::path& path, const std::string& what) {
  return CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path.string(), what));
}

// Reads exactly `size` bytes at `offset`, or throws.
void read_at(int fd, void* data, size_t size, uint64_t offset, const std::filesystem::path& path) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw read_error(path, std::strerror(errno));
    if (n == 0) throw read_error(path, fmt::format("the file ended {} bytes early (truncated while open?)", size));
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path, const std::function<void(uint32_t)>& check_file_crc)
    : path_(path) {
  require_regular_file(path);  // a device or a FIFO would never end
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw read_error(path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw read_error(path, std::strerror(err));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  device_ = static_cast<uint64_t>(st.st_dev);
  inode_ = static_cast<uint64_t>(st.st_ino);
  mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  try {
    // One pass: the whole file's CRC, the header's bytes, the data's CRC.
    std::vector<uint8_t> block(static_cast<size_t>(std::min<uint64_t>(kBlock, std::max<uint64_t>(size_, 1))));
    uint8_t first8[8] = {0};
    uint64_t json_length = 0;
    std::string json;
    uint32_t file_crc = 0, data_crc = 0;
    for (uint64_t at = 0; at < size_;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), size_ - at));
      read_at(fd_, block.data(), n, at, path);
      file_crc = crc32_update(file_crc, {block.data(), n});
      for (uint64_t i = at; i < at + n && i < 8; ++i) first8[i] = block[static_cast<size_t>(i - at)];
      if (at < 8 && at + n >= 8) {
        for (int i = 7; i >= 0; --i) json_length = (json_length << 8) | first8[i];
      }
      // The header's bytes (a corrupt length is refused when parsed: keep
      // no more than the file has).
      const uint64_t json_end = 8 + std::min({json_length, kHeaderCap, size_ >= 8 ? size_ - 8 : uint64_t{0}});
      if (at + n > 8 && at < json_end) {
        const uint64_t lo = std::max<uint64_t>(at, 8), hi = std::min<uint64_t>(at + n, json_end);
        json.append(reinterpret_cast<const char*>(block.data() + (lo - at)), static_cast<size_t>(hi - lo));
      }
      if (at + n > json_end && json_end >= 8 && at + n >= 8) {
        const uint64_t lo = std::max<uint64_t>(at, json_end);
        data_crc = crc32_update(data_crc, {block.data() + (lo - at), static_cast<size_t>(at + n - lo)});
      }
      at += n;
    }
    if (check_file_crc) check_file_crc(file_crc);
    header_ = parse_safetensors_header(json_length, json, size_, path.string());
    if (auto it = header_.metadata.find(kDataChecksumKey); it != header_.metadata.end()) {
      uint32_t expected = 0;
      if (!parse_crc32_hex(it->second, expected))
        throw CheckpointError(fmt::format("checkpoint '{}' is invalid: metadata '{}' = '{}' is not 8 hex digits",
                                          path.string(), kDataChecksumKey, it->second));
      if (data_crc != expected)
        throw CheckpointError(fmt::format("checkpoint '{}' is invalid: tensor data checksum mismatch ({} {} "
                                          "recorded, {} computed): the file is corrupt (a bit flip on disk or in "
                                          "transfer); use another checkpoint",
                                          path.string(), kChecksumAlgorithm, it->second, crc32_hex(data_crc)));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { close(); }

void SafetensorsFile::close() const {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

at::Tensor SafetensorsFile::read(const std::string& name, int64_t begin, int64_t numel) const {
  const auto it = header_.tensors.find(name);
  TORCH_CHECK(it != header_.tensors.end(), "SafetensorsFile::read: '", path_.string(), "' has no tensor '", name, "'");
  const SafetensorsEntry& e = it->second;
  const int64_t element = static_cast<int64_t>(c10::elementSize(e.dtype));
  const int64_t total = static_cast<int64_t>(e.end - e.begin) / element;
  TORCH_CHECK(begin >= 0 && numel >= 0 && begin + numel <= total, "SafetensorsFile::read: elements [", begin, ", ",
              begin + numel, ") of '", name, "' (", total, " elements)");
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(e.dtype));
  if (numel > 0 && fd_ < 0) {
    // Reopened after close(): it must be the file that was verified (the
    // same inode, size and modification time), not one saved over it since.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw read_error(path_, std::strerror(errno));
    struct stat st {};
    const bool same = ::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == size_ &&
                      static_cast<uint64_t>(st.st_dev) == device_ && static_cast<uint64_t>(st.st_ino) == inode_ &&
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec == mtime_ns_;
    if (!same) {
      ::close(fd);
      throw read_error(path_, "it was replaced since it was verified (another save of this step?); read the "
                              "checkpoint again");
    }
    fd_ = fd;
  }
  if (numel > 0)
    read_at(fd_, out.data_ptr(), static_cast<size_t>(numel * element),
            header_.data_offset + e.begin + static_cast<uint64_t>(begin * element), path_);
  return out;
}

}  // namespace paratrain::checkpoint
