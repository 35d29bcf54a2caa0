// Trains a small model with the libtorch C++ API on simdev and on the CPU,
// and checks that both learn the same: the C++ side of "a backend PyTorch
// users can use". The registration line is all it takes.
#include <accelkit/torch/register.hpp>
#include <torch/torch.h>

#include "simdev_runtime.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <vector>

ACCELKIT_REGISTER_BACKEND(simdev::SimRuntime);

namespace {
std::vector<float> train(const torch::Device& device, int steps) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 16),
                              torch::nn::ReLU(), torch::nn::Linear(16, 1));
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({128, 8});
  torch::Tensor y = (x.sum(1, true) * 0.5).sin();  // a smooth target to regress
  x = x.to(device);
  y = y.to(device);
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    opt.zero_grad();
    torch::Tensor loss = (model->forward(x) - y).pow(2).mean();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<float>());
    if (step % 10 == 0) std::printf("  %s step %3d  loss %.6f\n", device.str().c_str(), step, losses.back());
  }
  return losses;
}
}  // namespace

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 40;
  int count = c10::impl::VirtualGuardImpl(c10::DeviceType::PrivateUse1).deviceCount();
  std::printf("simdev devices: %d\n", count);
  if (count == 0) {
    std::fprintf(stderr, "no simdev device to train on\n");
    return 1;
  }
  // The last device: not the default one, so that the device index is honoured.
  std::vector<float> sim = train(torch::Device(fmt::format("simdev:{}", count - 1)), steps);
  std::vector<float> cpu = train(torch::Device(torch::kCPU), steps);
  float worst = 0;
  for (std::size_t i = 0; i < sim.size(); ++i) worst = std::max(worst, std::fabs(sim[i] - cpu[i]));
  bool learned = sim.back() < sim.front();
  std::printf("final loss: simdev %.6f, cpu %.6f; largest difference %.3g; %s\n", sim.back(),
              cpu.back(), worst, learned ? "learned" : "did not learn");
  return worst <= 1e-5f && learned ? 0 : 1;
}
