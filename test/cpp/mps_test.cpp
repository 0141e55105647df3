// MPS clients' limits (mps.h) and what the cost model says a kernel holds of the GPU (KernelCost::demand).
#include "mps.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "cost_model.h"
#include "device.h"
#include "error.h"

namespace {

using emugpu::DType;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec h100ish() {
  emugpu::GpuSpec g;
  g.name = "test";
  g.sm_count = 132;
  g.major = 9;
  g.fp32_flops = 60e12;
  g.tf32_flops = 400e12;
  g.bf16_flops = 800e12;
  g.memory_bandwidth = 3e12;
  g.memory_bytes = 80ull << 30;
  g.pcie_generation = 5;
  g.pcie_width = 16;
  return g;
}

void expect_value_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << needle;
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MpsLimits, ActiveThreadPercentagesInRangeParse) {
  EXPECT_DOUBLE_EQ(emugpu::parse_active_thread_percentage("30", "P"), 30.0);
  EXPECT_DOUBLE_EQ(emugpu::parse_active_thread_percentage(" 12.5 ", "P"), 12.5);
  EXPECT_DOUBLE_EQ(emugpu::parse_active_thread_percentage("100", "P"), 100.0);
  for (const char* bad : {"0", "-5", "101", "", "thirty", "30%", "nan", "inf"}) {
    expect_value_error([&] { emugpu::parse_active_thread_percentage(bad, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); },
                       "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: expected a percentage");
  }
}

TEST(MpsLimits, PinnedMemoryLimitsParsePerDevice) {
  const auto limits = emugpu::parse_pinned_mem_limit("0=1G, 1=512M,3=2048MB", "L");
  ASSERT_EQ(limits.size(), 3u);
  EXPECT_EQ(limits.at(0), 1ull << 30);
  EXPECT_EQ(limits.at(1), 512ull << 20);
  EXPECT_EQ(limits.at(3), 2ull << 30);
  EXPECT_EQ(emugpu::parse_pinned_mem_limit("0=1.5g", "L").at(0), 3ull << 29);
  for (const char* bad : {"1G", "0=1", "0=", "x=1G", "0=-1G", "0=0G", "-1=1G", "0=1Q"}) {
    expect_value_error([&] { emugpu::parse_pinned_mem_limit(bad, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); },
                       "expected DEVICE=SIZE");
  }
  expect_value_error([] { emugpu::parse_pinned_mem_limit("0=1G,0=2G", "L"); }, "limited twice");
}

TEST(MpsLimits, AClientSpecKeepsItsShareOfTheSmsAndItsMemoryLimit) {
  const auto gpu = h100ish();
  const auto half = emugpu::mps_client_spec(gpu, 50, 0);
  EXPECT_EQ(half.sm_count, 66);
  EXPECT_DOUBLE_EQ(half.bf16_flops, gpu.bf16_flops / 2);
  EXPECT_DOUBLE_EQ(half.memory_bandwidth, gpu.memory_bandwidth);  // MPS does not split memory controllers
  EXPECT_EQ(half.memory_bytes, gpu.memory_bytes);
  EXPECT_EQ(half.parent_name, gpu.name);  // its GPU's calibration, not its profiles
  EXPECT_EQ(emugpu::mps_client_spec(gpu, 100, 0).parent_name, "");
  // Rounded up, at least one SM.
  EXPECT_EQ(emugpu::mps_client_spec(gpu, 30, 0).sm_count, 40);
  EXPECT_EQ(emugpu::mps_client_spec(gpu, 0.1, 0).sm_count, 1);
  EXPECT_EQ(emugpu::mps_client_spec(gpu, 100, 0).sm_count, 132);
  // What it may allocate is the limit.
  const auto capped = emugpu::mps_client_spec(gpu, 100, 4ull << 30);
  EXPECT_EQ(emugpu::usable_memory_bytes(capped), 4ull << 30);
  // A limit above the GPU's memory changes nothing.
  EXPECT_EQ(emugpu::mps_client_spec(gpu, 100, 1ull << 50).memory_bytes, gpu.memory_bytes);
  EXPECT_THROW(emugpu::mps_client_spec(gpu, 0, 0), emugpu::Error);
}

