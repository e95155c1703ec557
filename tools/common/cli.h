// Command-line parsing shared by kvctl and kvbench, and a registry of their subcommands.
//
// Flags are "--name value" or "--name=value"; a flag declared as a switch takes no value.
// Unknown flags and missing values are errors that name the flag. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kv::cli {

struct FlagSpec {
  std::string name;  // without "--"
  std::string help;
  bool is_switch = false;  // takes no value: present or absent
  bool repeated = false;   // may be given more than once; all() has every value, str() the last
};

class Flags {
 public:
  Flags(std::initializer_list<FlagSpec> spec);

  Status Parse(int argc, char** argv);  // argv[0] is the subcommand name

  // The shared start of a subcommand. On --help prints `usage` then the flag list to stdout and
  // returns 0; on a bad flag prints one line "<command>: <error> (see --help)" to stderr and
  // returns 2; otherwise returns nullopt and the command goes on.
  std::optional<int> ParseOrExit(const char* command, const char* usage, int argc, char** argv);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& fallback = "") const;
  // kInvalidArgument naming the flag when the value is not an integer in [min, max].
  Result<int64_t> integer(const std::string& name, int64_t fallback, int64_t min = INT64_MIN,
                          int64_t max = INT64_MAX) const;
  // "5,9,2" -> {5, 9, 2}; also accepts ranges "0-15".
  Result<std::vector<int64_t>> int_list(const std::string& name) const;
  // Accepts "4096", "64K", "4M", "1G" (powers of 1024).
  Result<uint64_t> bytes(const std::string& name, uint64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // Every value of a repeated flag, in the order given; empty when absent.
  std::vector<std::string> all(const std::string& name) const;
  // Every value of a repeated flag as KEY=VALUE pairs ("--transport-opt UCX_TLS=tcp"), in order;
  // kInvalidArgument naming the flag for a value without '=' or with an empty key.
  Result<std::vector<std::pair<std::string, std::string>>> key_values(
      const std::string& name) const;

  std::string Help() const;  // one line per flag, aligned

 private:
  std::vector<FlagSpec> spec_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;
  std::vector<std::string> positional_;
};

// Prints "<command>: <status>" as one line on stderr; returns the exit code for bad input, 2.
int Fail(const char* command, const Status& status);

// A subcommand: `run` gets argv with argv[0] the subcommand name and returns the exit code.
struct Command {
  std::string name;
  std::string summary;
  std::function<int(int argc, char** argv)> run;
};

// Subcommands register themselves from their own file at static-initialisation time:
//   static const bool registered = kv::cli::Register({"plan", "...", &PlanMain});
bool Register(Command command);
// Dispatches argv[1] to its command; prints the list of commands for --help or an unknown name.
int Dispatch(const char* program, const char* blurb, int argc, char** argv);

}  // namespace kv::cli
