// The transport conformance suite: what every backend must do through the plain Transport
// interface (transport.h), checked the same way for each. Cases (conformance_suite.cc):
//
//   put    lands exactly the bytes of its runs, and nothing outside them on either side;
//   get    likewise, the other way;
//   notify a notification is delivered only after the data of every batch posted before it,
//          though it was sent before any of them completed, and in the order it was sent;
//   range  a batch with one run outside either registration (or wrapping around) is refused by
//          post() with kOutOfRange, its completion never runs and none of its runs is written;
//   dead   a killed peer (or a closed endpoint) fails the batches still pending and every later
//          one within a bounded time, with kUnavailable or kTimeout; nothing hangs.
//
// A binary instantiates the suite with its backends:
//   INSTANTIATE_TEST_SUITE_P(Host, TransportConformance, ::testing::ValuesIn(HostBackends()),
//                            BackendName);
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "tests/support/conformance_backends.h"
#include "tests/support/conformance_side.h"

namespace kv::transport::conformance {

class TransportConformance : public ::testing::TestWithParam<Backend> {
 protected:
  // A backend that takes a "socket_dir" (its side-channel sockets) gets a directory of this
  // test's, removed by TearDown: a side killed with SIGKILL cannot unlink its sockets, and they
  // would pile up in /tmp.
  void SetUp() override;
  void TearDown() override;
  // Starts both sides with regions of the given sizes and seeds (negative: kUntouched bytes) and
  // connects the initiator to the target.
  void StartPair(uint64_t initiator_bytes, int initiator_seed, uint64_t target_bytes,
                 int target_seed);

  std::unique_ptr<Side> initiator;
  std::unique_ptr<Side> target;

 private:
  Backend backend_;  // GetParam(), with the socket_dir of this test where it takes one
  std::filesystem::path socket_dir_;
};

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name;
}

}  // namespace kv::transport::conformance
