// Handing file descriptors to other processes of this host by token: the cuda_ipc backend shares
// a VMM region with a peer as the POSIX fd of its allocation, and the host_ipc backend a host
// region as the engine's memfd; neither can travel in the packed descriptor a peer receives over
// TCP. The exporter keeps each fd in an FdServer under a random
// token and names the server's unix socket and the token in the descriptor; the importer fetches
// a duplicate with FetchFd (SCM_RIGHTS). Tokens are 64 random bits from the CSPRNG (hmac.h): a
// process of this user that never saw a descriptor cannot guess one.
//
// Only processes of this user are served (SO_PEERCRED), one short request per connection.
// Thread-safety: FdServer's methods may be called from any thread; it serves on its own thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "base/framed_socket.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace kv {

class FdServer {
 public:
  // Listens on the unix socket `path` (an existing file there is replaced; removed on
  // destruction).
  static Result<std::unique_ptr<FdServer>> Start(const std::string& path);
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& path() const { return path_; }
  // Serves `fd` (taken over) under the returned token until Remove(token).
  uint64_t Add(UniqueFd fd);
  void Remove(uint64_t token);

 private:
  FdServer(Listener listener, std::string path, UniqueFd wake);
  void Serve();
  void Answer(Socket client);

  Listener listener_;
  const std::string path_;
  UniqueFd wake_;  // eventfd: stops Serve()
  std::mutex mu_;
  std::map<uint64_t, UniqueFd> fds_;
  std::thread thread_;
};

// A duplicate of the fd the FdServer at unix socket `path` serves under `token`. kNotFound when it
// serves none under it (the region was deregistered), kUnavailable when nobody listens, kTimeout
// at the deadline.
Result<UniqueFd> FetchFd(std::string_view path, uint64_t token, SteadyTime deadline);

}  // namespace kv
