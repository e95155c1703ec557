// CUDA IPC events: an event exported by one process (the engine) orders work that another
// process (kvd) enqueues on its own stream, without any host synchronisation between them.
//
// The exporter holds its stream on a host callback that waits for the test's "release", then
// records the shared event. Until the release, the importer must see the event pending and its
// dependent work not done; after it, the dependent work must complete. No timing is asserted:
// every wait is a bounded poll for a state.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/support/gpu_peers.h"
#include "gpu/ipc_event.h"
#include "gpu/layer_events.h"

namespace kv::transport::gputest {

using harness::Channel;
using harness::ChildProcess;
namespace {

using namespace std::chrono_literals;
using gpu::CudaEvent;
using gpu::CudaStream;

void CUDART_CB Hold(void* flag) {
  auto* released = static_cast<std::atomic<bool>*>(flag);
  const auto until = Clock::now() + 60s;
  while (!released->load() && Clock::now() < until) std::this_thread::sleep_for(1ms);
}

int ExporterMain(Channel& channel) {
  std::atomic<bool> released{false};
  auto stream = CudaStream::Create(0);
  auto event = gpu::CreateShareableEvent(0);
  if (!stream.ok() || !event.ok()) return 2;
  auto handle = gpu::ExportEvent(*event);
  if (!handle.ok()) return 3;
  // A timing-enabled event cannot be shared: the contract's error, not a crash.
  auto plain = CudaEvent::Create(0);
  cudaEvent_t timed = nullptr;
  cudaEventCreate(&timed);
  auto refused = gpu::ExportEvent(CudaEvent::Adopt(timed, 0));
  if (refused.ok() || !plain.ok()) return 4;

  if (cudaLaunchHostFunc(stream->get(), &Hold, &released) != cudaSuccess) return 5;
  if (!event->Record(stream->get()).ok()) return 5;
  if (!channel.Send(*handle).ok()) return 6;
  auto go = channel.Receive(Clock::now() + 60s);
  if (!go.ok() || *go != "release") return 7;
  released = true;
  cudaStreamSynchronize(stream->get());
  auto bye = channel.Receive(Clock::now() + 60s);
  return bye.ok() ? 0 : 8;
}

int ImporterMain(Channel& channel, int device) {
  auto handle = channel.Receive(Clock::now() + 60s);
  if (!handle.ok()) return 2;
  if (gpu::ImportEvent("short", device).status().code() != Code::kInvalidArgument) return 3;
  auto engine_event = gpu::ImportEvent(*handle, device);
  if (!engine_event.ok()) {
    (void)channel.Send("import failed: " + engine_event.status().ToString());
    return 4;
  }
  auto stream = CudaStream::Create(device);
  auto mine = CudaEvent::Create(device);
  void* scratch = nullptr;
  if (!stream.ok() || !mine.ok() || cudaMalloc(&scratch, 1 << 20) != cudaSuccess) return 5;
  if (!gpu::StreamWaitEvent(stream->get(), *engine_event).ok()) return 6;
  cudaMemsetAsync(scratch, 1, 1 << 20, stream->get());
  if (!mine->Record(stream->get()).ok()) return 6;

  auto engine_done = engine_event->Query();
  auto mine_done = mine->Query();
  const bool held = engine_done.ok() && !*engine_done && mine_done.ok() && !*mine_done;
  if (!channel.Send(held ? "held" : "not held").ok()) return 7;

  const auto until = Clock::now() + 60s;
  while (Clock::now() < until) {
    auto done = mine->Query();
    if (!done.ok()) break;
    if (*done) return channel.Send("ran").ok() ? 0 : 7;
    std::this_thread::sleep_for(1ms);
  }
  (void)channel.Send("never ran");
  return 8;
}

TEST(IpcEventTest, ImportedEventOrdersAnotherProcesssStream) {
  const int devices = DeviceCount();
  if (devices < 1) GTEST_SKIP() << "needs a CUDA device";
  const int importer_device = devices >= 2 ? 1 : 0;  // across GPUs where there are two
  auto exporter = ChildProcess::Start(&ExporterMain);
  auto importer = ChildProcess::Start(
      [importer_device](Channel& c) { return ImporterMain(c, importer_device); });
  ASSERT_TRUE(exporter.ok() && importer.ok());
  auto handle = (*exporter)->channel().Receive(Clock::now() + 60s);
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  ASSERT_TRUE((*importer)->channel().Send(*handle).ok());

  auto before = (*importer)->channel().Receive(Clock::now() + 60s);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ("held", *before);
  ASSERT_TRUE((*exporter)->channel().Send("release").ok());
  auto after = (*importer)->channel().Receive(Clock::now() + 90s);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ("ran", *after);
  ASSERT_TRUE((*exporter)->channel().Send("bye").ok());
  auto exporter_code = (*exporter)->Wait(Clock::now() + 60s);
  auto importer_code = (*importer)->Wait(Clock::now() + 60s);
  ASSERT_TRUE(exporter_code.ok() && importer_code.ok());
  EXPECT_EQ(0, *exporter_code);
  EXPECT_EQ(0, *importer_code);
}

// A save on a stream that has run everything needs no event (and gets no record, which another
// process's busy GPU could hold off); a save behind pending work records it.
TEST(LayerEventsTest, RecordsOnlyBehindPendingWork) {
  if (DeviceCount() < 1) GTEST_SKIP() << "needs a CUDA device";
  auto events = gpu::LayerEvents::Create(0, 2);
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(events.ok() && stream.ok());
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream->get()));
  auto idle = (*events)->RecordIfPending(1, stream->get());
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  EXPECT_FALSE(*idle);

  // Static: a failed assertion below leaves the held host function running past this frame.
  static std::atomic<bool> released;
  released = false;
  ASSERT_EQ(cudaSuccess, cudaLaunchHostFunc(stream->get(), &Hold, &released));
  auto busy = (*events)->RecordIfPending(1, stream->get());
  released = true;
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  EXPECT_TRUE(*busy);
  EXPECT_EQ(Code::kOutOfRange, (*events)->RecordIfPending(2, stream->get()).status().code());
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream->get()));
}

}  // namespace
}  // namespace kv::transport::gputest
