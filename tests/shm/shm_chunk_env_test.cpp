// $PARATRAIN_SHM_CHUNK_KB, the chunk-size knob of bench/run_shm_chunk_sweep.sh:
// read when set, the fallback when not, a ConfigError naming it when bad.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "paratrain/comm/shm/shm_group.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

TEST(ShmChunkEnv, SetUnsetAndBadValues) {
  unsetenv("PARATRAIN_SHM_CHUNK_KB");
  EXPECT_EQ(shm_chunk_bytes_from_env(1 << 20), std::size_t{1} << 20);
  setenv("PARATRAIN_SHM_CHUNK_KB", "256", 1);
  EXPECT_EQ(shm_chunk_bytes_from_env(1 << 20), std::size_t{256} << 10);
  for (const char* bad : {"0", "-4", "lots", "2097152"}) {
    setenv("PARATRAIN_SHM_CHUNK_KB", bad, 1);
    try {
      shm_chunk_bytes_from_env(1 << 20);
      ADD_FAILURE() << "accepted PARATRAIN_SHM_CHUNK_KB=" << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("PARATRAIN_SHM_CHUNK_KB"), std::string::npos) << e.what();
    }
  }
  unsetenv("PARATRAIN_SHM_CHUNK_KB");
}

}  // namespace
}  // namespace paratrain::comm
