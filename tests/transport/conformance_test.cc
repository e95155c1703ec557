// The transport conformance suite (conformance_suite.h) over the backends that run without a GPU:
// local (two transports of this process), ucx over tcp and over shared memory, and the staged
// decorator staging host memory (two processes on loopback each).
#include "tests/support/conformance_suite.h"

namespace kv::transport::conformance {
namespace {

INSTANTIATE_TEST_SUITE_P(Host, TransportConformance, ::testing::ValuesIn(HostBackends()),
                         BackendName);

}  // namespace
}  // namespace kv::transport::conformance
