// kvbench: benchmarks of every layer of kvd, each printed beside its ceiling, and the P/D demo.
#include <cstdlib>

#include "tools/common/cli.h"

int main(int argc, char** argv) {
  // Before anything can start NCCL, which reads these from the environment only: NVLink
  // multicast is not allowed on shared machines, and point-to-point never needs it; the nccl
  // backend's lanes set splitShare themselves (blocking_launch shares the split lanes'
  // connections). The kvds kvbench starts do the same themselves.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  ::unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  return kv::cli::Dispatch("kvbench", "kvbench — kvd benchmarks and the P/D demo", argc, argv);
}
