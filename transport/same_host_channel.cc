#include "transport/same_host_channel.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

namespace kv::transport {

std::string HostId() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  if (id.empty()) {
    char name[64] = {};
    gethostname(name, sizeof(name) - 1);
    id = name;
  }
  return id.substr(0, kHostIdBytes - 1);
}

namespace {

// Whether nothing listens at the unix socket `path` any more (connect() is refused); false when
// it accepts, is busy, or cannot be asked.
bool NobodyListensAt(const std::string& path) {
  sockaddr_un un{};
  if (path.size() >= sizeof(un.sun_path)) return false;
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return false;
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&un), sizeof(un)) != 0 &&
         errno == ECONNREFUSED;
}

// Removes the socket pairs "kvd-<tag>-<pid>-<n>.sock" (and its ".fd") in `dir` that a killed
// process left. Its pid is asked first, so that a live channel (in this PID namespace) is never
// probed, not even between its bind() and listen(); the refused connect() then guards against a
// live one of another PID namespace that shares the directory.
void RemoveLeftSockets(const std::string& dir, std::string_view tag) {
  const std::string prefix = "kvd-" + std::string(tag) + "-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".sock")) continue;
    const std::string pid_text =
        name.substr(prefix.size(), name.find('-', prefix.size()) - prefix.size());
    char* end = nullptr;
    const long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (pid_text.empty() || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue;  // alive, or not ours to ask
    const std::string path = entry.path().string();
    std::error_code ignored;
    if (!entry.is_socket(ignored) || !NobodyListensAt(path)) continue;
    ::unlink(path.c_str());
    if (NobodyListensAt(path + ".fd")) ::unlink((path + ".fd").c_str());
  }
}

}  // namespace

SameHostChannel::SameHostChannel(std::string name, std::mutex* mu, Gone gone)
    : name_(std::move(name)), host_id_(HostId()), mu_(mu), gone_(std::move(gone)) {}

Result<std::unique_ptr<SameHostChannel>> SameHostChannel::Open(std::string name,
                                                               const std::string& socket_dir,
                                                               std::string_view tag, std::mutex* mu,
                                                               Gone gone) {
  static std::atomic<int> counter{0};
  std::string path = socket_dir + "/kvd-" + std::string(tag) + "-" + std::to_string(getpid()) +
                     "-" + std::to_string(counter++) + ".sock";
  if (path.size() + 3 >= kFdPathBytes) {
    return Status::InvalidArgument(name + ": socket_dir '" + socket_dir + "' is too long");
  }
  RemoveLeftSockets(socket_dir, tag);
  std::unique_ptr<SameHostChannel> channel(
      new SameHostChannel(std::move(name), mu, std::move(gone)));
  KV_ASSIGN_OR_RETURN(channel->listener_, Listener::Listen("unix:" + path));
  KV_ASSIGN_OR_RETURN(channel->fd_server_, FdServer::Start(path + ".fd"));
  channel->wake_fd_ = UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!channel->wake_fd_.valid()) return Status::IoError(channel->name_ + ": eventfd failed");
  return channel;
}

Result<PeerId> SameHostChannel::Connect(std::string_view address, SteadyTime deadline) {
  const size_t bar = address.find('|');
  if (bar == std::string_view::npos || address.substr(bar + 1, 5) != "unix:") {
    return Status::InvalidArgument(name_ + " address must be '<host id>|unix:<path>'");
  }
  if (address.substr(0, bar) != host_id_) {
    return Status::Incompatible(name_ + " peer is on another host (or booted differently)");
  }
  const std::string endpoint(address.substr(bar + 1));
  KV_ASSIGN_OR_RETURN(Socket socket, Socket::Connect(endpoint, deadline));
  auto peer = std::make_shared<Peer>();
  peer->socket = std::move(socket);
  peer->fd_path = endpoint.substr(5) + ".fd";
  std::lock_guard lock(*mu_);
  const PeerId id = next_peer_++;
  peers_[id] = std::move(peer);
  Wake();  // Poll watches the new connection from its next pass
  return id;
}