TEST(KernelDemand, BigGemmsHoldTheGpuSmallKernelsLittle) {
  const auto gpu = h100ish();  // the model keeps a reference
  const emugpu::CostModel m(gpu);
  OpCost big{2.0 * 8192 * 8192 * 8192, 3 * 8192.0 * 8192 * 2, DType::kBFloat16, OpFamily::kMm};
  big.gemm_count = 1;
  big.gemms[0] = {1, 8192, 8192, 8192};
  EXPECT_GT(m.kernel_cost(big).occupancy.demand, 0.9);
  EXPECT_LE(m.kernel_cost(big).occupancy.demand, 1.0);
  // A GEMM of a few tiles fills a few SMs, and mostly waits on its launch.
  OpCost few{2.0 * 256 * 256 * 256, 3 * 256.0 * 256 * 2, DType::kBFloat16, OpFamily::kMm};
  few.gemm_count = 1;
  few.gemms[0] = {1, 256, 256, 256};
  EXPECT_LT(m.kernel_cost(few).occupancy.demand, 0.05);
  // Elementwise: a grid that grows with the bytes.
  const OpCost large_add{1 << 26, 3.0 * (1 << 28), DType::kFloat32, OpFamily::kElementwise};
  const OpCost small_add{1 << 10, 3.0 * (1 << 12), DType::kFloat32, OpFamily::kElementwise};
  EXPECT_GT(m.kernel_cost(large_add).occupancy.demand, 0.9);
  EXPECT_LT(m.kernel_cost(small_add).occupancy.demand, 0.01);
  // A block of a big GEMM holds its SM far longer than an elementwise block.
  EXPECT_GT(m.kernel_cost(big).occupancy.hold_ns, 10 * m.kernel_cost(large_add).occupancy.hold_ns);
  EXPECT_DOUBLE_EQ(emugpu::byte_fill(1e12, 132), 1.0);
  EXPECT_DOUBLE_EQ(emugpu::byte_waves(132 * 2048 * 16 * 2.5, 132), 3.0);
  EXPECT_NEAR(emugpu::byte_fill(132 * 2048 * 16 / 4.0, 132), 0.25, 1e-12);
}

TEST(KernelDemand, PyTorchsBatchNormsHoldOnlyTheSmsTheirChannelsFill) {
  const auto gpu = h100ish();
  const emugpu::CostModel m(gpu);
  // PyTorch's own kernels (bfloat16) reduce a channel per block: eight
  // channels leave most SMs idle, and the time they take beyond their
  // bytes is those idle SMs.
  OpCost native{0, 1e9, DType::kBFloat16, OpFamily::kBatchNorm};
  native.channels = 8;
  const auto few = m.kernel_cost(native);
  EXPECT_LT(few.occupancy.demand, 0.3);
  native.channels = 1e6;
  const auto many = m.kernel_cost(native);
  EXPECT_GT(many.occupancy.demand, 0.9);
  // The SM time stays what the bytes take: the slower kernel holds fewer SMs.
  EXPECT_NEAR(few.occupancy.demand * static_cast<double>(few.duration),
              many.occupancy.demand * static_cast<double>(many.duration),
              0.05 * many.occupancy.demand * static_cast<double>(many.duration));
  native.backward = true;
  native.channels = 8;
  EXPECT_LT(m.kernel_cost(native).occupancy.demand, few.occupancy.demand);
  // cuDNN's (float32): its grids are not known, taken to fill the GPU.
  OpCost cudnn{0, 1e9, DType::kFloat32, OpFamily::kBatchNorm};
  cudnn.channels = 8;
  cudnn.cudnn = true;
  EXPECT_GT(m.kernel_cost(cudnn).occupancy.demand, 0.9);
}

}  // namespace
