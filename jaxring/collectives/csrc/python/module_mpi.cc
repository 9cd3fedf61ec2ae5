// Python module of the cross-process ring handlers. Linked against MPI, so
// Python imports it only in a job of several processes (jaxring/collectives/mpi.py).
#include <nanobind/nanobind.h>

#include "core/timeout.h"
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
  m.attr("DEFAULT_LEG_PATIENCE_US") = jaxring::kDefaultLegPatienceUs;
  m.def("set_leg_patience_us", &jaxring::SetLegPatienceUs, nb::arg("us"));
  m.attr("DOUBLING_ALGORITHM") = jaxring::kDoublingAlgorithm;
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
