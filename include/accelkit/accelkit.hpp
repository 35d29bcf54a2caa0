// accelkit: the umbrella header of the torch-free SDK.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/device/host_maps.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/device/report.hpp>
#include <accelkit/device/visibility.hpp>
#include <accelkit/diagnostics.hpp>
#include <accelkit/error.hpp>
#include <accelkit/memory/caching_allocator.hpp>
#include <accelkit/memory/device_allocators.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/host_allocator.hpp>
#include <accelkit/memory/stats.hpp>
#include <accelkit/runtime.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/stream/streams.hpp>
#include <accelkit/types.hpp>
