// Every harness starts with the parsers' log off: their warnings would fill the fuzzer's output.
#include "core/log.h"  // log::set_level

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zeroth::log::set_level(zeroth::log::Level::off);
  return 0;
}
