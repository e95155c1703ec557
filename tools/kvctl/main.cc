// kvctl: inspect layouts and plans, and administer a running kvd.
#include <cstring>
#include <vector>

#include "tools/common/cli.h"

int main(int argc, char** argv) {
  // `kvctl --daemon PATH status`: the daemon flag may precede the subcommand; it is handed to
  // the subcommand as its own flag.
  std::vector<char*> args(argv, argv + argc);
  if (argc >= 3 && std::strcmp(argv[1], "--daemon") == 0) {
    args = {argv[0]};
    args.insert(args.end(), argv + 3, argv + argc);
    if (args.size() > 1) {
      args.insert(args.begin() + 2, {argv[1], argv[2]});
    } else {
      args.insert(args.end(), {argv[1], argv[2]});
    }
    argc = static_cast<int>(args.size());
    argv = args.data();
  }
  return kv::cli::Dispatch("kvctl", "kvctl — plan and inspect KV transfers, administer kvd", argc,
                           argv);
}
