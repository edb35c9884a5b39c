// A safetensors file read in pieces: opening it checks its header and, in
// one pass over the file in blocks that are not kept, its checksums; then
// read() takes one tensor's elements from the file when asked. Holds a
// block and the header, never the file, so a rank can read its share of a
// checkpoint it could not hold whole (a sharded teacher: Note [Skeleton
// models] in models/skeleton.h), and a resume does not hold the file and a
// copy of its tensors at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "paratrain/checkpoint/safetensors.h"

namespace paratrain::checkpoint {

class SafetensorsFile {
 public:
  // `check_file_crc`, when given, sees the CRC-32 of the whole file before
  // the header is trusted (a checkpoint index records it) and throws if it
  // is wrong. Then the header is validated as read_safetensors does, and
  // the data section's checksum when the file records one. CheckpointError
  // naming the file otherwise.
  explicit SafetensorsFile(const std::filesystem::path& path,
                           const std::function<void(uint32_t)>& check_file_crc = {});
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t size() const { return size_; }

  // Elements [begin, begin + numel) of tensor `name` flattened, 1-D, read
  // from the file now.
  // from the file now (reopened first after close(): it must still have
  // the verified size, else CheckpointError).
  at::Tensor read(const std::string& name, int64_t begin, int64_t numel) const;

  // Closes the file descriptor; the header stays verified. A reader of many
  // files keeps a bounded number open (Note [Open shard files] in
  // checkpoint_index.cpp). read() reopens it, so one SafetensorsFile is not
  // to be read from two threads at once.
  void close() const;
  bool is_open() const { return fd_ >= 0; }

 private:
  std::filesystem::path path_;
  mutable int fd_ = -1;  // -1 after close(): read() opens it again
  // The verified file's identity: a reopen must find the same one.
  uint64_t device_ = 0, inode_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
};

}  // namespace paratrain::checkpoint
