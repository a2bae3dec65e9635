// Helpers shared by the test suites: which devices to run on, host<->device arrays.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/cuda_info.h"
#include "core/device.h"

namespace zeroth::testing {

#ifdef ZEROTH_TEST_DATA_DIR
// The checkout's tests/ folder (its reference/ files): $ZEROTH_TEST_DATA_DIR where set, as a
// bundle carried to another machine sets it (tools/gpu-check.sh), else the checkout's, compiled in.
inline std::string test_data_dir() {
  const char* given = std::getenv("ZEROTH_TEST_DATA_DIR");
  return given != nullptr && *given != '\0' ? std::string(given) : std::string(ZEROTH_TEST_DATA_DIR);
}
#endif

// Every device kind the suite runs its table tests on; GPU cases skip (saying why) without one.
inline std::vector<std::string> device_specs() { return {"cpu", "cuda"}; }

inline bool device_available(const std::string& spec) { return spec == "cpu" || cuda_device_count() > 0; }

#define ZEROTH_SKIP_WITHOUT(spec)                                                                   \
  do {                                                                                              \
    if (!::zeroth::testing::device_available(spec))                                                 \
      GTEST_SKIP() << "device '" << (spec) << "' not available: " << ::zeroth::cuda_info().problem; \
  } while (0)

// A test run once per device spec (see device_specs), with the device made in SetUp.
class DeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ZEROTH_SKIP_WITHOUT(GetParam());
    device_ = make_device(GetParam());
  }
  std::unique_ptr<Device> device_;
};

// `numel` elements of `dtype` on a device, uploaded from and downloaded to host bytes.
struct DeviceArray {
  Device& device;
  Buffer buffer;
  size_t bytes;
  DType dtype;
  size_t numel;

  DeviceArray(Device& d, const std::vector<uint8_t>& host, DType type, size_t count)
      : device(d), buffer(d.allocate(std::max<size_t>(host.size(), 1), MemTag::other)), bytes(host.size()), dtype(type), numel(count) {
    device.copy(device.default_stream(), buffer.data(), host.data(), bytes);
    device.default_stream().synchronize();
  }
  TensorView view() const { return {buffer.data(), numel, dtype}; }
  std::vector<uint8_t> download() {
    std::vector<uint8_t> host(bytes);
    device.copy(device.default_stream(), host.data(), buffer.data(), bytes);
    device.default_stream().synchronize();
    return host;
  }
};

}  // namespace zeroth::testing
