// The "cuda_ipc" backend: moves plan runs between GPUs of one host, straight into (put) or out of
// (get) the peer's memory over NVLink / PCIe peer-to-peer, with no staging.
//
// register_memory() exports CUDA device memory as a cudaIpcMemHandle of its allocation plus the
// offset of `base` inside it (ipc_memory.h); memory this process opened from another one (kvd
// registering an engine's region) is exported under its owner's handle, so a peer opens the
// engine's allocation directly. A VMM allocation's POSIX fd cannot ride in the descriptor: the
// backend serves it from an FdServer (fd_share.h) at "<socket>.fd" under a token the descriptor
// names, and the importer fetches it over that socket (SCM_RIGHTS). import_remote() opens a peer's
// allocation through the process-wide cache of ipc_memory.h and keeps it open while any
// RemoteMemory of it lives. post() enqueues the whole batch on one of the backend's streams
// (round-robin, so consecutive batches overlap on the device) through the kernels' chooser (one
// plan-copy launch, or the copy engine for large runs) and returns; the progress thread learns
// completion from a CUDA event (no host synchronisation on the caller's path). Batches may complete
// out of order; a notification still waits for every batch posted to its peer before it.
//
// Also implements DeviceOrdered (device_ordered.h): a batch's copies can wait on a CUDA event,
// e.g. an engine's per-layer event opened with ImportEvent(). The posting thread launches such a
// batch once it saw the event fire (poster.h), so a batch of an engine that died mid-layer fails
// at its deadline having written nothing, and holds up no other batch.
//
// Side channel: address() is "<host id>|unix:<path>" of a unix socket the backend listens on.
// It carries notifications (sent by the progress thread once every earlier batch to that peer has
// completed on the device, so the bytes are in place when the peer sees the message) and
// liveness: a peer whose socket closes is dead, its batches fail with kUnavailable and later
// posts to it are refused with kUnavailable.
//
// Settings (TransportOptions): "device" (CUDA ordinal of the copy stream; default the current
// device), "socket_dir" (default /tmp), "connect_timeout_ms" (default 5000), "copy_path"
// (auto|kernel|engine: override the kernels' chooser; default auto).
#pragma once

#include <memory>
#include <span>

#include "transport/transport.h"

namespace kv::transport {

// kUnsupported when no CUDA device is visible.
Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const TransportOptions& options);
// The settings above, documented.
std::span<const SettingInfo> CudaIpcSettings();

}  // namespace kv::transport
