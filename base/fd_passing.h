// Sending a file descriptor beside the bytes of a unix-socket message (SCM_RIGHTS): how the
// connector hands kvd a shared-memory fd or a CUDA VMM allocation's fd, and how the cuda_ipc
// fd server hands one to a peer kvd.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace kv {

// One sendmsg(2) of [data, data + length) on `socket`, with `fd` attached when it is >= 0
// (callers attach it to the first piece of a message only). MSG_NOSIGNAL: a closed peer is an
// error (EPIPE), not a signal. Returns what sendmsg returns; errno as it leaves it.
ssize_t SendWithFd(int socket, const char* data, size_t length, int fd);

}  // namespace kv
