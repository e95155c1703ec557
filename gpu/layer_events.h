// Per-layer CUDA events an engine shares with kvd, so that kvd's copy of a saved layer waits for
// the engine's writes of that layer, with no host synchronisation in the engine.
//
// The engine creates one interprocess event per layer (LayerEvents), sends their handles to kvd
// once, and records a layer's event on its compute stream just before it tells kvd the layer is
// saved. kvd imports them once (ImportedLayerEvents) and holds the layer's copy in its event gate
// (daemon/event_gate.h) until Fired(layer) says the record completed, seen from the host (at its
// last poll: a record made later, the next request's forward, only delays it). Nothing of kvd
// waits for these events on the device: one whose engine died before its stream reached the
// record never fires.
//
// The header is free of CUDA types (streams and events are void*), so the connector and kvd's
// control plane use it in every build; without CUDA both Create and Import return kUnsupported.
// Thread-safety: Record() may be called from several threads for distinct layers; the rest is
// immutable after creation.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace kv::gpu {

// The engine's side: owns the events.
class LayerEvents {
 public:
  // `layers` events on CUDA device `device`. kInvalidArgument for layers < 1; kUnsupported
  // without CUDA; the CUDA error otherwise.
  static Result<std::unique_ptr<LayerEvents>> Create(int device, int layers);
  ~LayerEvents();
  LayerEvents(const LayerEvents&) = delete;
  LayerEvents& operator=(const LayerEvents&) = delete;

  int layers() const { return static_cast<int>(handles_.size()); }
  // The exported handle bytes of each layer's event, in layer order.
  const std::vector<std::string>& handles() const { return handles_; }
  // Records `layer`'s event on `stream` (a cudaStream_t of the events' device; nullptr is the
  // legacy default stream). kOutOfRange for a layer outside [0, layers()).
  Status Record(int layer, void* stream) const;
  // Records `layer`'s event on `stream` only if work queued there has not completed yet, and
  // says whether it did: false means everything the stream was given has run, so a copy needs no
  // wait at all (a record is not free: made while kvd's copies keep the GPU busy, it completes
  // only behind them). kOutOfRange as Record; the CUDA error of a failed stream.
  Result<bool> RecordIfPending(int layer, void* stream) const;

 private:
  struct Impl;
  LayerEvents(std::unique_ptr<Impl> impl, std::vector<std::string> handles);
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> handles_;
};

// kvd's side: the engine's events opened in this process.
class ImportedLayerEvents {
 public:
  // Opens each handle in device `device`'s context. kInvalidArgument for a handle of the wrong
  // size (naming the layer); kUnsupported without CUDA; the CUDA error otherwise (a handle of
  // this process, or of an exporter that is gone).
  static Result<std::unique_ptr<ImportedLayerEvents>> Import(std::span<const std::string> handles,
                                                             int device);
  ~ImportedLayerEvents();
  ImportedLayerEvents(const ImportedLayerEvents&) = delete;
  ImportedLayerEvents& operator=(const ImportedLayerEvents&) = delete;

  int layers() const { return layers_; }
  // Whether `layer`'s last record has completed (a copy after it needs no wait); the CUDA error
  // when the recorded work failed.
  Result<bool> Fired(int layer) const;

 private:
  struct Impl;
  ImportedLayerEvents(std::unique_ptr<Impl> impl, int layers);
  std::unique_ptr<Impl> impl_;
  int layers_;
};

}  // namespace kv::gpu
