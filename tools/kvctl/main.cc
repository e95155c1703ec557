// kvctl: inspect layouts and plans, and administer a running kvd.
#include "tools/common/cli.h"

int main(int argc, char** argv) {
  return kv::cli::Dispatch("kvctl", "kvctl — plan and inspect KV transfers, administer kvd", argc,
                           argv);
}
