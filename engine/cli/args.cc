// The subcommands' flag parser; see args.h.
#include "engine/cli/args.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <utility>

namespace switchyard::cli {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::AddInt(std::string name, int* value, std::string help, bool required) {
  flags_.push_back({std::move(name), Kind::kInt, value, std::move(help), required});
}

void FlagSet::AddString(std::string name, std::string* value, std::string help, bool required) {
  flags_.push_back({std::move(name), Kind::kString, value, std::move(help), required});
}

void FlagSet::AddPath(std::string name, std::string* value, std::string help, bool required) {
  flags_.push_back({std::move(name), Kind::kPath, value, std::move(help), required});
}

void FlagSet::AddBool(std::string name, bool* value, std::string help) {
  flags_.push_back({std::move(name), Kind::kBool, value, std::move(help), false});
}

FlagSet::Flag* FlagSet::Find(std::string_view name) {
  for (Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

bool FlagSet::IsSet(std::string_view name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return flag.set;
  }
  return false;
}

Status FlagSet::Assign(Flag& flag, const std::string& value) {
  if (flag.kind == Kind::kPath && value.empty()) {
    return InvalidArgument("--", flag.name, " is empty; it needs a path");
  }
  if (flag.kind == Kind::kString || flag.kind == Kind::kPath) {
    *static_cast<std::string*>(flag.value) = value;
    return OkStatus();
  }
  int parsed = 0;
  const char* begin = value.data();
  const char* end = begin + value.size();
  const auto [ptr, error] = std::from_chars(begin, end, parsed);
  if (error == std::errc::result_out_of_range) {
    return InvalidArgument("--", flag.name, " is out of range, got \"", value, "\"");
  }
  if (value.empty() || error != std::errc() || ptr != end) {
    return InvalidArgument("--", flag.name, " expects an integer, got \"", value, "\"");
  }
  *static_cast<int*>(flag.value) = parsed;
  return OkStatus();
}

Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return OkStatus();
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return InvalidArgument("unexpected argument \"", arg, "\"");
    }
    const size_t equals = arg.find('=');
    const std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos
                                                                        : equals - 2);
    Flag* flag = Find(name);
    if (flag == nullptr) {
      // Flags are spelled with hyphens; a config key's underscores are the likely slip.
      std::string hyphens = name;
      std::replace(hyphens.begin(), hyphens.end(), '_', '-');
      if (hyphens != name && Find(hyphens) != nullptr) {
        return InvalidArgument("unknown flag --", name, " (did you mean --", hyphens, "?)");
      }
      return InvalidArgument("unknown flag --", name);
    }
    if (flag->set) {
      return InvalidArgument("--", name,
                             " is given twice; give it once (the last would have "
                             "silently won)");
    }
    flag->set = true;
    if (flag->kind == Kind::kBool) {
      if (equals != std::string::npos) {
        return InvalidArgument("--", name, " takes no value, got \"", arg.substr(equals + 1),
                               "\"");
      }
      *static_cast<bool*>(flag->value) = true;
      continue;
    }
    if (equals != std::string::npos) {
      SY_RETURN_IF_ERROR(Assign(*flag, arg.substr(equals + 1)));
      continue;
    }
    // "--tp" at the end, or followed by another flag, has no value.
    if (i + 1 == args.size() || args[i + 1].compare(0, 2, "--") == 0) {
      return InvalidArgument("--", name, " needs a value");
    }
    SY_RETURN_IF_ERROR(Assign(*flag, args[++i]));
  }
  for (const Flag& flag : flags_) {
    if (flag.required && !flag.set) return InvalidArgument("--", flag.name, " is required");
  }
  return OkStatus();
}

std::string FlagSet::Usage() const {
  std::string synopsis = "usage: " + command_;
  std::string details;
  for (const Flag& flag : flags_) {
    std::string spelled = "--" + flag.name;
    if (flag.kind == Kind::kInt) spelled += " N";
    if (flag.kind == Kind::kString) spelled += " S";
    if (flag.kind == Kind::kPath) spelled += " PATH";
    synopsis += flag.required ? " " + spelled : " [" + spelled + "]";
    details += "  " + spelled;
    details += std::string(spelled.size() < 14 ? 14 - spelled.size() : 1, ' ');
    details += flag.help + "\n";
  }
  return synopsis + "\n\n" + summary_ + "\n\n" + details;
}

Status CheckWorldFlag(std::string_view name, int value) {
  if (value >= 1 && value <= kMaxWorld) return OkStatus();
  return InvalidArgument("--", name, "=", value, " must be between 1 and ", kMaxWorld,
                         value < 1 ? ""
                                   : " (2^17: above the largest training jobs, ~100k GPUs; "
                                     "every rank is walked)");
}

int UsageError(std::string_view command, std::string_view message) {
  const std::string printable = PrintableText(message);
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(command.size()), command.data(),
               printable.c_str());
  return kExitUsage;
}

}  // namespace switchyard::cli
