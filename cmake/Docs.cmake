# The API reference: doxygen over the public headers, i.e. the ones the
# umbrella paratrain/paratrain.h includes plus the umbrella itself, with
# warnings as errors (docs/api/Doxyfile.in). `cmake --build build --target
# docs` writes build/docs/api/html/; the CTest
# Docs.ApiReferenceDocumentsEveryPublicName fails when a public name lacks
# documentation. Without doxygen (install-deps.sh installs it) both are absent.
find_program(PARATRAIN_DOXYGEN doxygen)
if(NOT PARATRAIN_DOXYGEN)
  message(STATUS "paratrain: doxygen not found, no API reference target")
  return()
endif()

set(_umbrella ${PARATRAIN_SOURCE_DIR}/paratrain/paratrain.h)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_umbrella})
file(STRINGS ${_umbrella} _includes REGEX "^#include \"paratrain/")
set(_inputs ${_umbrella} ${PARATRAIN_SOURCE_DIR}/docs/api/mainpage.md)
foreach(_line IN LISTS _includes)
  string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" _header "${_line}")
  list(APPEND _inputs ${PARATRAIN_SOURCE_DIR}/${_header})
endforeach()
# The comm-hook type lives beside the reducer; its header is public too.
list(APPEND _inputs ${PARATRAIN_SOURCE_DIR}/paratrain/data_parallel/ddp/reducer.h
                    ${PARATRAIN_SOURCE_DIR}/paratrain/data_parallel/ddp/compress_hook.h)
list(JOIN _inputs " " PARATRAIN_DOCS_INPUT)
set(PARATRAIN_DOCS_OUT ${CMAKE_BINARY_DIR}/docs/api)
configure_file(${PARATRAIN_SOURCE_DIR}/docs/api/Doxyfile.in ${CMAKE_BINARY_DIR}/docs/Doxyfile @ONLY)

add_custom_target(docs
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PARATRAIN_DOCS_OUT}
  COMMAND ${PARATRAIN_DOXYGEN} ${CMAKE_BINARY_DIR}/docs/Doxyfile
  WORKING_DIRECTORY ${PARATRAIN_SOURCE_DIR}
  COMMENT "API reference -> ${PARATRAIN_DOCS_OUT}/html/index.html"
  VERBATIM)
set(PARATRAIN_HAVE_DOXYGEN ON)
