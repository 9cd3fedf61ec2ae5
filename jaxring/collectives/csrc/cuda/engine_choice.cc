#include "cuda/engine_choice.h"

#include <cstdlib>

#include "cuda/device_ring.h"
#include "cuda/staged_engine.h"

namespace jaxring {

namespace ffi = xla::ffi;

const std::string& EngineName() {
  static const std::string name = [] {
    const char* value = std::getenv("JAXRING_CUDA_ENGINE");
    return std::string(value == nullptr || *value == '\0' ? "host" : value);
  }();
  return name;
}

std::string EngineChoiceError() {
  const std::string& engine = EngineName();
  if (engine == "host" || engine == "device" || engine == "device-any-link") return "";
  return "jaxring: JAXRING_CUDA_ENGINE is '" + engine +
         "'; use 'host' (the host-staged engine, the default), 'device' (the "
         "device-synchronised engine where the ring's GPUs are NVLink-connected) or "
         "'device-any-link' (the device engine over PCIe too)";
}

std::string RunCudaCollective(const RingCall& call, const CudaRank& me,
                              const std::vector<int>& devices) {
  if (auto error = EngineChoiceError(); !error.empty()) return error;
  if (EngineName() == "host") return RunCudaRing(call, me);
  return RunDeviceRing(call, me, devices, DevicePath::kAuto);
}

}  // namespace jaxring
