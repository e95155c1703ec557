// kvbench: benchmarks of every layer of kvd, each printed beside its ceiling, and the P/D demo.
#include "tools/common/cli.h"

int main(int argc, char** argv) {
  return kv::cli::Dispatch("kvbench", "kvbench — kvd benchmarks and the P/D demo", argc, argv);
}
