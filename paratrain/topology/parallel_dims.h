// ParallelDims: how many ranks each parallel axis spans (dp, tp, pp, cp), and
// the one check that they multiply to the world size. Pure arithmetic; the
// groups themselves are built by DeviceMesh (device_mesh.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace paratrain::topology {

// Axes from outermost (slowest-varying rank coordinate) to innermost. tp is
// innermost so tensor-parallel peers are neighbouring ranks (on one node when
// possible: they talk every layer); pp outermost (talks least, point to point).
enum class Axis { kPp = 0, kDp = 1, kCp = 2, kTp = 3 };
inline constexpr std::array<Axis, 4> kAxes = {Axis::kPp, Axis::kDp, Axis::kCp, Axis::kTp};
std::string_view to_string(Axis axis);

struct ParallelDims {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int cp = 1;

  // dp = 0 means "whatever is left": world / (tp * pp * cp), which must divide.
  // Throws ConfigError naming every factor ("dp(2) * tp(2) * pp(1) * cp(1) !=
  // world_size(6)") and the config keys to change.
  static ParallelDims resolve(int64_t dp, int64_t tp, int64_t pp, int64_t cp, int world_size);

  int size(Axis axis) const;
  int product() const { return dp * tp * pp * cp; }
  // Throws ConfigError when product() != world_size or any factor < 1.
  void validate(int world_size) const;
  std::string describe() const;  // "dp(2) * tp(1) * pp(1) * cp(1)"
};

// Rank <-> coordinates, row-major over kAxes (pp, dp, cp, tp).
struct MeshCoords {
  std::array<int, 4> at{};  // indexed by static_cast<int>(Axis)
  int operator[](Axis a) const { return at[static_cast<int>(a)]; }
};
MeshCoords coords_of(const ParallelDims& dims, int rank);
int rank_of(const ParallelDims& dims, const MeshCoords& coords);

}  // namespace paratrain::topology
