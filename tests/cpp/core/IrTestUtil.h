// Helpers for the IR-text tests of tests/cpp/core: load a fixture document, check lines in order.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/importer/JsonImport.h"

namespace hb::test {

// tests/fixtures/ir/<name>, written by tests/fixtures/ir/make_fixtures.py.
inline std::shared_ptr<Graph> load_fixture(const std::string& name) {
  std::ifstream in(std::string(HB_SOURCE_DIR) + "/tests/fixtures/ir/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name << " (run tests/fixtures/ir/make_fixtures.py)";
  std::stringstream ss;
  ss << in.rdbuf();
  return import_json(ss.str());
}

// CHECK-style: each expected line must occur, in order, as part of a line of `text`.
inline void check_lines(const std::string& text, const std::vector<std::string>& expected) {
  std::istringstream in(text);
  std::string line;
  size_t k = 0;
  while (k < expected.size() && std::getline(in, line))
    if (line.find(expected[k]) != std::string::npos) ++k;
  EXPECT_EQ(k, expected.size()) << "CHECK not found (in order): '" << (k < expected.size() ? expected[k] : "")
                                << "'\n--- in ---\n" << text;
}

}  // namespace hb::test
