include(CMakePackageConfigHelpers)

get_property(_targets GLOBAL PROPERTY IDEM_STORE_TARGETS)
install(TARGETS idem_core idem ${_targets} EXPORT idemTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The stores' headers are installed by store, only for the stores built
# (idem_define_store's PUBLIC_HEADER).
if(IDEM_TESTING_BUILT)
  install(DIRECTORY include/idem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          PATTERN stores EXCLUDE)
else()
  install(DIRECTORY include/idem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          PATTERN stores EXCLUDE PATTERN testing EXCLUDE)
endif()
get_property(_headers GLOBAL PROPERTY IDEM_STORE_PUBLIC_HEADERS)
install(FILES ${_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/idem/stores)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/generated/include/idem/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/idem)
install(EXPORT idemTargets NAMESPACE idem:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idem)
# The testing kit in an export set of its own, loaded by find_package(idem COMPONENTS
# testing) only, so that consumers of the library alone never need GoogleTest.
if(IDEM_TESTING_BUILT)
  install(TARGETS idem_testing EXPORT idemTestingTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT idemTestingTargets NAMESPACE idem::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idem)
endif()

# The package config looks for a store's dependency only when that store was built.
get_property(IDEM_STORE_PACKAGES GLOBAL PROPERTY IDEM_STORE_PACKAGES)
# pkg-config modules as PREFIX=module (hiredis has no CMake package on Debian 12).
get_property(IDEM_STORE_PKG_MODULES GLOBAL PROPERTY IDEM_STORE_PKG_MODULES)
configure_package_config_file(cmake/idemConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/idemConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idem)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/idemConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/idemConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/idemConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idem)

# pkg-config, for consumers without CMake. The libraries are static unless
# BUILD_SHARED_LIBS is on: then the stores' libraries must be linked by the consumer, so
# they go in Requires (plain `pkg-config --libs idem` links), not Requires.private.
if(BUILD_SHARED_LIBS)
  set(_pc_requires_field "Requires.private")
else()
  set(_pc_requires_field "Requires")
endif()
# Each store's modules and libraries, from its idem_define_store() call.
get_property(_pc_modules GLOBAL PROPERTY IDEM_STORE_PC_REQUIRES)
set(_pc_requires "")
foreach(_m IN LISTS _pc_modules)
  string(APPEND _pc_requires " ${_m}")
endforeach()
set(_pc_libs "-lidem")
foreach(t IN LISTS _targets)
  string(APPEND _pc_libs " -l${t}")
endforeach()
string(APPEND _pc_libs " -lidem_core")
get_property(_pc_store_libs GLOBAL PROPERTY IDEM_STORE_PC_LIBS)
foreach(_l IN LISTS _pc_store_libs)
  string(APPEND _pc_libs " ${_l}")
endforeach()
# Relative, so the installed tree can be moved.
file(RELATIVE_PATH _pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" _pc_up "${_pc_up}")
configure_file(cmake/idem.pc.in ${CMAKE_CURRENT_BINARY_DIR}/idem.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/idem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# pkg-config for the testing kit: idem-testing (Requires idem and gmock).
if(IDEM_TESTING_BUILT)
  configure_file(cmake/idem-testing.pc.in ${CMAKE_CURRENT_BINARY_DIR}/idem-testing.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/idem-testing.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
