// kvbench: benchmarks of every layer of kvd, each printed beside its ceiling, and the P/D demo.
#include <cstdlib>

#include "tools/common/cli.h"

int main(int argc, char** argv) {
  // Before anything can start NCCL, which reads it from the environment only: NVLink multicast
  // is not allowed on shared machines, and point-to-point never needs it. The kvds kvbench starts
  // set it themselves.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  return kv::cli::Dispatch("kvbench", "kvbench — kvd benchmarks and the P/D demo", argc, argv);
}
