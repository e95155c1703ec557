// Sharing CUDA events between processes on one host, so kvd can start a layer's transfer exactly
// when the engine's per-layer event fires, with no host synchronisation in the engine.
//
// The engine creates each per-layer event once with CreateShareableEvent(), exports it once, and
// records it after every layer's forward as usual; kvd imports it once and queries it from the
// host (layer_events.h, daemon/event_gate.h). StreamWaitEvent (a device-side wait, which kvd does
// not use on an engine's events: one whose engine died never fires) serves the tests.
// Thread-safe: plain functions over CUDA runtime calls.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "gpu/cuda_util.h"

namespace kv::gpu {

// An event that may be exported: interprocess, without timing (CUDA requires both).
Result<CudaEvent> CreateShareableEvent(int device);

// The opaque handle bytes of an event made by CreateShareableEvent(); kInvalidArgument for an
// event created without cudaEventInterprocess.
Result<std::string> ExportEvent(const CudaEvent& event);

// Opens an exported event in this process on `device`; the returned owner closes it. Must be
// called in a different process from the exporter (CUDA refuses the same process).
// kInvalidArgument when `handle` is not exactly one cudaIpcEventHandle_t.
Result<CudaEvent> ImportEvent(std::string_view handle, int device);

// Makes `stream` wait on the device, not the host, for the event's most recent record.
Status StreamWaitEvent(cudaStream_t stream, const CudaEvent& event);

}  // namespace kv::gpu
