# cmake --install: the binaries, libkvconnector.so with its public headers, a CMake package
# (find_package(kvd) -> kvd::connector) and a pkg-config file (kvconnector.pc).
# lib, not Debian's multiarch lib/x86_64-linux-gnu: kvconnector.pc finds its prefix as ../.. of itself.
set(CMAKE_INSTALL_LIBDIR lib CACHE PATH "Where libkvconnector.so is installed, under the prefix")
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(kvd kvctl kvbench PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS kvd kvctl kvbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kvconnector EXPORT kvdTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(KVD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvd)
install(EXPORT kvdTargets NAMESPACE kvd:: DESTINATION ${KVD_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvdConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvdConfig.cmake
                              INSTALL_DESTINATION ${KVD_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvdConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvdConfig.cmake ${PROJECT_BINARY_DIR}/kvdConfigVersion.cmake
        DESTINATION ${KVD_CMAKE_DIR})

configure_file(${PROJECT_SOURCE_DIR}/cmake/kvconnector.pc.in ${PROJECT_BINARY_DIR}/kvconnector.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvconnector.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
