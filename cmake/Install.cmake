# `cmake --install build --prefix P`: public headers under P/include/paratrain,
# every module's static library, the exported targets with the umbrella
# paratrain::paratrain, paratrainConfig.cmake + version file, and the CLI in
# P/bin. Included last by the top-level CMakeLists, once every module exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The one target users link: every module (the linker keeps what is used).
get_property(_paratrain_modules GLOBAL PROPERTY PARATRAIN_MODULES)
add_library(paratrain_lib INTERFACE)
set_target_properties(paratrain_lib PROPERTIES EXPORT_NAME paratrain)
target_link_libraries(paratrain_lib INTERFACE ${_paratrain_modules})
add_library(paratrain::paratrain ALIAS paratrain_lib)  # same name under add_subdirectory

set(PARATRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/paratrain)
install(TARGETS paratrain_lib ${_paratrain_modules} EXPORT paratrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT paratrainTargets NAMESPACE paratrain:: DESTINATION ${PARATRAIN_CMAKE_DIR})
install(DIRECTORY ${PARATRAIN_SOURCE_DIR}/paratrain/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/paratrain
        FILES_MATCHING PATTERN "*.h")

configure_package_config_file(${PARATRAIN_SOURCE_DIR}/cmake/paratrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/paratrainConfig.cmake INSTALL_DESTINATION ${PARATRAIN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/paratrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/paratrainConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/paratrainConfigVersion.cmake
              ${PARATRAIN_SOURCE_DIR}/cmake/TorchFixups.cmake
        DESTINATION ${PARATRAIN_CMAKE_DIR})

install(TARGETS paratrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PARATRAIN_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/paratrain/configs)
