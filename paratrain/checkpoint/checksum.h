// CRC-32 (zlib's, the IEEE 802.3 polynomial that `zlib.crc32` and `crc32`
// tools compute) over bytes and over whole files, written as 8 lowercase hex
// digits. Detects bit flips and truncation in checkpoint data; not a
// cryptographic hash (a deliberate forgery is out of scope).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace paratrain::checkpoint {

// The algorithm's name as recorded next to checksums (index.json "checksum").
inline constexpr const char* kChecksumAlgorithm = "crc32";

// Continues `crc` (0 to start) over `bytes`; any length (zlib takes 32-bit
// lengths, so long spans are fed in pieces).
uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes);

// CRC-32 of the whole file, streamed. Throws CheckpointError naming the file.
uint32_t file_crc32(const std::filesystem::path& path);

// "0badf00d" and back; parse returns false on anything but 8 hex digits.
std::string crc32_hex(uint32_t crc);
bool parse_crc32_hex(const std::string& text, uint32_t& crc);

}  // namespace paratrain::checkpoint
