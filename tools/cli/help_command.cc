// `zeroth help [--markdown]`: every command's help, from the options the commands register, so the
// reference (docs/cli.md) cannot drift from what the binary takes.
#include <algorithm>  // std::any_of
#include <cctype>     // std::toupper
#include <cstdio>     // std::fputs
#include <memory>     // std::make_shared
#include <string>     // std::string
#include <vector>     // std::vector

#include <CLI/CLI.hpp>   // CLI::App
#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_THROW
#include "tools/cli/commands.h"

namespace zeroth::tools {
namespace help_cmd {

// A table cell: pipes escaped, lines joined.
std::string cell(std::string text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

// How the option is written: its names and, unless it is a flag, what it takes.
std::string spelling(const CLI::Option& o) {
  std::string s = o.get_positional() ? o.get_name(true) : o.get_name(false, true);
  // A flag's name can carry its value when given ("--no-torch{false}"): not part of the spelling.
  for (size_t open; (open = s.find('{')) != std::string::npos;) s.erase(open, s.find('}', open) - open + 1);
  for (size_t at = 0; (at = s.find(',', at)) != std::string::npos; at += 2) s.replace(at, 1, ", ");
  if (o.get_positional()) {
    for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  if (o.get_expected_max() == 0) return s;  // a flag
  // CLI11 appends its checks to the type ("INT:INT in [1 - 1024]", "TEXT:{cuda,cpu}"): a choice of
  // values is kept, a range is in the description.
  std::string type = o.get_type_name().empty() ? "VALUE" : o.get_type_name();
  if (const size_t colon = type.find(':'); colon != std::string::npos)
    type = type[colon + 1] == '{' ? type.substr(colon + 1) : type.substr(0, colon);
  if (o.get_expected_min() == 0) type = "[" + type + "]";
  if (o.get_expected_max() > 1 || o.get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll) type += " ...";
  return s + " " + type;
}

void command(std::string& out, const CLI::App& app, const std::string& path) {
  // An option in no group is hidden from --help (internal to zeroth's own processes).
  const auto options = app.get_options([](const CLI::Option* o) { return o->get_name() != "--help" && !o->get_group().empty(); });
  const auto subcommands = app.get_subcommands([](const CLI::App*) { return true; });
  if (!path.empty()) {
    out += fmt::format("## {}\n\n{}\n\n", path, app.get_description());
    std::string usage = path;
    for (const auto* o : options)
      if (o->get_positional()) usage += " " + spelling(*o);
    if (!subcommands.empty()) usage += " COMMAND";
    if (std::any_of(options.begin(), options.end(), [](const CLI::Option* o) { return !o->get_positional(); })) usage += " [OPTIONS]";
    out += fmt::format("`{}`\n\n", usage);
    if (!options.empty()) {
      out += "| argument | what it takes |\n|---|---|\n";
      for (const auto* o : options) out += fmt::format("| `{}` | {} |\n", cell(spelling(*o)), cell(o->get_description()));
      out += "\n";
    }
  }
  for (const auto* sub : subcommands) command(out, *sub, path.empty() ? "zeroth " + sub->get_name() : path + " " + sub->get_name());
}

}  // namespace help_cmd

void add_help_command(CLI::App& app) {
  using namespace help_cmd;
  auto* cmd = app.add_subcommand("help",
                                 "A command's options (zeroth help bench offload); with --markdown, every command's, as docs/cli.md");
  struct Args {
    std::vector<std::string> command;
    bool markdown = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("command", args->command, "The command, with its subcommand where it has them (default: the list of commands)");
  cmd->add_flag("--markdown", args->markdown, "Print every command's options as Markdown (docs/cli.md is this output)");
  cmd->callback([&app, args] {
    if (!args->markdown) {
      // The formatter directly: App::help() would describe the command being run, `help` itself.
      const CLI::App* at = &app;
      std::string path = "zeroth";
      for (const auto& name : args->command) {
        const auto subs = at->get_subcommands([&](const CLI::App* s) { return s->get_name() == name; });
        if (subs.empty()) ZEROTH_THROW(InvalidArgument, "zeroth help: {} has no command '{}' (zeroth help lists them)", path, name);
        at = subs[0];
        path += " " + name;
      }
      std::fputs(at->get_formatter()->make_help(at, path, CLI::AppFormatMode::Normal).c_str(), stdout);
      return;
    }
    std::string out = fmt::format(
        "# zeroth's commands\n\nEvery command and its options, as `zeroth help --markdown` prints them from the commands' own "
        "help (`zeroth help CMD` or `zeroth CMD --help` shows one). A test fails when this file and the binary differ: "
        "regenerate it with `build/tools/zeroth help --markdown > docs/cli.md`.\n\n");
    std::string body;
    command(body, app, "");
    // `help` itself is the page, not one of its entries.
    const std::string self = "## zeroth help\n";
    if (const size_t at = body.find(self); at != std::string::npos) body.erase(at, body.find("## ", at + self.size()) - at);
    std::fputs((out + body).c_str(), stdout);
  });
}

}  // namespace zeroth::tools
