#include "host_prices.h"

#include <gtest/gtest.h>

#include <string>

#include "error.h"
#include "profile_db.h"

namespace {

using emugpu::HostCost;
using emugpu::HostProfile;

TEST(HostPrices, WithoutMeasurementsTheH100HostsPricesApply) {
  const HostCost cost = emugpu::modelled_host_cost(HostProfile{}, 2.0, 1'000);
  EXPECT_EQ(cost.model, emugpu::HostModel::kModelled);
  EXPECT_EQ(cost.speed, 2.0);
  EXPECT_EQ(cost.read_ns, 1'000);
  EXPECT_EQ(cost.op_ns, emugpu::kModelledOpNs);
  EXPECT_EQ(cost.backward_op_ns, emugpu::kModelledBackwardOpNs);
  EXPECT_EQ(cost.list_tensor_ns, emugpu::kModelledListTensorNs);
}

TEST(HostPrices, TheDefaultListPriceIsTheH100HostsOptimizerFigure) {
  HostProfile h100;
  h100.module_op_us = 22.237;
  h100.autograd_op_us = 22.7012;
  h100.optimizer_param_us = 19.5201;  // benchmarks/data/h100/host_cost.json
  const HostCost cost = emugpu::modelled_host_cost(h100, 1.0, 0);
  EXPECT_EQ(cost.op_ns, 22'237);
  EXPECT_EQ(cost.backward_op_ns, 22'701);
  // (19.5201 * 100 / 8 - 22.237) / 99 us
  EXPECT_EQ(cost.list_tensor_ns, 2'240);
}

TEST(HostPrices, AnOptimizerCheaperThanItsOpsLeavesNothingPerTensor) {
  HostProfile fast;
  fast.module_op_us = 40;
  fast.optimizer_param_us = 1;  // 12.5 us per foreach op, below the op's own 40
  const HostCost cost = emugpu::modelled_host_cost(fast, 1.0, 0);
  EXPECT_EQ(cost.op_ns, 40'000);
  EXPECT_EQ(cost.backward_op_ns, emugpu::kModelledBackwardOpNs);  // not measured: the default
  EXPECT_EQ(cost.list_tensor_ns, 0);
}

TEST(HostPrices, AHostCostFileIsReadWithUnknownKeysPassedOver) {
  const HostProfile h = emugpu::parse_host_cost(
      R"({"python_op_us": 5.5, "view_op_us": 3.1, "module_op_us": 18, "autograd_op_us": null, "cpu": "x"})", "h.json");
  EXPECT_EQ(h.python_op_us, 5.5);
  EXPECT_EQ(h.module_op_us, 18.0);
  EXPECT_FALSE(h.autograd_op_us.has_value());
  EXPECT_EQ(h.cpu, "x");
}

TEST(HostPrices, ABadHostCostFileNamesTheFileAndTheField) {
  try {
    emugpu::parse_host_cost(R"({"module_op_us": -4})", "h.json");
    ADD_FAILURE() << "a negative figure accepted";
  } catch (const emugpu::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("host cost file h.json: field 'module_op_us'"), std::string::npos) << what;
    EXPECT_NE(what.find("got -4"), std::string::npos) << what;
  }
  EXPECT_THROW(emugpu::parse_host_cost("[1, 2]", "h.json"), emugpu::Error);
  EXPECT_THROW(emugpu::parse_host_cost("{not json", "h.json"), emugpu::Error);
  try {
    emugpu::load_host_cost_file("/nonexistent/host_cost.json");
    ADD_FAILURE() << "a missing file accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("torch_emugpu.measure.host_cost"), std::string::npos) << e.what();
  }
}

}  // namespace
