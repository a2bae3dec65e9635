// safetensors files against the format's own rules, spelled out byte for byte: the header lists
// the metadata, then the tensors in data order (the safetensors library orders data by dtype,
// wider-ranked first, then by name) with keys dtype, shape, data_offsets, padded with spaces to 8
// bytes; tensors may be handed to the writer in any order; ranges read back as f32 from their
// bytes alone.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/cpu/kernels.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace zeroth {
namespace {

std::string temp_path(const std::string& name) {
  return fmt::format("{}/zeroth_safetensors_{}_{}.safetensors", ::testing::TempDir(), name, ::getpid());
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(SafeTensors, LaidOutAsTheLibraryDoesWhateverTheWriteOrder) {
  const std::string path = temp_path("layout");
  const float b[2] = {1.0f, -2.0f}, c[1] = {0.5f};
  std::vector<char> a(6);
  const float a32[3] = {1.0f, 2.0f, 3.0f};
  cpu::cast(a32, DType::f32, a.data(), DType::bf16, 3);
  {
    SafeTensorsWriter w(path, {{"b", "F32", {2}}, {"a", "BF16", {3}}, {"c", "F32", {1, 1}}}, {{"format", "pt"}});
    w.write("a", a.data(), a.size());
    EXPECT_THROW(w.write("a", a.data(), a.size()), InvalidArgument);  // once
    EXPECT_THROW(w.write("d", c, 4), InvalidArgument);                // not declared
    EXPECT_THROW(w.write("c", c, 8), InvalidArgument);                // not its size
    w.write("c", c, 4);
    EXPECT_FALSE(w.done());
    w.write("b", b, 8);
    w.finish();
  }
  // F32 ranks above BF16 in the library's Dtype order: b and c first, then a.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]},"a":{"dtype":"BF16","shape":[3],"data_offsets":[12,18]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string want(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(want.data(), &len, 8);
  want += header;
  want.append(reinterpret_cast<const char*>(b), 8);
  want.append(reinterpret_cast<const char*>(c), 4);
  want.append(a.data(), a.size());
  EXPECT_EQ(bytes_of(path), want);

  const SafeTensors file = read_safetensors(path, false);
  float got[3] = {0, 0, 0};
  read_tensor_f32(file, "a", 1, 3, got);
  EXPECT_EQ(got[0], 2.0f);
  EXPECT_EQ(got[1], 3.0f);
  read_tensor_f32(file, "b", 1, 2, got);
  EXPECT_EQ(got[0], -2.0f);
  EXPECT_THROW(read_tensor_f32(file, "b", 1, 3, got), InvalidArgument);
  std::filesystem::remove(path);
}

TEST(SafeTensors, AnUnfinishedFileLeavesNothingBehind) {
  const std::string path = temp_path("unfinished");
  {
    SafeTensorsWriter w(path, {{"x", "F32", {1}}, {"y", "F32", {1}}});
    const float v = 1.0f;
    w.write("y", &v, 4);
    try {
      w.finish();
      ADD_FAILURE() << "finished without tensor x";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("x not written"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace zeroth
