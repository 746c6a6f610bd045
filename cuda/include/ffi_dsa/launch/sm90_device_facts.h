// What the sm90 decode launch needs to know about a device beyond launch/device_facts.h: how many
// select clusters of each size it holds at once. Found once per device, with the decode kernels'
// attributes, by cuda/csrc/sm_90a/decode.cu.
#pragma once

#include "ffi_dsa/launch/device_facts.h"
#include "ffi_dsa/sm90_schedule.h"

namespace ffi_dsa::sm90 {

struct DeviceFacts : ffi_dsa::DeviceFacts {
  // Select clusters of c CTAs the device holds at once, for c = 1..kMaxSelectCluster (0: none fits).
  ClusterOccupancy select_clusters{};
};

}  // namespace ffi_dsa::sm90
