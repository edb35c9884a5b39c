// Picks a TCP port that is free on this machine, for a single-node launch
// that was given no --master-port. Not a reservation: see find_free_port().
#pragma once

namespace paratrain::launch {

// Binds a TCP socket to port 0 on all IPv4 interfaces (where rank 0's store
// will listen), reads the port the kernel chose, and closes the socket. The
// socket never listened, so the port is reusable at once; another process may
// still take it before rank 0 binds it (torchrun has the same race). Throws
// Error when no socket can be bound.
int find_free_port();

}  // namespace paratrain::launch
