// accelkit: the backend's device guard (c10::impl::DeviceGuardImplInterface):
// devices, streams and events as PyTorch sees them.
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/compat.hpp>
#include <accelkit/torch/errors.hpp>

#include <c10/core/impl/DeviceGuardImplInterface.h>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct GuardImpl final
    : compat::StreamCapturingGuard<c10::impl::DeviceGuardImplInterface, GuardImpl> {
  static c10::Device dev(device_index d) { return c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(d)); }
  // A device without an index (torch.Stream(device="simdev")) is the current one.
  static device_index index(c10::Device d) {
    return d.has_index() ? d.index() : backend().current_device();
  }

  c10::DeviceType type() const override { return kDeviceType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    return translated([&] { return dev(backend().exchange_device(d.index())); });
  }
  c10::Device getDevice() const override {
    return translated([&] { return dev(backend().current_device()); });
  }

  // Both are called where an exception ends the process (the autograd
  // engine's device threads; guard destructors): Note [Deferred device
  // switch].
  void setDevice(c10::Device d) const override {
    translated([&] { backend().set_device_deferred(d.index()); });
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    reporting_failures([&] { backend().set_device_deferred(d.index()); });
  }
  c10::Stream getStream(c10::Device d) const override {
    return translated([&] { return to_c10(backend().current_stream(index(d))); });
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return translated([&] { return to_c10(backend().default_stream(index(d))); });
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return translated([&] {
      device_index i = index(d);
      int priority = high_priority ? backend().priority_range(i).first : 0;
      return to_c10(backend().pool_stream(i, priority));
    });
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return translated([&] { return to_c10(backend().pool_stream(index(d), priority)); });
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return translated([&] { return to_c10(backend().exchange_stream(from_c10(s))); });
  }
  void* getStreamNativeHandle(const c10::Stream s) const override {
    return translated([&] {
      return reinterpret_cast<void*>(backend().handle(from_c10(s)).value);
    });
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    backend().event_delete(event);
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex device,
              const c10::EventFlag flag) const override {
    translated([&] {
      TORCH_CHECK(device == -1 || device == s.device_index(), backend_name(),
                  ": event of device ", static_cast<int>(device), " recorded on a stream of device ",
                  static_cast<int>(s.device_index()));
      if (!*event)
        *event = backend().event_create(flag == c10::EventFlag::BACKEND_DEFAULT
                                            ? EventFlags::timing
                                            : EventFlags::none);
      backend().event_record(*event, from_c10(s));
    });
  }
  void block(void* event, const c10::Stream& s) const override {
    if (!event) return;
    translated([&] { backend().event_block(event, from_c10(s)); });
  }
  bool queryEvent(void* event) const override {
    if (!event) return true;
    return translated([&] { return backend().event_query(event); });
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(backend().device_count());
  }
  bool queryStream(const c10::Stream& s) const override {
    return translated([&] { return backend().stream_query(from_c10(s)); });
  }
  // Whether the stream is capturing a graph (Note [Capture rules]): the
  // guard's isStreamCapturing where PyTorch has it (Note [PyTorch versions]).
  bool stream_capturing(const c10::Stream& s) const {
    return translated([&] {
      Stream st = from_c10(s);
      return backend().stream_is_capturing(st.device, backend().handle(st));
    });
  }
  void synchronizeStream(const c10::Stream& s) const override {
    translated([&] { backend().synchronize(from_c10(s)); });
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    translated([&] { backend().event_synchronize(event); });
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    translated([&] { backend().device_synchronize(d); });
  }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override {
    if (!p.get()) return;
    translated([&] {
      backend().device_record_stream(p.device().index(), p.get(),
                                         backend().handle(from_c10(s)));
    });
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK_VALUE(start && end, backend_name(), ": elapsed_time needs both events recorded first");
    return translated(
        [&] { return static_cast<double>(backend().event_elapsed_time(start, end)); });
  }
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    return translated([&] {
      c10::DeviceCapability cap;
      cap.capability_data.capability_bits = 0;
      const DeviceProperties& p = backend().properties(d.index());
      auto set = [&](c10::ScalarType t, DType ours) {
        if (p.dtypes.contains(ours)) cap.capability_data.capability_bits |= (1ULL << static_cast<int>(t));
      };
      set(c10::ScalarType::Double, DType::float64);
      set(c10::ScalarType::Float, DType::float32);
      set(c10::ScalarType::Half, DType::float16);
      set(c10::ScalarType::BFloat16, DType::bfloat16);
      set(c10::ScalarType::Float8_e4m3fn, DType::float8_e4m3fn);
      set(c10::ScalarType::Float8_e5m2, DType::float8_e5m2);
      set(c10::ScalarType::Float8_e4m3fnuz, DType::float8_e4m3fnuz);
      set(c10::ScalarType::Float8_e5m2fnuz, DType::float8_e5m2fnuz);
      set(c10::ScalarType::Float8_e8m0fnu, DType::float8_e8m0fnu);
      set(c10::ScalarType::ComplexHalf, DType::complex32);
      set(c10::ScalarType::ComplexFloat, DType::complex64);
      set(c10::ScalarType::ComplexDouble, DType::complex128);
      set(c10::ScalarType::Char, DType::int8);
      set(c10::ScalarType::Short, DType::int16);
      set(c10::ScalarType::Int, DType::int32);
      set(c10::ScalarType::Long, DType::int64);
      set(c10::ScalarType::Byte, DType::uint8);
      set(c10::ScalarType::UInt16, DType::uint16);
      set(c10::ScalarType::UInt32, DType::uint32);
      set(c10::ScalarType::UInt64, DType::uint64);
      set(c10::ScalarType::Bool, DType::bool_);
      return cap;
    });
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
