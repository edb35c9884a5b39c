# What the `torch` target lacks on Debian's LibTorch 1.13 to compile c10d code.
# Included by Dependencies.cmake and, once installed, by paratrainConfig.cmake,
# so consumers of the package compile our headers exactly as we do.
#
# Debian's LibTorch 1.13 is built with c10d and Gloo but its CMake config does
# not add the defines that switch those headers on; CUDA wheels do.
if(TARGET torch AND NOT TORCH_CXX_FLAGS MATCHES "USE_C10D_GLOO")
  get_property(_paratrain_defs TARGET torch PROPERTY INTERFACE_COMPILE_DEFINITIONS)
  if(NOT "USE_C10D_GLOO" IN_LIST _paratrain_defs)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS USE_DISTRIBUTED USE_C10D_GLOO)
  endif()
endif()
# Debian's gloo headers live under /usr/include/gloo; wheels bundle no gloo
# headers, so a CUDA build needs libgloo-dev too.
find_path(GLOO_INCLUDE_DIR gloo/config.h)
if(TARGET torch AND GLOO_INCLUDE_DIR)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${GLOO_INCLUDE_DIR})
endif()
