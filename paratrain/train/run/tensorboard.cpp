// TensorBoard event files: CRC-32C, TFRecord framing, the Event/Summary
// encoding of scalars, and the checking reader (see tensorboard.h).
#include "paratrain/train/run/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"

namespace paratrain::train {

namespace fs = std::filesystem;

namespace {

// Reflected Castagnoli polynomial.
constexpr uint32_t kCastagnoli = 0x82F63B78u;

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    table[i] = c;
  }
  return table;
}

// Protobuf wire format: varints, and keys = field << 3 | wire type.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (field << 3) | type); }
template <typename T>
void put_fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts only (x86, arm64)
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// A cursor over one message; every read checks the bounds.
struct Cursor {
  std::string_view data;
  size_t pos = 0;
  bool done() const { return pos >= data.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= data.size()) throw Error("truncated varint");
      const auto byte = static_cast<uint8_t>(data[pos++]);
      v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return v;
    }
    throw Error("varint longer than 10 bytes");
  }
  template <typename T>
  T fixed() {
    if (data.size() - pos < sizeof(T)) throw Error("truncated fixed-width field");
    T v;
    std::memcpy(&v, data.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (data.size() - pos < n) throw Error("truncated length-delimited field");
    auto out = data.substr(pos, n);
    pos += n;
    return out;
  }
  void skip(uint32_t type) {
    switch (type) {
      case kVarint: varint(); break;
      case kFixed64: fixed<uint64_t>(); break;
      case kLengthDelimited: bytes(); break;
      case kFixed32: fixed<uint32_t>(); break;
      default: throw Error(fmt::format("unsupported wire type {}", type));
    }
  }
};

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_fixed<double>(e, wall_time);
  put_key(e, 2, kVarint);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

// Appends the scalars of one Summary (field 5 of an Event) to `out`.
void read_summary(std::string_view summary, int64_t step, double wall_time, std::vector<ScalarEvent>& out) {
  Cursor s{summary};
  while (!s.done()) {
    const uint64_t key = s.varint();
    if (key >> 3 != 1 || (key & 7) != kLengthDelimited) {
      s.skip(key & 7);
      continue;
    }
    Cursor v{s.bytes()};
    ScalarEvent e;
    e.step = step;
    e.wall_time = wall_time;
    bool has_value = false;
    while (!v.done()) {
      const uint64_t vkey = v.varint();
      if (vkey == ((1 << 3) | kLengthDelimited)) {
        e.tag = std::string(v.bytes());
      } else if (vkey == ((2 << 3) | kFixed32)) {
        e.value = v.fixed<float>();
        has_value = true;
      } else {
        v.skip(vkey & 7);
      }
    }
    if (has_value) out.push_back(std::move(e));
  }
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const auto table = make_crc_table();
  uint32_t c = ~0u;
  for (char ch : data) c = table[(c ^ static_cast<uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = dir / fmt::format("events.out.tfevents.{}.{}.{}", std::chrono::duration_cast<std::chrono::seconds>(now).count(),
                            host, ::getpid());
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw Error(fmt::format("cannot create the TensorBoard event file {}; check run.output_dir", path_.string()));
  std::string e = event_header(std::chrono::duration<double>(now).count(), 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_fixed<float>(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string header;
  put_fixed<uint64_t>(header, event.size());
  std::string framed = header;
  put_fixed<uint32_t>(framed, masked_crc32c(header));
  framed += event;
  put_fixed<uint32_t>(framed, masked_crc32c(event));
  out_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
  out_.flush();
  if (!out_) throw Error(fmt::format("cannot write to the TensorBoard event file {}", path_.string()));
}

std::vector<ScalarEvent> read_scalar_events(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open event file {}", file.string()));
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<ScalarEvent> out;
  Cursor c{all};
  for (int64_t record = 0; !c.done(); ++record) {
    auto fail = [&](const std::string& why) {
      return Error(fmt::format("event file {}: record {} (byte {}): {}", file.string(), record, c.pos, why));
    };
    if (all.size() - c.pos < 12) throw fail("cut short in its header");
    const std::string_view length_bytes = std::string_view(all).substr(c.pos, 8);
    const auto length = c.fixed<uint64_t>();
    if (c.fixed<uint32_t>() != masked_crc32c(length_bytes)) throw fail("length CRC does not match");
    if (all.size() - c.pos < length + 4) throw fail(fmt::format("cut short: {} data bytes announced", length));
    const std::string_view data = std::string_view(all).substr(c.pos, length);
    c.pos += length;
    if (c.fixed<uint32_t>() != masked_crc32c(data)) throw fail("data CRC does not match");
    try {
      Cursor e{data};
      double wall_time = 0;
      int64_t step = 0;
      std::string_view summary;
      while (!e.done()) {
        const uint64_t key = e.varint();
        if (key == ((1 << 3) | kFixed64)) wall_time = e.fixed<double>();
        else if (key == ((2 << 3) | kVarint)) step = static_cast<int64_t>(e.varint());
        else if (key == ((5 << 3) | kLengthDelimited)) summary = e.bytes();
        else e.skip(key & 7);
      }
      read_summary(summary, step, wall_time, out);
    } catch (const Error& err) {
      throw fail(std::string("the Event does not parse: ") + err.what());
    }
  }
  return out;
}

std::vector<fs::path> list_event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

void TensorBoardLogger::on_fit_start(const FitInfo& fit) {
  if (fit.is_main) writer_ = std::make_unique<TensorBoardWriter>(fit.run_dir / "tensorboard");
}

namespace {

// A record's numbers as scalars under `tag`: objects by key, arrays of
// numbers by index, arrays of objects naming a "layer" by that name
// (a {"kind": "moe"} record: moe/blocks.1.mlp/load/3).
void add_numbers(TensorBoardWriter& writer, const std::string& tag, const nlohmann::json& value, int64_t step,
                 double time) {
  if (value.is_number()) {
    writer.add_scalar(tag, value.get<double>(), step, time);
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      if (key != "layer") add_numbers(writer, tag + "/" + key, item, step, time);
    }
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) {
      const auto& item = value[i];
      const bool named = item.is_object() && item.contains("layer") && item["layer"].is_string();
      add_numbers(writer, tag + "/" + (named ? item["layer"].get<std::string>() : std::to_string(i)), item, step,
                  time);
    }
  }
}

}  // namespace

void TensorBoardLogger::on_log(const nlohmann::json& record) {
  if (!writer_) return;
  const std::string kind = record.value("kind", "metrics");
  const int64_t step = record.value("step", int64_t{0});
  const double time = record.value("time", 0.0);
  for (const auto& [key, value] : record.items()) {
    // The axes and the clock are the event's step and wall time already.
    if (key == "step" || key == "time" || key == "epoch") continue;
    if (value.is_number()) {
      writer_->add_scalar(kind + "/" + key, value.get<double>(), step, time);
    } else if (kind == "moe" && key == "layers") {  // per layer: moe/blocks.1.mlp/load/3
      add_numbers(*writer_, kind, value, step, time);
    }
  }
}

}  // namespace paratrain::train
