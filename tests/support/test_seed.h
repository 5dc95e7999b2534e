// Test-only, shared by every layer's tests. TestSeed(): the seed of a randomised test,
// $KVARENA_SEED when set (to replay a failure), else a fresh one; printed either way and
// recorded as the test's "seed" property, so a failing run says how to replay it.
#ifndef KVARENA_TESTS_SUPPORT_TEST_SEED_H_
#define KVARENA_TESTS_SUPPORT_TEST_SEED_H_

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace kvarena::testing {

inline uint32_t TestSeed() {
  const char* env = std::getenv("KVARENA_SEED");
  const uint32_t seed = env != nullptr && *env != '\0' ? uint32_t(std::strtoul(env, nullptr, 10))
                                                       : std::random_device{}();
  std::cout << "seed=" << seed << " (KVARENA_SEED=" << seed << " replays it)" << std::endl;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

}  // namespace kvarena::testing

#endif  // KVARENA_TESTS_SUPPORT_TEST_SEED_H_
