// The ceiling of `kvbench transport`: UCX's own ucx_perftest, run as a server and a client
// process on loopback with the same message size and count.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kv::bench {

struct PerftestFigure {
  double gbps = 0;              // overall bandwidth, 10^9 bytes per second
  double usec_per_message = 0;  // overall time per message
};

// Runs `ucx_perftest -t ucp_put_bw -s size -n iters` against a server it starts on a free
// loopback port; `env` is added to both processes' environment (e.g. UCX_TLS). Both processes
// are killed and reaped on every path; kTimeout after `timeout_s`; kNotFound when ucx_perftest
// is not installed (package ucx-utils).
Result<PerftestFigure> RunUcxPerftest(uint64_t size, uint64_t iters,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      int timeout_s);

}  // namespace kv::bench
