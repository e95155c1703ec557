#include "base/fd_passing.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstring>

namespace kv {

ssize_t SendWithFd(int socket, const char* data, size_t length, int fd) {
  iovec iov{const_cast<char*>(data), length};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL);
}

}  // namespace kv
