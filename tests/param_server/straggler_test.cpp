// The straggler knob: "always" slows one worker on every forward; "random"
// slows each worker on about 1 / workers of its forwards, reproducibly, and
// not the same forwards on every worker (else it would be a slow machine
// shared by all, which SSP could not absorb).
#include <gtest/gtest.h>

#include "paratrain/core/error.h"
#include "paratrain/param_server/straggler.h"

namespace ps = paratrain::param_server;

TEST(Straggler, AlwaysSlowsTheNamedWorkerOnEveryForward) {
  ps::StragglerOptions o{.pattern = ps::SlowPattern::kAlways, .slow_worker = 1, .slow_ms = 20, .seed = 0, .workers = 3};
  for (int64_t n = 0; n < 100; ++n) {
    EXPECT_FALSE(ps::is_slowed(o, 0, n));
    EXPECT_TRUE(ps::is_slowed(o, 1, n));
    EXPECT_FALSE(ps::is_slowed(o, 2, n));
  }
  o.slow_ms = 0;  // no delay: nobody sleeps
  EXPECT_FALSE(ps::is_slowed(o, 1, 0));
}

TEST(Straggler, RandomSlowsEachWorkerOnAboutOneInWorkersForwardsReproducibly) {
  const int workers = 3, forwards = 3000;
  ps::StragglerOptions o{.pattern = ps::SlowPattern::kRandom, .slow_worker = -1, .slow_ms = 20, .seed = 7,
                         .workers = workers};
  int same_as_worker0 = 0;
  for (int w = 0; w < workers; ++w) {
    int slowed = 0;
    for (int64_t n = 0; n < forwards; ++n) {
      const bool s = ps::is_slowed(o, w, n);
      EXPECT_EQ(s, ps::is_slowed(o, w, n));  // a pure function of (seed, worker, forward)
      slowed += s;
      if (w == 1) same_as_worker0 += s == ps::is_slowed(o, 0, n);
    }
    // Binomial(3000, 1/3): mean 1000, sd 26; 6 sd either side.
    EXPECT_GT(slowed, 840) << "worker " << w;
    EXPECT_LT(slowed, 1160) << "worker " << w;
  }
  // Independent draws agree on 5/9 of the forwards (1/9 both, 4/9 neither);
  // identical ones on all of them.
  EXPECT_LT(same_as_worker0, forwards * 0.65);
  ps::StragglerOptions other = o;
  other.seed = 8;
  int differs = 0;
  for (int64_t n = 0; n < 300; ++n) differs += ps::is_slowed(o, 0, n) != ps::is_slowed(other, 0, n);
  EXPECT_GT(differs, 0);
}

TEST(Straggler, AnUnknownPatternIsAConfigErrorNamingTheKey) {
  EXPECT_EQ(ps::parse_slow_pattern("random"), ps::SlowPattern::kRandom);
  try {
    ps::parse_slow_pattern("sometimes");
    FAIL();
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ps.slow_pattern = \"sometimes\""), std::string::npos) << e.what();
  }
}
