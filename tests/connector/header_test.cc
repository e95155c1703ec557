// connector.h is what an engine includes: it must compile without the generated protobuf headers
// on the include path. This target links kv_layout only, so kvd_proto's include directory is not
// on its path: a protobuf include creeping back into the header breaks this build.
#include "connector/connector.h"

#include <gtest/gtest.h>

#include <type_traits>

namespace kv::connector {
namespace {

TEST(ConnectorHeader, PublicTypesAreUsableWithoutProtobuf) {
  TransferParams params;
  EXPECT_EQ(Mode::kPush, params.mode);
  EXPECT_EQ(0, params.tokens);
  ConnectorOptions options;
  EXPECT_EQ(1, options.tp_size);
  EXPECT_FALSE(std::is_copy_constructible_v<Connector>);
  EXPECT_FALSE(std::is_copy_constructible_v<OffloadOp>);
}

}  // namespace
}  // namespace kv::connector
