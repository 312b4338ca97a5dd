// The subcommands of `switchyard`. Each takes its arguments after the subcommand name and
// returns the process exit status (args.h: 0 ok, 1 failure, 2 usage error). main.cc lists
// them in its command table.
#pragma once

#include <string>
#include <vector>

namespace switchyard::cli {

// switchyard mesh --world N [--tp N] [--cp N] [--ep N] [--etp N] [--pp N] [--order S]
// [--json]: prints every group of the dense and expert views of a layout.
int RunMesh(const std::vector<std::string>& args);

}  // namespace switchyard::cli
