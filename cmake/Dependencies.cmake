# Every dependency is a Debian package (scripts/install-deps.sh installs them).
# A CUDA build points Torch_DIR at a CUDA LibTorch 2.x, e.g. the one inside a
# PyTorch wheel: python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'.
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(nlohmann_json REQUIRED)

# Debian's LibTorch 1.13 is built with c10d and Gloo but its CMake config does
# not add the defines that switch those headers on; CUDA wheels do.
if(NOT TORCH_CXX_FLAGS MATCHES "USE_C10D_GLOO")
  set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS USE_DISTRIBUTED USE_C10D_GLOO)
endif()
# Debian's gloo headers live under /usr/include/gloo; wheels bundle no gloo
# headers, so a CUDA build needs libgloo-dev too.
find_path(GLOO_INCLUDE_DIR gloo/config.h)
if(GLOO_INCLUDE_DIR)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${GLOO_INCLUDE_DIR})
endif()
