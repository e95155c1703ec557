// Runs a tool's subcommand in-process through cli::Dispatch (the dispatcher the tool's main
// uses) and captures what it prints, for end-to-end tests of kvctl and kvbench subcommands.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/common/cli.h"

namespace kv::testing {

struct CliOutcome {
  int exit_code;
  std::string out, err;
};

// `tool` is "kvctl" or "kvbench"; args exclude the program name.
inline CliOutcome RunCli(const std::string& tool, std::vector<std::string> args) {
  args.insert(args.begin(), tool);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  int code = cli::Dispatch(tool.c_str(), tool.c_str(), static_cast<int>(argv.size()), argv.data());
  std::string out = ::testing::internal::GetCapturedStdout();
  std::string err = ::testing::internal::GetCapturedStderr();
  return {code, out, err};
}

}  // namespace kv::testing
