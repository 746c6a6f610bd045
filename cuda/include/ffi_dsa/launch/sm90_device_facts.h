// What the sm90 decode launch needs to know about a device beyond launch/device_facts.h: how many
// select clusters of each size it holds at once, and how many keys a select CTA of two an SM
// stages. Found once per device, with the decode kernels' attributes, by cuda/csrc/sm_90a/decode.cu.
#pragma once

#include <cstdint>

#include "ffi_dsa/launch/device_facts.h"
#include "ffi_dsa/sm90_schedule.h"

namespace ffi_dsa::sm90 {

struct DeviceFacts : ffi_dsa::DeviceFacts {
  // Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (0: none fits).
  ClusterOccupancy select_clusters{};
  // [sorted]: the most keys a kPairedSelectThreads CTA stages (whole tiles) with two such CTAs an
  // SM; 0 where two do not fit (the schedule then keeps one CTA an SM).
  uint32_t paired_staged_limit[2] = {0, 0};
};

}  // namespace ffi_dsa::sm90
