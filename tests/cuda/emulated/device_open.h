#pragma once
// For the emulated libraries (cuBLASLt, NCCL) loaded by the test executable: the emulated runtime
// keeps device memory closed to the host outside the device's work, and the executable exports
// the switch (cuda_runtime.h's sf_emu_device_open). Open while this lives.
#include <dlfcn.h>

struct DeviceOpen {
  using Switch = void (*)(int);
  Switch open = reinterpret_cast<Switch>(dlsym(RTLD_DEFAULT, "sf_emu_device_open"));
  DeviceOpen() {
    if (open) open(1);
  }
  ~DeviceOpen() {
    if (open) open(0);
  }
};
