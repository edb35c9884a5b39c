# paratrain_module(NAME DIR <folder> [NO_TORCH] DEPS ...): a static library
# from every .cpp in <folder> (recursively), named paratrain_NAME.
# paratrain_test(NAME DIR <folder> DEPS ...): one GoogleTest executable per
# tests/ folder, each test registered with CTest.
# Include directories are the source root while building and <prefix>/include
# once installed (install/Install.cmake exports every module).

set(PARATRAIN_PCH_HEADER ${PARATRAIN_SOURCE_DIR}/paratrain/core/pch.h)

# One precompiled header, built once and reused by every torch target
# (REUSE_FROM needs identical flags, which all our targets share).
add_library(paratrain_pch STATIC ${PARATRAIN_SOURCE_DIR}/paratrain/core/pch.cpp)
# fmt/spdlog add -D flags (FMT_SHARED, ...) to every target that links core;
# GCC ignores a PCH built under different macros, so build it under the same.
target_link_libraries(paratrain_pch PUBLIC torch fmt::fmt spdlog::spdlog)
target_include_directories(paratrain_pch PUBLIC $<BUILD_INTERFACE:${PARATRAIN_SOURCE_DIR}>)
if(PARATRAIN_USE_PCH)
  target_precompile_headers(paratrain_pch PRIVATE ${PARATRAIN_PCH_HEADER})
endif()

function(paratrain_use_pch target)
  if(PARATRAIN_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM paratrain_pch)
  endif()
endfunction()

function(paratrain_module name)
  cmake_parse_arguments(M "NO_TORCH" "DIR" "DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PARATRAIN_SOURCE_DIR}/${M_DIR}/*.cpp)
  list(FILTER srcs EXCLUDE REGEX "/pch\\.cpp$")
  if(NOT srcs)
    # A folder with headers only (or not written yet): still a target.
    add_library(paratrain_${name} INTERFACE)
    target_include_directories(paratrain_${name} INTERFACE
      $<BUILD_INTERFACE:${PARATRAIN_SOURCE_DIR}> $<INSTALL_INTERFACE:include>)
    target_link_libraries(paratrain_${name} INTERFACE ${M_DEPS} Threads::Threads)
    target_compile_features(paratrain_${name} INTERFACE cxx_std_20)
    set_property(GLOBAL APPEND PROPERTY PARATRAIN_MODULES paratrain_${name})
    return()
  endif()
  add_library(paratrain_${name} STATIC ${srcs})
  target_include_directories(paratrain_${name} PUBLIC
    $<BUILD_INTERFACE:${PARATRAIN_SOURCE_DIR}> $<INSTALL_INTERFACE:include>)
  target_link_libraries(paratrain_${name} PUBLIC ${M_DEPS} Threads::Threads)
  # Our public headers use C++20; consumers of the installed package need it too.
  target_compile_features(paratrain_${name} PUBLIC cxx_std_20)
  set_property(GLOBAL APPEND PROPERTY PARATRAIN_MODULES paratrain_${name})
  # No POSITION_INDEPENDENT_CODE: -fPIC differs from the executables' default
  # (PIE), and GCC refuses a PCH built with other -fpic/-fpie settings.
  if(NOT M_NO_TORCH)
    target_link_libraries(paratrain_${name} PUBLIC torch)
    paratrain_use_pch(paratrain_${name})
  endif()
endfunction()

function(paratrain_test name)
  cmake_parse_arguments(T "" "DIR" "DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${PARATRAIN_SOURCE_DIR}/${T_DIR}/*.cpp)
  if(NOT srcs)
    return()
  endif()
  add_executable(test_${name} ${srcs})
  target_link_libraries(test_${name} PRIVATE ${T_DEPS} paratrain_test_support GTest::gtest)
  paratrain_use_pch(test_${name})
  # Each test gets its own process: multi-rank tests spawn threads/processes
  # and must not share global state with the next test.
  gtest_discover_tests(test_${name} DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endfunction()
