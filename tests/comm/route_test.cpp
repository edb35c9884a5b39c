// source_address_towards: the local address a rank advertises to other nodes
// (bind_address_for in rendezvous.cpp). Across real interfaces it is tested
// by tests/launch/netns_test.sh, where the host name resolves to loopback.
#include <gtest/gtest.h>

#include "paratrain/comm/route.h"

namespace paratrain::comm {
namespace {

TEST(Route, LoopbackIsReachedFromLoopback) { EXPECT_EQ(source_address_towards("127.0.0.1", 29500), "127.0.0.1"); }

TEST(Route, AnUnresolvableHostHasNoRoute) {
  EXPECT_EQ(source_address_towards("no-such-host.invalid", 29500), "");
}

}  // namespace
}  // namespace paratrain::comm
