#include "tools/common/cli.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace kv::cli {

Flags::Flags(std::initializer_list<FlagSpec> spec) : spec_(spec) {}

Status Flags::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it =
        std::find_if(spec_.begin(), spec_.end(), [&](const FlagSpec& f) { return f.name == name; });
    if (it == spec_.end()) return Status::InvalidArgument("unknown flag --" + name);
    if (it->is_switch) {
      if (has_value) return Status::InvalidArgument("--" + name + " takes no value");
      values_[name] = "1";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return Status::InvalidArgument("--" + name + " needs a value");
      value = argv[++i];
    }
    values_[name] = value;
    if (it->repeated) repeated_[name].push_back(value);
  }
  return Status::Ok();
}

std::vector<std::string> Flags::all(const std::string& name) const {
  auto it = repeated_.find(name);
  return it == repeated_.end() ? std::vector<std::string>() : it->second;
}

Result<std::vector<std::pair<std::string, std::string>>> Flags::key_values(
    const std::string& name) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& item : all(name)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::InvalidArgument("--" + name + ": '" + item + "' is not KEY=VALUE");
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

std::optional<int> Flags::ParseOrExit(const char* command, const char* usage, int argc,
                                      char** argv) {
  Status parsed = Parse(argc, argv);
  if (has("help")) {
    std::printf("%s%s", usage, Help().c_str());
    return 0;
  }
  if (!parsed.ok()) return Fail(command, Status(parsed.code(), parsed.message() + " (see --help)"));
  return std::nullopt;
}

int Fail(const char* command, const Status& status) {
  std::fprintf(stderr, "%s: %s\n", command, status.ToString().c_str());
  return 2;
}

std::string Flags::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

static Result<int64_t> ParseInt(const std::string& flag, std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty())
    return Status::InvalidArgument("--" + flag + ": '" + std::string(s) + "' is not an integer");
  return v;
}

Result<int64_t> Flags::integer(const std::string& name, int64_t fallback, int64_t min,
                               int64_t max) const {
  if (!has(name)) return fallback;
  KV_ASSIGN_OR_RETURN(int64_t v, ParseInt(name, str(name)));
  if (v < min || v > max)
    return Status::InvalidArgument("--" + name + " " + std::to_string(v) + " is outside [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]");
  return v;
}

Result<std::vector<int64_t>> Flags::int_list(const std::string& name) const {
  std::vector<int64_t> out;
  std::string s = str(name);
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t dash = item.find('-', 1);
    if (dash != std::string::npos) {
      KV_ASSIGN_OR_RETURN(int64_t lo, ParseInt(name, item.substr(0, dash)));
      KV_ASSIGN_OR_RETURN(int64_t hi, ParseInt(name, item.substr(dash + 1)));
      if (hi < lo || hi - lo > (1 << 24))
        return Status::InvalidArgument("--" + name + ": bad range '" + item + "'");
      for (int64_t v = lo; v <= hi; ++v) out.push_back(v);
    } else {
      KV_ASSIGN_OR_RETURN(int64_t v, ParseInt(name, item));
      out.push_back(v);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Result<uint64_t> Flags::bytes(const std::string& name, uint64_t fallback) const {
  if (!has(name)) return fallback;
  std::string s = str(name);
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        break;
      default:
        break;
    }
    if (mult != 1) s.pop_back();
  }
  KV_ASSIGN_OR_RETURN(int64_t v, ParseInt(name, s));
  if (v < 0) return Status::InvalidArgument("--" + name + " must not be negative");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(v), mult, &bytes))
    return Status::InvalidArgument("--" + name + " " + str(name) + " does not fit in 64 bits");
  return bytes;
}

std::string Flags::Help() const {
  size_t width = 0;
  for (const auto& f : spec_) width = std::max(width, f.name.size());
  std::string out;
  for (const auto& f : spec_) {
    out += "  --" + f.name + std::string(width + 2 - f.name.size(), ' ') + f.help + "\n";
  }
  return out;
}

static std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}

bool Register(Command command) {
  Commands().push_back(std::move(command));
  return true;
}

int Dispatch(const char* program, const char* blurb, int argc, char** argv) {
  auto& commands = Commands();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::string first = argc > 1 ? argv[1] : "";
  for (const auto& c : commands) {
    if (c.name == first) return c.run(argc - 1, argv + 1);
  }
  FILE* out = (first == "--help" || first == "-h" || first == "help") ? stdout : stderr;
  if (!first.empty() && out == stderr)
    std::fprintf(stderr, "%s: unknown command '%s'\n\n", program, first.c_str());
  std::fprintf(out,
               "%s\n\nusage: %s COMMAND [flags]   (%s COMMAND --help for its flags)\n\ncommands:\n",
               blurb, program, program);
  for (const auto& c : commands)
    std::fprintf(out, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  return out == stdout ? 0 : 2;
}

}  // namespace kv::cli
