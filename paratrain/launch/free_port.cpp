// Free-port selection by binding port 0 (see free_port.h for the race).
#include "paratrain/launch/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::launch {

int find_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw Error(fmt::format("cannot pick a free port: socket() failed: {}; pass --master-port",
                            std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    throw Error(fmt::format("cannot pick a free port: {}; pass --master-port", std::strerror(err)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace paratrain::launch
