# Every dependency is a Debian package (scripts/install-deps.sh installs them).
# A CUDA build points Torch_DIR at a CUDA LibTorch 2.x, e.g. the one inside a
# PyTorch wheel: python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'.
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
if(PARATRAIN_VENDOR_DIR)
  include(${CMAKE_CURRENT_LIST_DIR}/Vendored.cmake)  # no apt: scripts/vendor-headers.sh
else()
  find_package(ZLIB REQUIRED)
  find_package(fmt REQUIRED)
  find_package(spdlog REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(tomlplusplus REQUIRED)
  find_package(nlohmann_json REQUIRED)
endif()

include(${CMAKE_CURRENT_LIST_DIR}/TorchFixups.cmake)  # c10d/Gloo defines, gloo headers

# Under add_subdirectory the parent's targets link ours, and Torch's imported
# targets name each other in generator expressions that are evaluated there:
# make every imported target of this directory visible to the whole build.
if(NOT PROJECT_IS_TOP_LEVEL)
  get_directory_property(_paratrain_imported IMPORTED_TARGETS)
  foreach(t IN LISTS _paratrain_imported)
    get_target_property(_paratrain_global ${t} IMPORTED_GLOBAL)
    if(NOT _paratrain_global)
      set_target_properties(${t} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
