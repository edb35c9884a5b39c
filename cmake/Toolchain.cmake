# Build speed on a 2-core machine: ccache across clean clones (CI), a fast
# linker (libtorch is large and every test links it).
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  # sloppiness lets ccache hit on files compiled with a precompiled header.
  # Passed through the environment: Debian 12's ccache 4.7 does not accept
  # key=value settings on its command line (that came in 4.8).
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${CCACHE_PROGRAM})
endif()

foreach(linker mold lld)
  find_program(PARATRAIN_LINKER_${linker} ld.${linker})
  if(PARATRAIN_LINKER_${linker})
    add_link_options(-fuse-ld=${linker})
    break()
  endif()
endforeach()

add_compile_options(-Wall -Wextra -Wno-unused-parameter)
