// The smallest P/D run the daemon tests use to show two kvds still serve each other (after a
// refused peer, a tampered frame, a secret): 4 requests of 40 tokens, 2 layers of 2 heads.
#pragma once

#include <chrono>

#include "tools/kvbench/pd/pd_sim.h"

namespace kv::testing_support {

inline connector::PdConfig TinyPd() {
  connector::PdConfig c;
  c.requests = 4;
  c.window = 2;
  c.tokens = 40;
  c.layers = 2;
  c.heads = 2;
  c.head_dim = 16;
  c.timeout = std::chrono::milliseconds(10000);
  return c;
}

}  // namespace kv::testing_support
