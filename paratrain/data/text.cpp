// Byte tokenization into the cache file of Note [Token cache file] in
// text.h, its memory mapping, and the window datasets built on it.
#include "paratrain/data/text.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"

namespace paratrain::data {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'P', 'T', 'T', 'O', 'K', 'E', 'N', '1'};
constexpr size_t kHeaderBytes = 24;
constexpr uint32_t kFormatVersion = 1;

void put_u32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_le(const unsigned char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

uint32_t crc32_of(const unsigned char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed at most 1 GiB at a time.
  while (n > 0) {
    const size_t piece = std::min<size_t>(n, size_t{1} << 30);
    crc = crc32(crc, data, static_cast<uInt>(piece));
    data += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(crc);
}

bool looks_binary(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::array<char, 8192> head{};
  in.read(head.data(), head.size());
  return std::find(head.begin(), head.begin() + in.gcount(), '\0') != head.begin() + in.gcount();
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot read text file {}: {}", file.string(), std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError(fmt::format("error while reading text file {}", file.string()));
  return bytes;
}

// What the map_token_file checks found, or "" for a valid file.
std::string check_token_file(const unsigned char* data, size_t size) {
  if (size < kHeaderBytes) return fmt::format("{} bytes, shorter than the {}-byte header", size, kHeaderBytes);
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) return "its first bytes are not the magic \"PTTOKEN1\"";
  const uint64_t count = get_le(data + 8, 8);
  const uint64_t width = get_le(data + 20, 4);
  if (width != 1) return fmt::format("it stores {} bytes per token; this reader knows 1", width);
  if (count != size - kHeaderBytes)
    return fmt::format("its header promises {} tokens but it holds {} (truncated or overwritten)", count,
                       size - kHeaderBytes);
  const uint32_t expected = static_cast<uint32_t>(get_le(data + 16, 4));
  const uint32_t actual = crc32_of(data + kHeaderBytes, count);
  if (expected != actual) return fmt::format("checksum mismatch (header {:08x}, tokens {:08x})", expected, actual);
  return "";
}

std::string check_token_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return "cannot be opened";
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return check_token_file(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

void write_token_file(const fs::path& target, const std::vector<fs::path>& files) {
  std::string tokens;
  for (const auto& f : files) tokens += read_file(f);
  std::array<char, kHeaderBytes> header{};
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  put_u64(header.data() + 8, tokens.size());
  put_u32(header.data() + 16, crc32_of(reinterpret_cast<const unsigned char*>(tokens.data()), tokens.size()));
  put_u32(header.data() + 20, 1);
  // A name no other writer uses (ranks may be processes or threads).
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = target.string() + fmt::format(".tmp.{}.{}.{}", ::getpid(),
                                                     std::hash<std::thread::id>{}(std::this_thread::get_id()),
                                                     counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(header.data(), header.size());
    out.write(tokens.data(), static_cast<std::streamsize>(tokens.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw DataError(fmt::format("cannot write the token cache {}: {}; point the cache at a writable folder",
                                  tmp.string(), std::strerror(errno)));
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw DataError(fmt::format("cannot move the token cache into place at {}: {}", target.string(), ec.message()));
  }
}

}  // namespace

std::vector<fs::path> list_text_files(const fs::path& source) {
  std::error_code ec;
  const auto status = fs::status(source, ec);
  if (ec || !fs::exists(status)) {
    throw DataError(fmt::format(
        "text corpus {} does not exist; set data.path to a text file or folder (the default, {}, comes with "
        "Debian's fortunes package: apt-get install fortunes)",
        source.string(), kFortunesDir));
  }
  std::vector<fs::path> files;
  if (fs::is_regular_file(status)) {
    files.push_back(source);
  } else {
    for (auto it = fs::recursive_directory_iterator(source, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_symlink() || !it->is_regular_file()) continue;
      if (looks_binary(it->path())) continue;
      files.push_back(it->path());
    }
    if (ec) throw DataError(fmt::format("cannot list the text corpus {}: {}", source.string(), ec.message()));
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) {
    throw DataError(fmt::format("text corpus {} holds no text file (binary files and symbolic links are skipped)",
                                source.string()));
  }
  return files;
}

fs::path token_cache_path(const fs::path& source, const fs::path& cache_dir) {
  // FNV-1a, 64 bits: stable across runs and builds (std::hash is not).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;  // a separator, so ("ab","c") and ("a","bc") differ
    h *= 1099511628211ull;
  };
  mix(fmt::format("v{}", kFormatVersion));
  for (const auto& f : list_text_files(source)) {
    std::error_code ec;
    const auto absolute = fs::absolute(f, ec);
    mix(absolute.string());
    mix(std::to_string(fs::file_size(f, ec)));
    mix(std::to_string(fs::last_write_time(f, ec).time_since_epoch().count()));
  }
  return cache_dir / fmt::format("text-{:016x}.tokens", h);
}

fs::path build_token_cache(const fs::path& source, const fs::path& cache_dir) {
  const fs::path target = token_cache_path(source, cache_dir);
  if (fs::exists(target) && check_token_file(target).empty()) return target;
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) {
    throw DataError(fmt::format("cannot create the token cache folder {}: {}", cache_dir.string(), ec.message()));
  }
  write_token_file(target, list_text_files(source));
  return target;
}

at::Tensor map_token_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("cannot open token cache {}: {}", file.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw DataError(fmt::format("cannot stat token cache {}: {}", file.string(), std::strerror(err)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = size == 0 ? MAP_FAILED : ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    throw DataError(fmt::format("token cache {} is {}; delete it to rebuild it", file.string(),
                                size == 0 ? "empty" : fmt::format("not mappable ({})", std::strerror(err))));
  }
  const auto* bytes = static_cast<const unsigned char*>(map);
  if (auto problem = check_token_file(bytes, size); !problem.empty()) {
    ::munmap(map, size);
    throw DataError(fmt::format("token cache {} is corrupt: {}; delete it to rebuild it from the corpus",
                                file.string(), problem));
  }
  const int64_t count = static_cast<int64_t>(size - kHeaderBytes);
  // The storage owns the mapping: views (windows, batches' sources) keep it.
  return torch::from_blob(const_cast<unsigned char*>(bytes) + kHeaderBytes, {count},
                          [map, size](void*) { ::munmap(map, size); },
                          torch::TensorOptions().dtype(torch::kByte));
}

TensorDataset make_windows(const at::Tensor& tokens, int64_t seq_len) {
  TORCH_CHECK(tokens.dim() == 1, "make_windows: tokens must be 1-D, got ", tokens.sizes());
  TORCH_CHECK(seq_len > 0, "make_windows: seq_len must be > 0, got ", seq_len);
  const int64_t rows = tokens.numel() > 0 ? (tokens.numel() - 1) / seq_len : 0;
  const at::Tensor flat = tokens.contiguous();
  // Row i starts at token i*S; targets are the same rows one token later.
  return TensorDataset(flat.as_strided({rows, seq_len}, {seq_len, 1}, flat.storage_offset()),
                       flat.as_strided({rows, seq_len}, {seq_len, 1}, flat.storage_offset() + 1));
}

TextDatasets load_text(const TextOptions& o) {
  if (!(o.validation_fraction > 0 && o.validation_fraction < 1)) {
    throw DataError(fmt::format("TextOptions.validation_fraction must be in (0, 1), got {}", o.validation_fraction));
  }
  TextDatasets out;
  out.cache_file = build_token_cache(o.source, o.cache_dir);
  at::Tensor tokens;
  try {
    tokens = map_token_file(out.cache_file);
  } catch (const DataError&) {
    // Damaged between the check and the map (another writer, a full disk):
    // rebuild once from the sources; a second failure is reported.
    write_token_file(out.cache_file, list_text_files(o.source));
    tokens = map_token_file(out.cache_file);
  }
  out.tokens = tokens.numel();
  const int64_t held_out = static_cast<int64_t>(std::ceil(static_cast<double>(out.tokens) * o.validation_fraction));
  const int64_t split = out.tokens - held_out;
  out.train = make_windows(tokens.slice(0, 0, split), o.seq_len);
  out.validation = make_windows(tokens.slice(0, split), o.seq_len);
  if (out.train.size() == 0 || out.validation.size() == 0) {
    throw DataError(fmt::format(
        "text corpus {} ({} tokens) is too small for seq_len {}: its training part ({} tokens) and validation "
        "part (the last {:.0f}%, {} tokens) each need more than seq_len tokens; use a larger corpus or a smaller "
        "model.seq_len",
        o.source.string(), out.tokens, o.seq_len, split, 100 * o.validation_fraction, held_out));
  }
  return out;
}

}  // namespace paratrain::data
