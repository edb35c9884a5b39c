// How the launcher names a lost peer from a worker's output (report.h,
// describe_peer_loss): the node holding the lost ranks, and whether a
// connection closed, heartbeats stopped or a collective timed out. The
// outputs are the messages Gloo and comm/peer_watch.cpp print.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "paratrain/launch/report.h"

namespace paratrain::launch {
namespace {

TEST(PeerLoss, AHeartbeatVerdictNamesTheNodeHostAddressAndRanksAsSilent) {
  const std::string out =
      "[r0] [error] rank 0: peer heartbeats: rank 3 (pid 77 on host vm, 10.77.0.2) sent no heartbeat for 4.2 s "
      "(world.heartbeat_timeout_s = 4 s; another host: stopped, frozen or cut off by the network); its last "
      "collective: all_reduce #9 on world [0,1,2,3] Float[8]: done; rank 0 aborts its process group";
  EXPECT_EQ(describe_peer_loss(out, 2, {}),
            "node 1 (host vm, 10.77.0.2; rank 3) sent no heartbeat for 4.2 s: lost (stopped, frozen or cut off by "
            "the network), not a closed connection");
  // With the rendezvous' node ids.
  EXPECT_EQ(describe_peer_loss(out, 2, {"machine0", "machine1"}),
            "node 'machine1' (node rank 1, host vm, 10.77.0.2; rank 3) sent no heartbeat for 4.2 s: lost (stopped, "
            "frozen or cut off by the network), not a closed connection");
}

TEST(PeerLoss, AClosedConnectionIsToldApartFromATimeout) {
  const std::string closed =
      "paratrain: error: rank 0: all_reduce: Connection closed by peer [10.77.0.2]:41234 ([10.77.0.2] is rank 1 on "
      "host vm)";
  EXPECT_EQ(describe_peer_loss(closed, 1, {}),
            "the connection to node 1 (host vm, 10.77.0.2; rank 1) was closed: its processes or its machine went "
            "away (not a timeout)");
  const std::string timeout =
      "paratrain: error: rank 1: Timed out waiting 15000ms for send operation to complete; a peer rank may have died";
  EXPECT_EQ(describe_peer_loss(timeout, 1, {}),
            "a collective with a peer timed out (world.timeout_s): the peer is stopped, too slow or cut off; no "
            "connection was closed");
  // Without the worker's annotation only the address is known.
  EXPECT_EQ(describe_peer_loss("Connection reset by peer [10.0.0.9]:5", 1, {}),
            "the connection to the peer at 10.0.0.9 was closed: its processes or its machine went away (not a "
            "timeout)");
  EXPECT_EQ(describe_peer_loss("ValueError: bad config", 1, {}), "");
}

TEST(PeerLoss, TheFailureLineCarriesIt) {
  WorkerOutcome w{.rank = 0, .local_rank = 0, .pid = 5, .exited = true, .exit_code = 1};
  w.peer_error = true;
  EXPECT_EQ(describe(w), "rank 0 (pid 5) exited with code 1 (its output says a peer went away)");
  w.peer_loss = "the connection to node 1 (host vm, 10.77.0.2; rank 1) was closed";
  EXPECT_EQ(describe(w),
            "rank 0 (pid 5) exited with code 1 (its output says: the connection to node 1 (host vm, 10.77.0.2; "
            "rank 1) was closed)");
}

}  // namespace
}  // namespace paratrain::launch
