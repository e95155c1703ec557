// The table of backends compiled into this build, consulted by CreateTransport().
//
// Each backend folder exposes one factory function; factory.cc lists them in order of
// preference. Adding a backend (nccl, cuda_ipc) is one line there plus its folder: callers never
// test for a backend at compile time.
#pragma once

#include <memory>
#include <span>

#include "transport/transport.h"

namespace kv::transport {

using BackendFactory = Result<std::unique_ptr<Transport>> (*)(const TransportOptions& options);

struct Backend {
  const char* name;
  BackendFactory create;
  Capabilities capabilities;
  std::span<const SettingInfo> settings;  // documented next to where the backend parses them
};

// Every backend of this build, most preferred first. Static storage; thread-safe.
std::span<const Backend> CompiledBackends();

}  // namespace kv::transport
