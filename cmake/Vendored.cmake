# Dependencies from a vendored folder (scripts/vendor-headers.sh) instead of
# Debian packages: for machines without apt, such as a GPU machine that has a
# PyTorch wheel but no registry. Defines the same imported targets the Debian
# packages' CMake configs do, so the rest of the build does not know.
set(_v "${PARATRAIN_VENDOR_DIR}")
if(NOT EXISTS "${_v}/include/fmt/format.h")
  message(FATAL_ERROR "PARATRAIN_VENDOR_DIR=${_v} holds no include/fmt: run scripts/vendor-headers.sh on a Debian machine and copy third_party/vendor here")
endif()

# -I, ahead of LibTorch's -isystem folders: the CUDA wheel ships fmt 12 in its
# include folder, and spdlog 1.10 needs the fmt 9 that travels here.
include_directories(BEFORE "${_v}/include")

function(_paratrain_vendored_interface name)
  cmake_parse_arguments(V "" "" "DEFINES;LINKS" ${ARGN})
  if(NOT TARGET ${name})
    add_library(${name} INTERFACE IMPORTED GLOBAL)
    target_compile_definitions(${name} INTERFACE ${V_DEFINES})
    target_link_libraries(${name} INTERFACE ${V_LINKS})
  endif()
endfunction()

# Header-only fmt and spdlog: the wheel's LibTorch keeps its own fmt hidden.
_paratrain_vendored_interface(fmt::fmt DEFINES FMT_HEADER_ONLY=1)
_paratrain_vendored_interface(spdlog::spdlog DEFINES SPDLOG_HEADER_ONLY SPDLOG_FMT_EXTERNAL LINKS fmt::fmt)
_paratrain_vendored_interface(CLI11::CLI11)
_paratrain_vendored_interface(tomlplusplus::tomlplusplus)
_paratrain_vendored_interface(nlohmann_json::nlohmann_json)

# zlib: the header travels, the library is the system's libz.so.1.
find_library(_paratrain_libz NAMES z libz.so.1 REQUIRED)
set(ZLIB_INCLUDE_DIR "${_v}/zlib/include" CACHE PATH "" FORCE)
set(ZLIB_LIBRARY "${_paratrain_libz}" CACHE FILEPATH "" FORCE)
find_package(ZLIB REQUIRED)
set(GLOO_INCLUDE_DIR "${_v}/gloo/include" CACHE PATH "" FORCE)
