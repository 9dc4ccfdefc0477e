# engine_host_add_plugin(): build an engine plugin and write its manifest.
#
#   engine_host_add_plugin(<target>
#     NAME <name> VERSION <semver> ENGINE <engine-id>
#     FORMATS <gguf|safetensors>... ARCHITECTURES <arch>... QUANT_KINDS <type>...
#     DEVICE <cpu|cuda> [MIN_COMPUTE_CAPABILITY <e.g. 80>] [PRIORITY <int>]
#     [OUTPUT_DIR <dir>] [NO_MANIFEST]
#     SOURCES <src>...)
#
# Produces <OUTPUT_DIR>/libeh-<name>.so and, after every link,
# <OUTPUT_DIR>/<name>.manifest.json carrying the library's sha256. The
# manifest's lists must agree with what the plugin's info() returns: the host
# rejects plugins whose manifest and self-description disagree.
#
# This file is installed with plugin-abi, so out-of-tree plugins use it too.

set(_EH_MANIFEST_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/eh_write_manifest.cmake)
# The manifest's ABI version is read from the header itself so it cannot drift.
# In the source tree the header is ../plugin-abi/include; installed, it is
# <prefix>/include, three or four levels above this file.
unset(_EH_ABI_HEADER)
foreach(_c ${CMAKE_CURRENT_LIST_DIR}/../plugin-abi/include
           ${CMAKE_CURRENT_LIST_DIR}/../../../include
           ${CMAKE_CURRENT_LIST_DIR}/../../../../include)
  if(NOT _EH_ABI_HEADER AND EXISTS ${_c}/engine_host/plugin_abi.h)
    get_filename_component(_EH_ABI_HEADER ${_c}/engine_host/plugin_abi.h ABSOLUTE)
  endif()
endforeach()
if(NOT _EH_ABI_HEADER)
  message(FATAL_ERROR "EngineHostPlugin.cmake: engine_host/plugin_abi.h not found")
endif()

function(engine_host_add_plugin target)
  cmake_parse_arguments(P "NO_MANIFEST"
    "NAME;VERSION;ENGINE;DEVICE;MIN_COMPUTE_CAPABILITY;PRIORITY;OUTPUT_DIR"
    "FORMATS;ARCHITECTURES;QUANT_KINDS;SOURCES" ${ARGN})
  foreach(req NAME VERSION ENGINE DEVICE FORMATS ARCHITECTURES QUANT_KINDS SOURCES)
    if(NOT P_${req})
      message(FATAL_ERROR "engine_host_add_plugin(${target}): ${req} is required")
    endif()
  endforeach()
  if(NOT P_MIN_COMPUTE_CAPABILITY)
    set(P_MIN_COMPUTE_CAPABILITY 0)
  endif()
  if(NOT P_PRIORITY)
    set(P_PRIORITY 0)
  endif()
  if(NOT P_OUTPUT_DIR)
    if(EH_PLUGIN_OUTPUT_DIR)
      set(P_OUTPUT_DIR ${EH_PLUGIN_OUTPUT_DIR})
    else()
      set(P_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins)
    endif()
  endif()

  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE engine_host::plugin_abi)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "eh-${P_NAME}"
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIR}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # Unresolved symbols fail at link time, not at dlopen on a user's machine.
  target_link_options(${target} PRIVATE "LINKER:-z,defs")

  if(NOT P_NO_MANIFEST)
    string(TOLOWER "${CMAKE_SYSTEM_NAME}-${CMAKE_SYSTEM_PROCESSOR}" platform)
    string(REPLACE ";" "," formats "${P_FORMATS}")
    string(REPLACE ";" "," archs "${P_ARCHITECTURES}")
    string(REPLACE ";" "," quants "${P_QUANT_KINDS}")
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND ${CMAKE_COMMAND}
        -DLIBRARY=$<TARGET_FILE:${target}> -DABI_HEADER=${_EH_ABI_HEADER}
        -DMANIFEST=${P_OUTPUT_DIR}/${P_NAME}.manifest.json
        -DNAME=${P_NAME} -DVERSION=${P_VERSION} -DENGINE=${P_ENGINE}
        -DPLATFORM=${platform} -DDEVICE=${P_DEVICE}
        -DMIN_CC=${P_MIN_COMPUTE_CAPABILITY} -DPRIORITY=${P_PRIORITY}
        -DFORMATS=${formats} -DARCHITECTURES=${archs} -DQUANT_KINDS=${quants}
        -P ${_EH_MANIFEST_SCRIPT}
      VERBATIM)
  endif()
endfunction()
