# Install rules and the CMake package: `cmake --install build --prefix P`,
# then find_package(fsdp CONFIG REQUIRED) with P on CMAKE_PREFIX_PATH gives
# fsdp::fsdp, as find_package(Torch) gives torch. Only the library is
# installed (its targets, its public headers, fsdpConfig.cmake); the package
# finds the LibTorch and the packages it was built with (docs/library.md).
include(CMakePackageConfigHelpers)

option(FSDP_INSTALL "Generate install rules for the fsdp library" ${FSDP_TOP_LEVEL})
if(NOT FSDP_INSTALL)
  return()
endif()
set(FSDP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/fsdp" CACHE STRING
    "Where fsdpConfig.cmake is installed, relative to the prefix")

set_target_properties(fsdp_openmp PROPERTIES EXPORT_NAME openmp)
install(TARGETS fsdp fsdp_base fsdp_openmp EXPORT fsdpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The library's headers: they include only each other (and LibTorch's).
install(DIRECTORY include/fsdp/common include/fsdp/distributed include/fsdp/core include/fsdp/optim include/fsdp/checkpoint
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdp)
install(FILES include/fsdp/io/atomic_file.h include/fsdp/io/safetensors.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdp/io)
install(FILES include/fsdp/nn/activation_checkpoint.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fsdp/nn)
install(EXPORT fsdpTargets NAMESPACE fsdp:: DESTINATION ${FSDP_INSTALL_CMAKEDIR})

# What fsdpConfig.cmake must find before the targets: the packages whose
# targets the library's link interface names.
set(FSDP_PACKAGE_DEPENDENCIES "find_dependency(nlohmann_json)\nfind_dependency(ZLIB)\n")
if(NOT FSDP_OPENMP_RUNTIME MATCHES "LibTorch's")
  string(APPEND FSDP_PACKAGE_DEPENDENCIES "find_dependency(OpenMP)\n")
endif()
if(FSDP_GLOG)
  string(APPEND FSDP_PACKAGE_DEPENDENCIES "find_dependency(glog)\n")
endif()
configure_package_config_file(cmake/fsdpConfig.cmake.in "${CMAKE_CURRENT_BINARY_DIR}/fsdpConfig.cmake"
                              INSTALL_DESTINATION ${FSDP_INSTALL_CMAKEDIR})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/fsdpConfigVersion.cmake"
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/fsdpConfig.cmake" "${CMAKE_CURRENT_BINARY_DIR}/fsdpConfigVersion.cmake"
        DESTINATION ${FSDP_INSTALL_CMAKEDIR})
