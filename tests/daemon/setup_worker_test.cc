// The setup worker (daemon/setup_worker.h) on its own, and kvd with a peer whose handshake
// stalls: the transport's connect to that peer blocks for seconds, and another engine's
// SaveLayer -> layer-ready goes on meanwhile (before the worker, kvd's io thread made that
// connect and every engine and peer waited for it).
#include "daemon/setup_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "tests/support/forwarding_transport.h"

namespace kv {
namespace {

using daemon::SetupWorker;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// An io thread for the worker's completions.
class IoThread {
 public:
  IoThread() : guard_(io_.get_executor()), thread_([this] { io_.run(); }) {}
  ~IoThread() { Stop(); }
  void Stop() {
    guard_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  boost::asio::io_context& io() { return io_; }
  bool on_io_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

TEST(SetupWorker, RunsOffTheIoThreadAndHandsTheResultToIt) {
  IoThread io;
  SetupWorker worker(io.io(), 1, 4);
  std::promise<std::pair<int, bool>> got;
  std::atomic<bool> work_on_io{true};
  ASSERT_TRUE(worker
                  .Submit<int>(
                      Clock::now() + std::chrono::seconds(5),
                      [&]() -> Result<int> {
                        work_on_io = io.on_io_thread();
                        return 42;
                      },
                      [&](Result<int> r) {
                        got.set_value({r.ok() ? *r : -1, io.on_io_thread()});
                      })
                  .ok());
  auto future = got.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  const auto [value, done_on_io] = future.get();
  EXPECT_EQ(value, 42);
  EXPECT_TRUE(done_on_io);
  EXPECT_FALSE(work_on_io.load());
}

TEST(SetupWorker, AJobPastItsDeadlineDoesNotRunAndTimesOut) {
  IoThread io;
  SetupWorker worker(io.io(), 1, 4);
  std::atomic<bool> ran{false};
  std::promise<Code> got;
  ASSERT_TRUE(worker
                  .Submit<int>(
                      Clock::now() - milliseconds(1),
                      [&]() -> Result<int> {
                        ran = true;
                        return 1;
                      },
                      [&](Result<int> r) { got.set_value(r.status().code()); })
                  .ok());
  auto future = got.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(future.get(), Code::kTimeout);
  EXPECT_FALSE(ran.load());
}

TEST(SetupWorker, BoundedQueueAndShutdownDestroysUndeliveredResults) {
  IoThread io;
  io.Stop();  // nothing is ever delivered: Shutdown must destroy the results itself
  auto worker = std::make_unique<SetupWorker>(io.io(), 1, 2);
  auto tracked = std::make_shared<int>(7);
  std::weak_ptr<int> watch = tracked;
  std::atomic<int> ran{0};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(worker
                    ->Submit<std::shared_ptr<int>>(
                        Clock::now() + std::chrono::seconds(5),
                        [&ran, tracked]() -> Result<std::shared_ptr<int>> {
                          ++ran;
                          return tracked;
                        },
                        [](Result<std::shared_ptr<int>>) { ADD_FAILURE() << "delivered"; })
                    .ok());
  }
  const Status third = worker->Submit<int>(
      Clock::now() + std::chrono::seconds(5), [] { return Result<int>(1); }, [](Result<int>) {});
  EXPECT_EQ(third.code(), Code::kResourceExhausted);
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (ran.load() < 2 && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(ran.load(), 2);
  tracked.reset();
  EXPECT_FALSE(watch.expired());  // the two finished results hold it
  worker->Shutdown();
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(worker
                ->Submit<int>(
                    Clock::now() + std::chrono::seconds(5), [] { return Result<int>(1); },
                    [](Result<int>) {})
                .code(),
            Code::kUnavailable);
}

// Forwards to a real backend; once armed, the next connect_endpoint blocks until released (at
// most 10 s), as a UCX connect to a peer that does not answer.
class StallingTransport final : public testing::ForwardingTransport {
 public:
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool armed = false;
    bool stalled = false;  // a connect is blocked now
    bool released = false;
  };
  StallingTransport(std::unique_ptr<transport::Transport> inner, std::shared_ptr<Gate> gate)
      : ForwardingTransport(std::move(inner)), gate_(std::move(gate)) {}
  Result<transport::PeerId> connect_endpoint(std::string_view peer_address,
                                             uint64_t endpoint) override {
    std::unique_lock lock(gate_->mu);
    if (gate_->armed) {
      gate_->armed = false;
      gate_->stalled = true;
      gate_->cv.notify_all();
      gate_->cv.wait_for(lock, std::chrono::seconds(10), [this] { return gate_->released; });
      gate_->stalled = false;
    }
    lock.unlock();
    return inner().connect_endpoint(peer_address, endpoint);
  }

 private:
  std::shared_ptr<Gate> gate_;
};

std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name,
                                            std::shared_ptr<StallingTransport::Gate> gate) {
  daemon::DaemonOptions options;
  options.name = name;
  if (gate) {
    auto local = transport::CreateTransport("local");
    EXPECT_TRUE(local.ok()) << local.status().ToString();
    if (!local.ok()) return nullptr;
    options.transport = std::make_unique<StallingTransport>(std::move(local).value(), gate);
  } else {
    options.transport_name = "local";
  }
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

TEST(StalledHandshake, DoesNotDelayAnotherEnginesLayerReady) {
  constexpr auto kTimeout = milliseconds(5000);
  auto gate = std::make_shared<StallingTransport::Gate>();
  auto decode = StartDaemon("d", gate);
  auto prefill = StartDaemon("p", nullptr);
  auto stalled = StartDaemon("s", nullptr);  // the peer whose handshake stalls
  ASSERT_TRUE(decode && prefill && stalled);
  auto source = connector::Connector::OpenEmbedded(prefill, {"prefill", 0, 1, kTimeout});
  auto sink = connector::Connector::OpenEmbedded(decode, {"decode", 0, 1, kTimeout});
  ASSERT_TRUE(source.ok() && sink.ok());
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  ASSERT_TRUE((*source)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  ASSERT_TRUE((*sink)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  const std::vector<int64_t> block = {1};
  connector::TransferParams from_prefill;
  from_prefill.peer_address = prefill->listen_address();
  from_prefill.tokens = 16;

  // The prefill peer is connected first (a whole request), so what follows measures kvd's io
  // thread, not the worker's threads.
  ASSERT_TRUE((*sink)->StartLoad("warm", from_prefill, block).ok());
  for (int l = 0; l < spec.layers; ++l) ASSERT_TRUE((*source)->SaveLayer("warm", l, block).ok());
  for (int l = 0; l < spec.layers; ++l) ASSERT_TRUE((*sink)->WaitLayer("warm", l).ok());

  // A load from the other peer: the decode kvd dials it, and its transport connect stalls until
  // released, at the latest when this test ends (a failed assertion included).
  struct Release {
    StallingTransport::Gate* gate;
    ~Release() {
      {
        std::lock_guard lock(gate->mu);
        gate->released = true;
      }
      gate->cv.notify_all();
    }
  } release{gate.get()};
  {
    std::lock_guard lock(gate->mu);
    gate->armed = true;
  }
  connector::TransferParams from_stalled = from_prefill;
  from_stalled.peer_address = stalled->listen_address();
  const std::vector<int64_t> other = {2};
  ASSERT_TRUE((*sink)->StartLoad("stuck", from_stalled, other).ok());
  {
    std::unique_lock lock(gate->mu);
    ASSERT_TRUE(gate->cv.wait_for(lock, std::chrono::seconds(5), [&] { return gate->stalled; }));
  }

  const auto start = Clock::now();
  ASSERT_TRUE((*sink)->StartLoad("r", from_prefill, block).ok());
  ASSERT_TRUE((*source)->SaveLayer("r", 0, block).ok());
  ASSERT_TRUE((*sink)->WaitLayer("r", 0).ok());
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  bool still_stalled = false;
  {
    std::lock_guard lock(gate->mu);
    still_stalled = gate->stalled;
  }
  EXPECT_LT(took.count(), 500) << "layer-ready took " << took.count() << " ms";
  EXPECT_TRUE(still_stalled) << "the stalled handshake ended before the layer was ready";
  ASSERT_TRUE((*source)->SaveLayer("r", 1, block).ok());
  EXPECT_TRUE((*sink)->WaitLayer("r", 1).ok());
}

}  // namespace
}  // namespace kv
