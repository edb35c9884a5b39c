// See route.h. A connected UDP socket has a source address as soon as
// connect() returns (the kernel picked the route), and no packet is sent.
#include "paratrain/comm/route.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

namespace paratrain::comm {

std::string source_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return {};
  std::string result;
  for (addrinfo* a = found; a != nullptr && result.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[NI_MAXHOST] = {0};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
      result = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return result;
}

}  // namespace paratrain::comm
