// Python module of the cross-process ring handlers. Linked against MPI, so
// Python imports it only in a job of several processes (jaxring/collectives/mpi.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include "core/timeout.h"
#include "mpi/leg_plan.h"
#include "mpi/mpi_host_ring.h"
#include "mpi/mpi_ring.h"

namespace nb = nanobind;

NB_MODULE(_jaxring_mpi, m) {
  m.attr("TARGET_NAME") = jaxring::kMpiRingTargetName;
  // XLA platform -> the handler's capsule: "CUDA" only where a CUDA toolkit built it.
  m.def("registrations", []() {
    nb::dict handlers;
    handlers["cpu"] = nb::capsule(reinterpret_cast<void*>(jaxring::kMpiRingCpu));
#ifdef JAXRING_MPI_CUDA
    handlers["CUDA"] = nb::capsule(reinterpret_cast<void*>(jaxring::kMpiRingCuda));
#endif
    return handlers;
  });
  m.def("set_leg_comm", &jaxring::SetLegComm, nb::arg("comm_id"), nb::arg("device_ordinal"), nb::arg("handle"));
  // std::invalid_argument reaches Python as ValueError.
  m.def("register_leg", &jaxring::RegisterLegPlan, nb::arg("comm_id"), nb::arg("dtype"), nb::arg("reduction"),
        nb::arg("tag"), nb::arg("timeout_ms"), nb::arg("what"), nb::arg("algorithm"), nb::arg("piece_elements"),
        nb::arg("mode"));
  nb::dict algorithms;
  algorithms["ring"] = static_cast<int64_t>(jaxring::LegAlgorithm::kRing);
  algorithms["one-shot"] = static_cast<int64_t>(jaxring::LegAlgorithm::kOneShot);
  algorithms["recursive doubling"] = static_cast<int64_t>(jaxring::LegAlgorithm::kDoubling);
  m.attr("ALGORITHMS") = algorithms;
  m.def("leg_plan_count", &jaxring::LegPlanCount);
  // A registered plan as Python sees it (for tests and messages).
  m.def("leg_plan", [](int64_t id) {
    const jaxring::LegPlan* plan = jaxring::FindLegPlan(id);
    if (plan == nullptr) throw std::invalid_argument("no leg plan " + std::to_string(id));
    nb::dict out;
    out["comm_id"] = plan->comm_id;
    out["dtype"] = plan->type->name;
    out["reduction"] = static_cast<int64_t>(plan->reduction);
    out["tag"] = plan->tag;
    out["timeout_ms"] = plan->timeout_ms;
    out["what"] = plan->what;
    out["algorithm"] = static_cast<int64_t>(plan->algorithm);
    out["piece_elements"] = plan->piece_elements;
    out["mode"] = static_cast<int64_t>(plan->mode);
    return out;
  }, nb::arg("id"));
  m.attr("DEFAULT_LEG_PATIENCE_US") = jaxring::kDefaultLegPatienceUs;
  m.def("set_leg_patience_us", &jaxring::SetLegPatienceUs, nb::arg("us"));
  m.attr("DEFAULT_LEG_SPIN_US") = jaxring::kDefaultLegSpinUs;
  m.def("set_leg_spin_us", &jaxring::SetLegSpinUs, nb::arg("us"));
  m.def("leg_threads", []() {
    const jaxring::LegThreads counts = jaxring::CpuLegThreads();
    nb::dict threads;
    threads["finished_on_xla_thread"] = counts.finished_on_xla_thread;
    threads["handed_off"] = counts.handed_off;
    return threads;
  });
  m.def("set_default_timeout_s", &jaxring::SetDefaultTimeoutSeconds, nb::arg("seconds"));
}
