// kvctl: inspect layouts and plans, and administer a running kvd.
#include <algorithm>
#include <cstring>

#include "tools/common/cli.h"

int main(int argc, char** argv) {
  // `kvctl --daemon PATH status`: the daemon flag may precede the subcommand; it is handed to
  // the subcommand as its own flag by moving the subcommand in front of it.
  if (argc >= 4 && std::strcmp(argv[1], "--daemon") == 0) std::rotate(argv + 1, argv + 3, argv + 4);
  return kv::cli::Dispatch("kvctl", "kvctl — plan and inspect KV transfers, administer kvd", argc,
                           argv);
}