Result<std::string> SameHostChannel::FdPathOf(PeerId peer) const {
  std::lock_guard lock(*mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return Status::NotFound(name_ + ": unknown peer");
  return it->second->fd_path;
}

Status SameHostChannel::CheckPeerLocked(PeerId peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return Status::NotFound(name_ + ": peer not connected");
  if (it->second->dead) return Status::Unavailable(name_ + ": peer is gone");
  return Status::Ok();
}

Status SameHostChannel::GoneLocked(PeerId peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return Status::Aborted(name_ + ": peer disconnected");
  if (it->second->dead) return Status::Unavailable(name_ + ": peer process is gone");
  return Status::Ok();
}

void SameHostChannel::SendNote(PeerId peer, std::string_view note, SteadyTime deadline) {
  std::shared_ptr<Peer> to;
  {
    std::lock_guard lock(*mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end() || it->second->dead) return;
    to = it->second;
  }
  if (!to->socket.SendFrame(note, deadline).ok()) Drop(peer, /*forget=*/false);
}

void SameHostChannel::SetNotificationHandler(NotificationHandler handler) {
  std::lock_guard lock(*mu_);
  handler_ = std::move(handler);
}

void SameHostChannel::Drop(PeerId peer, bool forget) {
  const Status why = forget ? Status::Aborted(name_ + ": peer disconnected")
                            : Status::Unavailable(name_ + ": peer process is gone");
  std::vector<Completion> failed;
  {
    std::lock_guard lock(*mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end() || (!forget && it->second->dead)) return;
    if (forget) {
      peers_.erase(it);
    } else {
      it->second->dead = true;
    }
    gone_(peer, why, &failed);
  }
  for (Completion& done : failed) done(why);
  if (forget) Wake();  // Poll stops watching its connection
}

void SameHostChannel::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
}

bool SameHostChannel::Poll(std::chrono::nanoseconds wait) {
  std::vector<std::pair<PeerId, std::shared_ptr<Peer>>> outgoing;
  {
    std::lock_guard lock(*mu_);
    for (auto& [id, peer] : peers_) {
      if (!peer->dead) outgoing.emplace_back(id, peer);
    }
  }
  std::vector<pollfd> fds;
  fds.push_back({wake_fd_.get(), POLLIN, 0});
  fds.push_back({listener_.fd(), POLLIN, 0});
  for (Incoming& in : incoming_) fds.push_back({in.socket.fd(), POLLIN, 0});
  for (auto& out : outgoing) fds.push_back({out.second->socket.fd(), POLLIN, 0});
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(wait);
  timespec timeout{};
  timeout.tv_sec = seconds.count();
  timeout.tv_nsec = (wait - seconds).count();
  ppoll(fds.data(), fds.size(), &timeout, nullptr);

  uint64_t drained;
  bool woken = false;
  while (read(wake_fd_.get(), &drained, sizeof(drained)) > 0) woken = true;
  const size_t polled_in = incoming_.size();
  for (size_t i = 0; i < outgoing.size(); ++i) {
    if (fds[2 + polled_in + i].revents != 0) CheckOutgoing(outgoing[i].first);
  }
  ReadNotifications(fds);
  while (true) {
    auto accepted = listener_.Accept();
    if (!accepted.ok() || !accepted->valid()) break;
    incoming_.push_back(Incoming{std::move(accepted).value(), {}});
  }
  return woken;
}

// Delivers every complete notification; drops connections that closed. Backwards, so erasing
// keeps the pollfd indices of the entries still to visit.
void SameHostChannel::ReadNotifications(const std::vector<pollfd>& fds) {
  NotificationHandler handler;
  {
    std::lock_guard lock(*mu_);
    handler = handler_;
  }
  for (size_t i = incoming_.size(); i-- > 0;) {
    if (fds[2 + i].revents == 0) continue;
    Incoming& in = incoming_[i];
    Status read = in.reader.ReadAvailable(in.socket.fd());
    while (auto frame = in.reader.Next()) {
      if (handler) handler(*frame);
    }
    if (!read.ok()) incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void SameHostChannel::CheckOutgoing(PeerId peer) {
  std::shared_ptr<Peer> out;
  {
    std::lock_guard lock(*mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    out = it->second;
  }
  char byte[256];
  ssize_t n = recv(out->socket.fd(), byte, sizeof(byte), MSG_DONTWAIT);
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) return;
  Drop(peer, /*forget=*/false);
}

}  // namespace kv::transport
