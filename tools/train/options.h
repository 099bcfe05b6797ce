#pragma once
// ds_train's command line: one option table feeds the parser and --help (CLI11), bound to the
// library's train::Options.
#include <utility>
#include <vector>

#include "ds/train/options.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace ds::train {

// Adds every flag to app, bound to o; `given` receives (option, flag in g) pairs so that the caller
// can set g after parsing (CLI::Option::count()).
void add_options(CLI::App& app, Options& o, Given& g,
                 std::vector<std::pair<CLI::Option*, bool*>>& given);

}  // namespace ds::train
