// Which local address reaches a given host: the question a rank answers
// before it tells other nodes where to connect (rendezvous.cpp,
// bind_address_for). Asks the kernel's routing table; sends nothing.
// std + POSIX only.
#pragma once

#include <string>

namespace paratrain::comm {

// The numeric address ("10.77.0.2", "fd00::2") of the interface this host
// would use to send to host:port (a connected UDP socket's source address),
// or "" when host does not resolve or no route leads there. For one of this
// host's own addresses it is that address; for 127.0.0.1, 127.0.0.1.
std::string source_address_towards(const std::string& host, int port);

}  // namespace paratrain::comm
